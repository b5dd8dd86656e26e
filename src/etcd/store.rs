//! `EtcdLockStore`: the lock sweeper's `LockStore` over etcd. The watch
//! (`watch`) finds expiries as etcd carries them out; a sweep takes them in
//! batches, as it takes PostgreSQL's, and each batch keeps the same order:
//! claim (the durable record, in etcd), write the lines, then retire the
//! record (mark the claims reported, move this sidecar's resume point past
//! them). Owns the claims, the resume point and
//! the sidecar's liveness key. Not what a deletion means (`locks`), nor the
//! lines' format or the pass timing (`output`, `sweep`).
//!
//! Every sidecar sees every deletion. A claim is an etcd transaction that
//! creates `lease-sweeper/claims/<revision>/<create revision>` only if it
//! is absent, so exactly one sidecar wins each expiry. Once its line is
//! out, the winner marks the claim reported (`<name> reported`). A sidecar
//! that dies between the lines and the mark leaves the claim in its own
//! name: restarted, it reads the deletion again from its resume point and
//! writes it again (at least once, as a crash between a batch's lines and
//! its commit does in PostgreSQL). If it does not come back, another
//! sidecar that saw the claim waits until it is marked, or the winner's
//! resume point passes it, or the winner's liveness key is gone; in the
//! last case it takes the claim over in one transaction and writes the
//! line.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::StreamExt as _;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::error;

use crate::config::EtcdTarget;
use crate::etcd::locks::Verdict;
use crate::etcd::watch::{self, Feed, Found, SharedFeed};
use crate::etcd::{OWN_PREFIX, call, connect, failed, scopes};
use crate::model::{ExpiredLease, ReapedBy};
use crate::store::{LockStore, Probe, Reporter, StoreError, Work};

/// How long a claim stays in etcd: far longer than any sidecar may be away
/// and still come back to a deletion it claimed (its resume point must not
/// be older than this), and short enough that claims never pile up.
const CLAIM_TTL_SECS: i64 = 24 * 3600;

/// Claims share a lease for at most this long, so each claim lives between
/// `CLAIM_TTL_SECS` minus this and `CLAIM_TTL_SECS`.
const CLAIM_LEASE_ROTATION: Duration = Duration::from_secs(3600);

/// The liveness key's TTL: how long after a sidecar dies the others may
/// take over what it claimed and did not report.
const SESSION_TTL_SECS: i64 = 10;

/// When nothing was reported, the resume point is written at most this
/// often: a restart then reads again at most this much history, none of
/// which this sidecar claimed.
const RESUME_EVERY: Duration = Duration::from_secs(10);

/// Claims in flight at once.
const CLAIMS_IN_FLIGHT: usize = 64;

/// The longest `lockKey` a line carries, in bytes; a longer key is cut
/// here and marked with its full length, so one hostile key cannot make a
/// line of megabytes (etcd takes keys up to its request limit).
pub const MAX_KEY_BYTES: usize = 4096;

/// The lock sweep's store over etcd.
pub struct EtcdLockStore {
    target: EtcdTarget,
    /// This sidecar's name in claims, resume points and liveness keys.
    me: String,
    up: Option<Up>,
    /// Ends the watch and the liveness task when the store goes.
    _stop: DropGuard,
    stop: CancellationToken,
}

/// A connected store.
struct Up {
    client: Client,
    /// One watch's feed per key range followed (`scopes`).
    feeds: Vec<SharedFeed>,
    /// The lease new claims go on, and when it was granted.
    claims_lease: Option<(i64, Instant)>,
    /// Deletions another sidecar claimed and has not yet confirmed (its
    /// resume point has not passed them).
    open: VecDeque<Open>,
    /// The resume point last written, and when.
    saved: i64,
    saved_at: Instant,
}

#[derive(Debug, Clone)]
struct Open {
    found: Found,
    owner: String,
}

impl EtcdLockStore {
    /// A store for `target`, as the sidecar named `me` (unique per sidecar:
    /// its host name). Connects on the first pass.
    pub fn new(target: EtcdTarget, me: String) -> Self {
        let stop = CancellationToken::new();
        Self {
            target,
            me,
            up: None,
            _stop: stop.clone().drop_guard(),
            stop,
        }
    }

