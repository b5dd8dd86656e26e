//! The watch: one task that follows every key the sidecar may read, from a
//! revision on, keeps the `LockTable`, learns each holder's lease deadline
//! before it can pass, and classifies each holder's deletion the moment it
//! arrives (a released lock's lease may be revoked a moment later by its
//! own client, so asking late would take a release for a revoke). Owns
//! reconnecting and compaction. Not the claims, the lines or the resume
//! point (`store`), nor what a change means (`locks`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, KeyValue, WatchOptions};
use futures_util::{FutureExt as _, StreamExt as _};
use tokio_util::sync::CancellationToken;

use crate::etcd::locks::{self, Gone, LockTable, Verdict};
use crate::etcd::{Scope, cause, now_millis};

/// How often the watch asks etcd about holders' leases that are due: a
/// quarter of a second keeps a deadline known before it passes for any
/// lease etcd grants (its shortest TTL is whole seconds).
const REFRESH_TICK: Duration = Duration::from_millis(250);

/// A holder's lease is asked again once its known deadline is this close:
/// more than `REFRESH_TICK` plus a round trip, so a live holder's deadline
/// is always learned anew before it passes.
const REFRESH_AHEAD_MS: i64 = 2_000;

/// At most this many lease questions in flight at once: a mass expiry is
/// classified in parallel without opening a stream per lease.
const LEASE_QUESTIONS: usize = 64;

/// Most watch responses applied before their deletions are classified:
/// enough that a mass expiry's one-revoke responses share their lease
/// questions, few enough that the first of them waits little for the last.
const BATCH_RESPONSES: usize = 1_000;

/// Keys read per page when loading the table: bounded memory per answer
/// whatever the keyspace holds.
const PAGE: i64 = 1_000;

/// After the watch fails, it is opened again after this pause.
const RETRY: Duration = Duration::from_secs(1);

/// A holder's deletion that is to be reported.
#[derive(Debug, Clone)]
pub struct Found {
    pub gone: Gone,
    pub verdict: Verdict,
}

/// Events the watch could not read because etcd compacted them first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    /// The first revision that could not be read.
    pub from: i64,
    /// The revision the watch went on from: the `to - from + 1` revisions
    /// between were not read (each a change to one or more keys of any
    /// kind, so more than one expiry where a lease carried several locks).
    pub to: i64,
}

/// What the watch hands the store, behind one lock.
#[derive(Debug, Default)]
pub struct Feed {
    /// Expiries and revokes, in revision order, not yet taken.
    pub found: VecDeque<Found>,
    /// Every holder deletion at or below this revision is in `found` or
    /// was not to be reported.
    pub through: i64,
    /// Locks held now.
    pub held: usize,
    /// Why the watch is not following etcd right now, if it is not.
    pub failure: Option<String>,
    /// Compactions that skipped events, not yet reported.
    pub missed: Vec<Missed>,
    /// Holder deletions classified as released (counted, never reported).
    pub released: u64,
}

pub type SharedFeed = Arc<Mutex<Feed>>;