    /// Puts the target's name in front of a query's cause (a connection
    /// failure names it already).
    fn named(&self) -> impl FnOnce(StoreError) -> StoreError + use<> {
        let name = self.target.display();
        move |e| match e {
            StoreError::Query {
                work,
                query,
                cause,
                source,
            } => StoreError::Query {
                work,
                query,
                cause: format!("{name}: {cause}"),
                source,
            },
            other => other,
        }
    }

    async fn up(&mut self) -> Result<&mut Up, StoreError> {
        if self.up.is_none() {
            let mut client = connect(&self.target).await?;
            let key = resume_key(&self.me);
            let get = |mut c: Client| {
                let key = key.clone();
                async move { c.get(key, None).await }
            };
            // The first request: where an unreachable etcd, a refused
            // certificate or a wrong password shows.
            let got = call(&client, get)
                .await
                .map_err(|e| crate::etcd::unreachable(&self.target, &e))?;
            let now = got.header().map(|h| h.revision()).unwrap_or(0);
            let from = got
                .kvs()
                .first()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<i64>().ok())
                .filter(|r| *r <= now)
                .unwrap_or(now);
            let mut feeds = Vec::new();
            for scope in scopes(&mut client, &self.target).await? {
                let feed = Arc::new(Mutex::new(Feed {
                    through: from,
                    ..Feed::default()
                }));
                tokio::spawn(watch::follow(
                    client.clone(),
                    scope,
                    from,
                    feed.clone(),
                    self.stop.clone(),
                ));
                feeds.push(feed);
            }
            tokio::spawn(keep_alive(
                client.clone(),
                self.me.clone(),
                self.stop.clone(),
            ));
            self.up = Some(Up {
                client,
                feeds,
                claims_lease: None,
                open: VecDeque::new(),
                saved: from,
                saved_at: Instant::now(),
            });
        }
        Ok(self.up.as_mut().expect("connected above"))
    }
}

/// Every failure names the etcd it came from (`EtcdTarget::display`: the
/// endpoints and the user, never the password).
impl LockStore for EtcdLockStore {
    fn backend_id(&self) -> &'static str {
        "etcd"
    }

    async fn probe(&mut self) -> Result<Probe, StoreError> {
        let named = self.named();
        self.probe_at().await.map_err(named)
    }

    async fn reap_batch(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> Result<usize, StoreError> {
        let named = self.named();
        self.reap_batch_at(limit, report).await.map_err(named)
    }

    async fn drain_recorded(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> Result<usize, StoreError> {
        let named = self.named();
        self.drain_recorded_at(limit, report).await.map_err(named)
    }

    async fn held_count(&mut self) -> Result<i64, StoreError> {
        let named = self.named();
        self.held_count_at().await.map_err(named)
    }
}

impl EtcdLockStore {
    async fn probe_at(&mut self) -> Result<Probe, StoreError> {
        let me = self.me.clone();
        let up = self.up().await?;
        let (mut failure, mut expired, mut held) = (None, false, 0);
        for feed in &up.feeds {
            let f = feed.lock().unwrap();
            failure = failure.or_else(|| f.failure.clone());
            expired |= !f.found.is_empty();
            held += f.held;
        }
        if let Some(cause) = failure.filter(|_| !expired) {
            return Err(StoreError::Query {
                work: Work::LockLeases,
                query: "watch",
                cause,
                source: None,
            });
        }
        if !expired && up.saved_at.elapsed() >= RESUME_EVERY {
            up.save_resume_point(&me).await?;
        }
        // Taken only on the way to an answer, so what is logged here is
        // also counted by the sweeper.
        let mut missed = Vec::new();
        for feed in &up.feeds {
            missed.append(&mut feed.lock().unwrap().missed);
        }
        let mut missed_revisions = 0;
        for m in &missed {
            let n = (m.to - m.from + 1).max(0) as u64;
            missed_revisions += n;
            error!(
                fromRevision = m.from,
                toRevision = m.to,
                missedRevisions = n,
                "etcd_events_missed"
            );
        }
        Ok(Probe {
            expired,
            recorded: !up.open.is_empty(),
            held: (!expired).then_some(held as i64),
            missed: missed_revisions,
        })
    }

    async fn reap_batch_at(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> Result<usize, StoreError> {
        let me = self.me.clone();
        let up = self.up().await?;
        let mut taken: Vec<Found> = Vec::new();
        for feed in &up.feeds {
            let mut f = feed.lock().unwrap();
            let n = (limit - taken.len()).min(f.found.len());
            taken.extend(f.found.drain(..n));
        }
        let lease = up.claims_lease().await?;
        let keys: Vec<String> = taken.iter().map(claim_key).collect();
        let client = up.client.clone();
        let claims: Vec<Result<Claim, etcd_client::Error>> = futures_util::stream::iter(keys)
            .map(|key| claim(client.clone(), me.clone(), lease, key))
            .buffered(CLAIMS_IN_FLIGHT)
            .collect()
            .await;
        let mut mine = Vec::new();
        let mut won = Vec::new();
        let mut won_keys = Vec::new();
        let mut failure = None;
        for (found, claimed) in taken.iter().zip(claims) {
            match claimed {
                Ok(Claim::Mine) => {
                    mine.push(found.clone());
                    won.push(line(found));
                    won_keys.push(claim_key(found));
                }
                Ok(Claim::Theirs(owner)) => up.open.push_back(Open {
                    found: found.clone(),
                    owner,
                }),
                Ok(Claim::Reported) => {}
                Err(e) => {
                    failure.get_or_insert(e);
                    mine.push(found.clone());
                }
            }
        }
        let restore = |up: &mut Up, back: Vec<Found>| up.give_back(back);
        if let Some(e) = failure {
            // Nothing written: every deletion this sidecar holds or could
            // not claim goes back, to be claimed (or found its own) again.
            restore(up, mine);
            return Err(failed("claiming an expiry", &e));
        }
        if !won.is_empty() {
            if let Err(source) = report.lines(&won) {
                restore(up, mine);
                return Err(StoreError::Report {
                    work: Work::LockLeases,
                    source,
                });
            }
            report.committed();
            mark_reported(&up.client, &me, lease, &won_keys)
                .await
                .map_err(|e| failed("marking claims reported", &e))?;
            up.save_resume_point(&me).await?;
        }
        Ok(taken.len())
    }

    async fn drain_recorded_at(
        &mut self,
        limit: usize,
        report: &mut dyn Reporter<ExpiredLease>,
    ) -> Result<usize, StoreError> {
        let me = self.me.clone();
        let up = self.up().await?;
        let lease = up.claims_lease().await?;
        let mut taken_over = Vec::new();
        let mut still = VecDeque::new();
        // Claims their owners marked reported are settled; what is left
        // is decided by each owner's resume point and liveness.
        let keys: Vec<String> = up.open.iter().map(|o| claim_key(&o.found)).collect();
        let marked = reported(&up.client, &keys)
            .await
            .map_err(|e| failed("reading other sidecars' claims", &e))?;
        let before = up.open.len();
        let mut marked = marked.into_iter();
        up.open.retain(|_| !marked.next().unwrap_or(false));
        let mut confirmed = before - up.open.len();
        // One read per owner, however many of its claims wait.
        let mut owners: Vec<String> = up.open.iter().map(|o| o.owner.clone()).collect();
        owners.sort_unstable();
        owners.dedup();
        let mut states = std::collections::HashMap::new();
        for owner in owners {
            match owner_state(up.client.clone(), &owner).await {
                Ok(state) => states.insert(owner, state),
                Err(e) => return Err(failed("reading another sidecar's resume point", &e)),
            };
        }
        let batch: Vec<Open> = up.open.drain(..).collect();
        let mut failure = None;
        for open in batch {
            let (resume, alive) = states[&open.owner];
            let verdict = match settle(resume, alive, open.found.gone.revision) {
                Settled::TakenOver if taken_over.len() < limit && failure.is_none() => {
                    take_over(up.client.clone(), &me, lease, &open).await
                }
                Settled::TakenOver => Ok(Settled::Waiting),
                settled => Ok(settled),
            };
            match verdict {
                Ok(Settled::Confirmed) => confirmed += 1,
                Ok(Settled::Waiting) => still.push_back(open),
                Ok(Settled::TakenOver) => taken_over.push(open),
                Err(e) => {
                    failure.get_or_insert(e);
                    still.push_back(open);
                }
            }
        }
        if let Some(e) = failure {
            up.give_back(taken_over.into_iter().map(|o| o.found).collect());
            up.open.extend(still);
            return Err(failed("taking over another sidecar's claim", &e));
        }
        let lines: Vec<ExpiredLease> = taken_over.iter().map(|o| line(&o.found)).collect();
        if !lines.is_empty() {
            if let Err(source) = report.lines(&lines) {
                // Ours now: back to the deletions to claim, where the claim
                // comes back as this sidecar's own.
                up.give_back(taken_over.into_iter().map(|o| o.found).collect());
                up.open.extend(still);
                return Err(StoreError::Report {
                    work: Work::LockLeases,
                    source,
                });
            }
            report.committed();
            let keys: Vec<String> = taken_over.iter().map(|o| claim_key(&o.found)).collect();
            // Waiting claims go behind the rest, so the drain moves on.
            up.open.extend(still);
            mark_reported(&up.client, &me, lease, &keys)
                .await
                .map_err(|e| failed("marking claims reported", &e))?;
        } else {
            up.open.extend(still);
        }
        // The resume point may move past what was settled: at once, so the
        // peers waiting on it do not wait a round each.
        if !lines.is_empty() || confirmed > 0 {
            up.save_resume_point(&me).await?;
        }
        // Only what was reported counts toward the limit: a drain stops
        // once nothing more is settled in a call.
        Ok(lines.len())
    }

    async fn held_count_at(&mut self) -> Result<i64, StoreError> {
        let up = self.up().await?;
        Ok(up.feeds.iter().map(|f| f.lock().unwrap().held as i64).sum())
    }
}

impl Up {
    /// Deletions taken and not reported go back to be taken first.
    fn give_back(&self, back: Vec<Found>) {
        let mut f = self.feeds[0].lock().unwrap();
        for found in back.into_iter().rev() {
            f.found.push_front(found);
        }
    }

    /// The lease new claims go on: granted anew every
    /// `CLAIM_LEASE_ROTATION`.
    async fn claims_lease(&mut self) -> Result<i64, StoreError> {
        match self.claims_lease {
            Some((id, at)) if at.elapsed() < CLAIM_LEASE_ROTATION => Ok(id),
            _ => {
                let grant =
                    |mut c: Client| async move { c.lease_grant(CLAIM_TTL_SECS, None).await };
                let granted = call(&self.client, grant)
                    .await
                    .map_err(|e| failed("granting the claims' lease", &e))?;
                self.claims_lease = Some((granted.id(), Instant::now()));
                Ok(granted.id())
            }
        }
    }

    /// Writes the resume point: the revision before the oldest deletion
    /// not yet settled (to report, or claimed by another and unconfirmed),
    /// else everything the watch has read.
    async fn save_resume_point(&mut self, me: &str) -> Result<(), StoreError> {
        let mut point = i64::MAX;
        for feed in &self.feeds {
            let f = feed.lock().unwrap();
            let oldest = f.found.iter().map(|x| x.gone.revision - 1).min();
            point = point.min(oldest.unwrap_or(i64::MAX)).min(f.through);
        }
        if let Some(oldest) = self.open.iter().map(|o| o.found.gone.revision - 1).min() {
            point = point.min(oldest);
        }
        self.saved_at = Instant::now();
        if point == self.saved {
            return Ok(());
        }
        let key = resume_key(me);
        let put = |mut c: Client| {
            let key = key.clone();
            async move { c.put(key, point.to_string(), None).await }
        };
        call(&self.client, put)
            .await
            .map_err(|e| failed("writing the resume point", &e))?;
        self.saved = point;
        Ok(())
    }
}

enum Claim {
    /// This sidecar reports it: it won the claim now, or had won it before
    /// a restart and never marked it reported.
    Mine,
    /// Another sidecar holds the claim and has not marked it reported.
    Theirs(String),
    /// Marked reported (by this sidecar before a restart, or another).
    Reported,
}

/// What a claim's value ends with once its line is out: the owner's name,
/// then this.
const REPORTED: &str = " reported";

/// What a claim's value says: its owner, and whether it was reported.
fn read_claim(value: &str, me: &str) -> Claim {
    match value.strip_suffix(REPORTED) {
        Some(_) => Claim::Reported,
        None if value == me => Claim::Mine,
        None => Claim::Theirs(value.to_owned()),
    }
}

async fn claim(
    client: Client,
    me: String,
    lease: i64,
    key: String,
) -> Result<Claim, etcd_client::Error> {
    let txn = Txn::new()
        .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.clone(),
            me.as_str(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let answer = send_txn(&client, &txn).await?;
    if answer.succeeded() {
        return Ok(Claim::Mine);
    }
    let value = first_value(&answer.op_responses()).unwrap_or_default();
    Ok(read_claim(&value, &me))
}

/// Most operations in one transaction: etcd refuses more than 128 by
/// default (`--max-txn-ops`).
const TXN_OPS: usize = 100;

/// Marks claims reported, `TXN_OPS` to a transaction: a peer then never
/// takes them over, and a restart never writes them again.
async fn mark_reported(
    client: &Client,
    me: &str,
    lease: i64,
    keys: &[String],
) -> Result<(), etcd_client::Error> {
    let done = format!("{me}{REPORTED}");
    for chunk in keys.chunks(TXN_OPS) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|k| {
                TxnOp::put(
                    k.as_str(),
                    done.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        send_txn(client, &Txn::new().and_then(puts)).await?;
    }
    Ok(())
}

/// Whether each of `keys` is marked reported, `TXN_OPS` to a read.
async fn reported(client: &Client, keys: &[String]) -> Result<Vec<bool>, etcd_client::Error> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(TXN_OPS) {
        let gets: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
        let answers = send_txn(client, &Txn::new().and_then(gets)).await?;
        for answer in answers.op_responses() {
            let value = value_of(&answer).unwrap_or_default();
            out.push(value.ends_with(REPORTED));
        }
    }
    Ok(out)
}

enum Settled {
    /// The owner's resume point passed the deletion: it reported it.
    Confirmed,
    /// The owner is alive and has not got there yet.
    Waiting,
    /// The owner is gone without reporting it; the claim is this
    /// sidecar's now.
    TakenOver,
}

/// What becomes of another sidecar's claim on the deletion at `revision`,
/// by the owner's resume point and whether its liveness key is there.
fn settle(resume: Option<i64>, alive: bool, revision: i64) -> Settled {
    if resume.is_some_and(|r| r >= revision) {
        Settled::Confirmed
    } else if alive {
        Settled::Waiting
    } else {
        Settled::TakenOver
    }
}

/// A sidecar's resume point and whether it is alive, read at once.
async fn owner_state(
    client: Client,
    owner: &str,
) -> Result<(Option<i64>, bool), etcd_client::Error> {
    let read = Txn::new().and_then([
        TxnOp::get(resume_key(owner), None),
        TxnOp::get(alive_key(owner), None),
    ]);
    let answers = send_txn(&client, &read).await?.op_responses();
    let resume = answers
        .first()
        .and_then(value_of)
        .and_then(|v| v.parse::<i64>().ok());
    let alive = answers.get(1).is_some_and(|a| value_of(a).is_some());
    Ok((resume, alive))
}

/// Takes a dead sidecar's claim, if it is still that sidecar's and its
/// liveness key is still gone, in one transaction.
async fn take_over(
    client: Client,
    me: &str,
    lease: i64,
    open: &Open,
) -> Result<Settled, etcd_client::Error> {
    let key = claim_key(&open.found);
    let take = Txn::new()
        .when([
            Compare::value(key.clone(), CompareOp::Equal, open.owner.as_str()),
            Compare::version(alive_key(&open.owner), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(
            key,
            me,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    Ok(if send_txn(&client, &take).await?.succeeded() {
        Settled::TakenOver
    } else {
        Settled::Waiting
    })
}

/// `txn`, through `call`.
async fn send_txn(
    client: &Client,
    txn: &Txn,
) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
    let send = |mut c: Client| {
        let txn = txn.clone();
        async move { c.txn(txn).await }
    };
    call(client, send).await
}

/// The value of the first key a transaction's first `Get` found.
fn first_value(answers: &[TxnOpResponse]) -> Option<String> {
    answers.iter().find_map(value_of)
}

/// The value of the key one `Get` of a transaction found.
fn value_of(answer: &TxnOpResponse) -> Option<String> {
    match answer {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        _ => None,
    }
}

/// Keeps this sidecar's liveness key (`lease-sweeper/alive/<me>`) on a
/// lease of its own while the store lives; grants a new one whenever etcd
/// lost it.
async fn keep_alive(mut client: Client, me: String, stop: CancellationToken) {
    let period = Duration::from_secs((SESSION_TTL_SECS / 3) as u64);
    loop {
        let session = async {
            let lease = client.lease_grant(SESSION_TTL_SECS, None).await?.id();
            client
                .put(
                    alive_key(&me),
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                )
                .await?;
            let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
            loop {
                tokio::time::sleep(period).await;
                keeper.keep_alive().await?;
                match answers.message().await? {
                    Some(a) if a.ttl() > 0 => {}
                    _ => return Ok::<(), etcd_client::Error>(()),
                }
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = session => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn claim_key(found: &Found) -> String {
    format!(
        "{OWN_PREFIX}claims/{}/{}",
        found.gone.revision, found.gone.create_revision
    )
}

fn resume_key(me: &str) -> String {
    format!("{OWN_PREFIX}resume/{me}")
}

fn alive_key(me: &str) -> String {
    format!("{OWN_PREFIX}alive/{me}")
}

/// The `lease_expired` record of a deletion this sidecar reports.
fn line(found: &Found) -> ExpiredLease {
    let (expired_at_millis, overdue_millis, reaped_by) = match found.verdict {
        Verdict::Expired {
            deadline_ms,
            overdue_ms,
        } => (deadline_ms, overdue_ms, ReapedBy::Expiry),
        Verdict::Revoked { seen_ms } => (seen_ms, 0, ReapedBy::Revoke),
        // Never found: a release is dropped where it is classified.
        Verdict::Released => (0, 0, ReapedBy::Release),
    };
    ExpiredLease {
        lock_key: key_text(&found.gone.key),
        owner_id: format!("{:x}", found.gone.lease),
        token: found.gone.create_revision.to_string(),
        expired_at_millis,
        overdue_millis,
        reaped_by,
    }
}

/// A key as line text: UTF-8 as it is (the line's own escaping then
/// applies), any other byte as `\xNN`, and at most `MAX_KEY_BYTES` of it.
pub fn key_text(key: &[u8]) -> String {
    let cut = &key[..key.len().min(MAX_KEY_BYTES)];
    let mut out = String::with_capacity(cut.len());
    for chunk in cut.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if key.len() > MAX_KEY_BYTES {
        out.push_str(&format!("…({} bytes)", key.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_value_says_whose_it_is_and_whether_it_was_reported() {
        assert!(matches!(read_claim("side-1", "side-1"), Claim::Mine));
        assert!(matches!(read_claim("side-2", "side-1"), Claim::Theirs(o) if o == "side-2"));
        assert!(matches!(
            read_claim("side-1 reported", "side-1"),
            Claim::Reported
        ));
        assert!(matches!(
            read_claim("side-2 reported", "side-1"),
            Claim::Reported
        ));
    }

    #[test]
    fn another_sidecars_claim_is_confirmed_waited_on_or_taken_over() {
        assert!(matches!(settle(Some(10), false, 10), Settled::Confirmed));
        assert!(matches!(settle(Some(9), true, 10), Settled::Waiting));
        assert!(matches!(settle(None, true, 10), Settled::Waiting));
        assert!(matches!(settle(Some(9), false, 10), Settled::TakenOver));
        assert!(matches!(settle(None, false, 10), Settled::TakenOver));
    }

    #[test]
    fn a_key_is_text_with_its_other_bytes_escaped_and_its_length_bounded() {
        assert_eq!(key_text(b"locks/a/694d"), "locks/a/694d");
        assert_eq!(key_text(b"locks/\xff\x00/1"), "locks/\\xff\0/1");
        let long = vec![b'k'; MAX_KEY_BYTES + 10];
        let text = key_text(&long);
        assert!(text.starts_with(&"k".repeat(MAX_KEY_BYTES)));
        assert!(text.ends_with(&format!("…({} bytes)", MAX_KEY_BYTES + 10)));
    }
}