/// Follows `scope` from revision `from` (the state as of `from`, then every
/// change after it) until `cancel` fires, feeding `feed`.
pub async fn follow(
    mut client: Client,
    scope: Scope,
    from: i64,
    feed: SharedFeed,
    cancel: CancellationToken,
) {
    let mut table = LockTable::default();
    // The state is loaded as of `at`; the watch goes on from `at + 1`.
    let mut at = from;
    let mut loaded = false;
    // Holders' deletions applied to the table and not yet classified (etcd
    // did not answer): kept across reconnects, since the table no longer
    // has them to find again.
    let mut unclassified = Vec::new();
    loop {
        let run = follow_once(
            &mut client,
            &scope,
            &mut table,
            &mut at,
            &mut loaded,
            &mut unclassified,
            &feed,
        );
        let err = tokio::select! {
            () = cancel.cancelled() => return,
            r = run => r,
        };
        if let Err(e) = err {
            feed.lock().unwrap().failure = Some(e);
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Loads the table if it is not, then follows changes until the stream
/// fails. `at` stays the last revision applied to `table`, so a new stream
/// goes on where this one stopped; `unclassified` holds the deletions
/// applied and not yet classified, each with when it was seen.
async fn follow_once(
    client: &mut Client,
    scope: &Scope,
    table: &mut LockTable,
    at: &mut i64,
    loaded: &mut bool,
    unclassified: &mut Vec<(Gone, i64)>,
    feed: &SharedFeed,
) -> Result<(), String> {
    if !*loaded {
        let want = *at;
        let (t, rev) = match load(client, scope, want).await {
            Ok(v) => v,
            Err(LoadError::Compacted) => {
                let (t, rev) = load(client, scope, 0).await.map_err(LoadError::text)?;
                feed.lock().unwrap().missed.push(Missed {
                    from: want + 1,
                    to: rev,
                });
                (t, rev)
            }
            Err(e) => return Err(e.text()),
        };
        *table = t;
        *at = rev;
        *loaded = true;
        let mut f = feed.lock().unwrap();
        f.held = table.held();
        f.through = f.through.max(rev);
    }
    let options = WatchOptions::new()
        .with_range(scope.end.clone())
        .with_start_revision(*at + 1)
        .with_prev_key()
        .with_progress_notify();
    let mut stream = client
        .watch(scope.key.clone(), Some(options))
        .await
        .map_err(|e| cause("opening the watch", &e))?;
    feed.lock().unwrap().failure = None;
    deliver(client, table, unclassified, *at, feed).await?;
    let mut tick = tokio::time::interval(REFRESH_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            m = stream.message() => m,
            _ = tick.tick() => {
                refresh(client, table).await;
                continue;
            }
        };
        // Whatever else has already arrived is applied too, so one round of
        // lease questions serves them all: etcd sends each revoke of a mass
        // expiry as a response of its own.
        let mut next = Some(message);
        let mut responses = 0;
        while let Some(message) = next.take() {
            let Some(response) = message.map_err(|e| cause("watching", &e))? else {
                return Err("etcd closed the watch stream".to_owned());
            };
            if response.compact_revision() > 0 {
                // Too far behind: etcd no longer has the events after `at`.
                // Start again from what etcd holds now, and say what was lost.
                let compacted = response.compact_revision();
                *loaded = false;
                let from = *at + 1;
                let (t, rev) = load(client, scope, 0).await.map_err(LoadError::text)?;
                *table = t;
                *at = rev;
                *loaded = true;
                let mut f = feed.lock().unwrap();
                f.missed.push(Missed {
                    from,
                    to: rev.max(compacted),
                });
                f.held = table.held();
                f.through = f.through.max(rev);
                return Ok(());
            }
            if response.canceled() {
                return Err(format!(
                    "etcd cancelled the watch: {}",
                    response.cancel_reason()
                ));
            }
            let seen_ms = now_millis();
            let mut last = response.header().map(|h| h.revision()).unwrap_or(*at);
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                last = last.max(kv.mod_revision());
                match event.event_type() {
                    EventType::Put => {
                        table.put(kv.key(), kv.value(), kv.lease(), kv.create_revision());
                    }
                    EventType::Delete => {
                        if let Some(prev) = event.prev_kv()
                            && let Some(g) = table.delete(
                                prev.key(),
                                prev.value(),
                                prev.lease(),
                                prev.create_revision(),
                                kv.mod_revision(),
                            )
                        {
                            unclassified.push((g, seen_ms));
                        }
                    }
                }
            }
            *at = (*at).max(last);
            responses += 1;
            if responses < BATCH_RESPONSES {
                next = stream.message().now_or_never();
            }
        }
        deliver(client, table, unclassified, *at, feed).await?;
        let fresh = table.take_fresh();
        learn(client, table, fresh).await;
    }
}

/// Classifies what waits in `unclassified` and hands the reportable to the
/// feed, with the revision up to which everything is delivered. On a
/// failure they stay, to be classified after the stream is opened again,
/// and the feed's `through` stops short of the oldest.
async fn deliver(
    client: &Client,
    table: &mut LockTable,
    unclassified: &mut Vec<(Gone, i64)>,
    at: i64,
    feed: &SharedFeed,
) -> Result<(), String> {
    let classified = classify(client, table, unclassified.clone()).await;
    let mut f = feed.lock().unwrap();
    f.held = table.held();
    match classified {
        Ok(found) => {
            unclassified.clear();
            f.released += found.released;
            f.found.extend(found.reportable);
            f.through = f.through.max(at);
            Ok(())
        }
        Err(e) => {
            let oldest = unclassified.iter().map(|(g, _)| g.revision).min();
            if let Some(oldest) = oldest {
                f.through = f.through.max(oldest - 1);
            }
            Err(e)
        }
    }
}

struct Classified {
    reportable: Vec<Found>,
    released: u64,
}

/// Asks etcd whether each gone holder's lease still lives, in parallel,
/// and classifies each deletion by that and its last known deadline.
async fn classify(
    client: &Client,
    table: &mut LockTable,
    gone: Vec<(Gone, i64)>,
) -> Result<Classified, String> {
    let leases: Vec<i64> = gone.iter().map(|(g, _)| g.lease).collect();
    let answers = ask(client, leases.clone()).await?;
    let mut out = Classified {
        reportable: Vec::new(),
        released: 0,
    };
    for ((g, seen_ms), (_, ttl)) in gone.into_iter().zip(answers) {
        let deadline = table.deadline(g.lease);
        // -1: gone. 0 is a live lease with under a second left (etcd
        // rounds down).
        match locks::classify(ttl >= 0, seen_ms, deadline) {
            Verdict::Released => out.released += 1,
            verdict => out.reportable.push(Found { gone: g, verdict }),
        }
    }
    for lease in leases {
        table.forget(lease);
    }
    Ok(out)
}

/// Learns the deadline of every holder's lease that is due.
async fn refresh(client: &Client, table: &mut LockTable) {
    let due = table.due(now_millis(), REFRESH_AHEAD_MS);
    learn(client, table, due).await;
}

/// Learns the deadlines of `leases`. A failure is left for the next tick
/// (`due` asks again for any deadline still unknown): the watch goes on.
async fn learn(client: &Client, table: &mut LockTable, leases: Vec<i64>) {
    if leases.is_empty() {
        return;
    }
    let asked = now_millis();
    if let Ok(answers) = ask(client, leases).await {
        for (lease, ttl) in answers {
            table.learned(lease, asked, ttl);
        }
    }
}

/// `TimeToLive` of each lease, in the order given: the seconds left, or -1
/// when etcd no longer has it (expired and revoked alike).
async fn ask(client: &Client, leases: Vec<i64>) -> Result<Vec<(i64, i64)>, String> {
    let results: Vec<Result<(i64, i64), String>> = futures_util::stream::iter(leases)
        .map(|lease| {
            let client = client.clone();
            async move {
                let ask = |mut c: Client| async move { c.lease_time_to_live(lease, None).await };
                crate::etcd::call(&client, ask)
                    .await
                    .map(|r| (lease, r.ttl()))
                    .map_err(|e| cause("asking a lease's time to live", &e))
            }
        })
        .buffered(LEASE_QUESTIONS)
        .collect()
        .await;
    results.into_iter().collect()
}

enum LoadError {
    /// The revision asked for is compacted.
    Compacted,
    Other(String),
}

impl LoadError {
    fn text(self) -> String {
        match self {
            LoadError::Compacted => "etcd compacted the revision being read".to_owned(),
            LoadError::Other(s) => s,
        }
    }
}

/// Every key in `scope` as of revision `at` (0: now), page by page, into a
/// new table; and the revision it is as of.
async fn load(client: &mut Client, scope: &Scope, at: i64) -> Result<(LockTable, i64), LoadError> {
    let mut table = LockTable::default();
    let mut start = scope.key.clone();
    let mut rev = at;
    loop {
        let mut options = GetOptions::new()
            .with_range(scope.end.clone())
            .with_limit(PAGE);
        if rev > 0 {
            options = options.with_revision(rev);
        }
        let get = |mut c: Client| {
            let (start, options) = (start.clone(), options.clone());
            async move { c.get(start, Some(options)).await }
        };
        let page = crate::etcd::call(client, get).await.map_err(|e| {
            let text = e.to_string();
            if text.contains("compacted") {
                LoadError::Compacted
            } else {
                LoadError::Other(cause("reading the keys", &e))
            }
        })?;
        if rev == 0 {
            rev = page.header().map(|h| h.revision()).unwrap_or(0);
        }
        let kvs: &[KeyValue] = page.kvs();
        for kv in kvs {
            table.put(kv.key(), kv.value(), kv.lease(), kv.create_revision());
        }
        match (page.more(), kvs.last()) {
            (true, Some(last)) => {
                start = last.key().to_vec();
                start.push(0);
            }
            _ => return Ok((table, rev)),
        }
    }
}
