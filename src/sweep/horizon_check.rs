//! The horizon check: a pass asks who holds the xmin horizon and how many
//! dead rows `lock_entry` and `job_queue` carry, names each holder that
//! keeps dead rows (WARN `xmin_horizon_held`, again every `HELD_REPEAT`),
//! says `xmin_horizon_released` when a hold ends, and sets the horizon
//! gauges. Owns the rule "held" and the lines' words; runs on its own loop,
//! taking turns with the job reaper on their connection (the lock sweeper's
//! is its own), so it never fails or delays a lock sweep. Not the
//! statements (`pg::horizon`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::output::events::EventLog;
use crate::output::metrics::Metrics;
use crate::pg::horizon::{DeadRows, Holder, HolderKind, Horizon, HorizonSource};
use crate::store::StoreError;
use crate::sweep::{FailedPasses, Service};

/// Pause between two checks. A held horizon is a matter of minutes (dead
/// rows pile up at the sweep rate, not faster), so every 10 s is prompt, and
/// costs two catalog reads where a sweep-rate check would cost ten.
pub const HORIZON_DELAY: Duration = Duration::from_secs(10);

/// How long a horizon must stand still before its holder is named. The lock server's
/// transactions and the sweeper's own last milliseconds; one 15 s old has
/// kept fifteen sweeps' dead rows. Longer than a standby's default feedback
/// interval (`wal_receiver_status_interval`, 10 s), so a healthy standby
/// whose xmin moves with every reply is never named.
pub const HOLD_AFTER: Duration = Duration::from_secs(15);

/// While a hold lasts, its WARN line is repeated this often.
pub const HELD_REPEAT: Duration = Duration::from_secs(60);

/// The WARN line naming a holder.
pub const XMIN_HORIZON_HELD: &str = "xmin_horizon_held";
/// The INFO line saying a named hold ended.
pub const XMIN_HORIZON_RELEASED: &str = "xmin_horizon_released";

/// The `table` tag values of `pg.dead_rows.current`.
const LOCK_ENTRY: &str = "lock_entry";
const JOB_QUEUE: &str = "job_queue";

/// What one check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckOutcome {
    /// Holders currently named as holding dead rows.
    pub held: usize,
    /// Lines written by this pass (held and released).
    pub lines: usize,
    pub dead: DeadRows,
}

/// One holder, as told apart across checks: a session or walsender by its
/// pid, a slot by its name, a prepared transaction by its gid.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HolderId {
    kind: HolderKind,
    pid: Option<i32>,
    name: Option<String>,
}

impl HolderId {
    fn of(h: &Holder) -> Self {
        // A slot's active pid comes and goes with its walsender: not part of it.
        let pid = match h.kind {
            HolderKind::Session | HolderKind::Standby => h.pid,
            HolderKind::ReplicationSlot | HolderKind::PreparedTransaction => None,
        };
        Self {
            kind: h.kind,
            pid,
            name: h.name.clone(),
        }
    }
}

/// What the check remembers of a holder between passes.
#[derive(Debug)]
struct Seen {
    /// The xid it held at, and when this check first saw it there: the age
    /// of a hold the server keeps no clock for (a slot, a standby, a session
    /// whose start this role may not see).
    xid: String,
    since: Instant,
    /// When its WARN line was last written, while it is named.
    warned: Option<Instant>,
    /// Its last line's fields, for the release line.
    held_seconds: u64,
}

/// The horizon-check service.
pub struct HorizonCheck<S: HorizonSource> {
    source: S,
    events: EventLog,
    metrics: Metrics,
    seen: HashMap<HolderId, Seen>,
    /// The partial view (no `pg_read_all_stats`) was said once.
    told_partial: bool,
}

impl<S: HorizonSource> HorizonCheck<S> {
    pub fn new(source: S, events: EventLog, metrics: Metrics) -> Self {
        Self {
            source,
            events,
            metrics,
            seen: HashMap::new(),
            told_partial: false,
        }
    }

    /// One check at the time `now`.
    pub async fn check_once(&mut self, now: Instant) -> Result<CheckOutcome, StoreError> {
        let horizon = self.source.read().await?;
        if !horizon.reads_all_stats && !self.told_partial {
            warn!(
                missing = "pg_read_all_stats",
                hidden = "other roles' sessions: transaction start, state, client address",
                seen = "every holder's pid, application_name and horizon, slots, prepared transactions",
                ageFrom = "first_seen for other roles' sessions",
                fix = "GRANT pg_read_all_stats TO lease_sweeper (docs/least-privilege.md)",
                "xmin_horizon_partial_view"
            );
            self.told_partial = true;
        }
        let step = self.observe(&horizon, now);
        self.metrics.horizon(
            step.oldest,
            &[
                (LOCK_ENTRY, horizon.dead.lock_entry.max(0) as u64),
                (JOB_QUEUE, horizon.dead.job_queue.max(0) as u64),
            ],
        );
        let lines = step.held.len() + step.released.len();
        // A check has nothing to roll back, and a stdout that refuses lines
        // fails the lock sweep too, which says so (`sweep_failed`); the
        // hold is named again after `HELD_REPEAT`.
        let _ = self.events.warn_lines(XMIN_HORIZON_HELD, step.held);
        let _ = self.events.info_lines(XMIN_HORIZON_RELEASED, step.released);
        Ok(CheckOutcome {
            held: self.seen.values().filter(|s| s.warned.is_some()).count(),
            lines,
            dead: horizon.dead,
        })
    }

    /// Updates what is remembered from one answer; returns the lines due.
    fn observe(&mut self, horizon: &Horizon, now: Instant) -> Step {
        let dead = horizon.dead;
        let mut step = Step::default();
        for h in &horizon.holders {
            let id = HolderId::of(h);
            let seen = self.seen.entry(id.clone()).or_insert_with(|| Seen {
                xid: h.horizon_xid.clone(),
                since: now,
                warned: None,
                held_seconds: 0,
            });
            if seen.xid != h.horizon_xid {
                // The horizon moved: a new hold, whatever came before.
                seen.xid = h.horizon_xid.clone();
                seen.since = now;
            }
            let observed = now.saturating_duration_since(seen.since);
            let (age, age_from) = match h.held_seconds {
                Some(secs) => (Duration::from_secs_f64(secs.max(0.0)), "server"),
                None => (observed, "first_seen"),
            };
            // Held is what the check saw hold still: a transaction's age
            // alone is not its horizon's (a READ COMMITTED one takes a new
            // snapshot per statement, and its horizon moves with it).
            let steady = age.min(observed);
            step.oldest = step.oldest.max(steady);
            let holds = steady >= HOLD_AFTER
                && h.xid_age > 0
                && (dead.lock_entry > 0 || dead.job_queue > 0);
            if holds {
                seen.held_seconds = age.as_secs();
                if seen
                    .warned
                    .is_none_or(|t| now.saturating_duration_since(t) >= HELD_REPEAT)
                {
                    step.held.push(held_fields(h, age, age_from, dead));
                    seen.warned = Some(now);
                }
            } else if seen.warned.take().is_some() {
                step.released
                    .push(released_fields(&id, seen.held_seconds, dead));
            }
        }
        // Gone since the last check: released if they were named.
        let gone: Vec<HolderId> = self
            .seen
            .keys()
            .filter(|id| !horizon.holders.iter().any(|h| HolderId::of(h) == **id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(seen) = self.seen.remove(&id)
                && seen.warned.is_some()
            {
                step.released
                    .push(released_fields(&id, seen.held_seconds, dead));
            }
        }
        step
    }
}

/// The lines one answer calls for, and the oldest horizon's age.
#[derive(Default)]
struct Step {
    held: Vec<Vec<(&'static str, String)>>,
    released: Vec<Vec<(&'static str, String)>>,
    oldest: Duration,
}

/// Said for what this role may not see of another role's session.
const HIDDEN: &str = "hidden";
/// A session with no client address: a Unix socket, or a server process
/// (a background worker) that has no client.
const LOCAL: &str = "local";

/// The fields of one `xmin_horizon_held` line, every one always present, in
/// a fixed order; `""` where the holder has no such thing (a slot's
/// application name, a session's gid).
fn held_fields(
    h: &Holder,
    age: Duration,
    age_from: &'static str,
    dead: DeadRows,
) -> Vec<(&'static str, String)> {
    let session = matches!(h.kind, HolderKind::Session | HolderKind::Standby);
    let hidden = |v: &Option<String>, none: &str| match (session && !h.visible, v) {
        (true, _) => HIDDEN.to_owned(),
        (false, Some(v)) => v.clone(),
        (false, None) => none.to_owned(),
    };
    let named = |kind: HolderKind| {
        if h.kind == kind {
            h.name.clone().unwrap_or_default()
        } else {
            String::new()
        }
    };
    vec![
        ("holder", h.kind.as_str().to_owned()),
        ("pid", h.pid.map(|p| p.to_string()).unwrap_or_default()),
        (
            "applicationName",
            h.application_name.clone().unwrap_or_default(),
        ),
        (
            "clientAddr",
            hidden(&h.client_addr, if session { LOCAL } else { "" }),
        ),
        ("state", hidden(&h.state, "")),
        ("backendType", hidden(&h.backend_type, "")),
        ("heldSeconds", age.as_secs().to_string()),
        ("ageFrom", age_from.to_owned()),
        ("xminAgeXids", h.xid_age.to_string()),
        ("slotName", named(HolderKind::ReplicationSlot)),
        ("gid", named(HolderKind::PreparedTransaction)),
        ("deadLockEntryRows", dead.lock_entry.to_string()),
        ("deadJobQueueRows", dead.job_queue.to_string()),
    ]
}

/// The fields of one `xmin_horizon_released` line: which holder, how long
/// it was last seen holding, and the dead rows now (vacuum can remove them).
fn released_fields(
    id: &HolderId,
    held_seconds: u64,
    dead: DeadRows,
) -> Vec<(&'static str, String)> {
    let named = |kind: HolderKind| {
        if id.kind == kind {
            id.name.clone().unwrap_or_default()
        } else {
            String::new()
        }
    };
    vec![
        ("holder", id.kind.as_str().to_owned()),
        ("pid", id.pid.map(|p| p.to_string()).unwrap_or_default()),
        ("slotName", named(HolderKind::ReplicationSlot)),
        ("gid", named(HolderKind::PreparedTransaction)),
        ("heldSeconds", held_seconds.to_string()),
        ("deadLockEntryRows", dead.lock_entry.to_string()),
        ("deadJobQueueRows", dead.job_queue.to_string()),
    ]
}

impl<S: HorizonSource> Service for HorizonCheck<S> {
    type Outcome = CheckOutcome;
    const SERVICE: &'static str = "horizon_check";
    const NAME: &'static str = "horizon_check";
    const WORK: &'static str = "horizon_check";
    const FAILED_PASSES: FailedPasses = FailedPasses::Checks;
    const DELAY: Duration = HORIZON_DELAY;

    fn log_started(&self) {
        info!(
            delayMillis = HORIZON_DELAY.as_millis() as u64,
            holdAfterMillis = HOLD_AFTER.as_millis() as u64,
            repeatMillis = HELD_REPEAT.as_millis() as u64,
            "horizon_check_started"
        );
    }

    fn log_done(outcome: &CheckOutcome) {
        tracing::debug!(
            held = outcome.held,
            lines = outcome.lines,
            deadLockEntryRows = outcome.dead.lock_entry,
            deadJobQueueRows = outcome.dead.job_queue,
            "horizon_check_done"
        );
    }

    async fn pass(&mut self, _cancel: &CancellationToken) -> Result<CheckOutcome, StoreError> {
        self.check_once(Instant::now()).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::output::events::MemoryLog;
    use crate::output::logfmt::decode_line;
    use crate::sweep::report::testing::discarded_metrics;

    /// Answers queued by the test, one per check.
    struct Stub(VecDeque<Horizon>);

    impl HorizonSource for Stub {
        async fn read(&mut self) -> Result<Horizon, StoreError> {
            Ok(self
                .0
                .pop_front()
                .expect("an answer queued for every check"))
        }
    }

    fn dead() -> DeadRows {
        DeadRows {
            lock_entry: 58_953,
            job_queue: 0,
        }
    }

    /// A background worker: no application name, no client address, a
    /// horizon the server gives no start time for.
    fn worker(xid: &str) -> Holder {
        Holder {
            kind: HolderKind::Session,
            pid: Some(4242),
            application_name: None,
            client_addr: None,
            state: None,
            backend_type: Some("background worker".into()),
            held_seconds: None,
            horizon_xid: xid.into(),
            xid_age: 120,
            name: None,
            visible: true,
        }
    }

    fn answer(holders: Vec<Holder>) -> Horizon {
        Horizon {
            dead: dead(),
            reads_all_stats: true,
            holders,
        }
    }

    fn check(answers: Vec<Horizon>) -> (HorizonCheck<Stub>, MemoryLog) {
        let (events, log) = EventLog::in_memory();
        (
            HorizonCheck::new(Stub(answers.into()), events, discarded_metrics()),
            log,
        )
    }

    fn decoded(log: &MemoryLog) -> Vec<HashMap<String, String>> {
        log.lines()
            .iter()
            .map(|l| decode_line(l).expect("logfmt").into_iter().collect())
            .collect()
    }

    #[tokio::test]
    async fn a_hold_is_named_once_per_repeat_and_its_end_once() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Seen at 0 s, held from 15 s, checked every 10 s; gone at 100 s.
        let mut answers: Vec<Horizon> = (0..10).map(|_| answer(vec![worker("731")])).collect();
        answers.push(answer(vec![]));
        let (mut c, log) = check(answers);
        for s in (0..=100).step_by(10) {
            c.check_once(at(s)).await.unwrap();
        }
        let lines = decoded(&log);
        let seq: Vec<(&str, &str, &str)> = lines
            .iter()
            .map(|f| {
                (
                    f["level"].as_str(),
                    f["message"].as_str(),
                    f["heldSeconds"].as_str(),
                )
            })
            .collect();
        // Named at 20 s (first time past HOLD_AFTER), again 60 s later, then
        // released with the age it was last seen holding.
        assert_eq!(
            seq,
            [
                ("warn", XMIN_HORIZON_HELD, "20"),
                ("warn", XMIN_HORIZON_HELD, "80"),
                ("info", XMIN_HORIZON_RELEASED, "90")
            ]
        );
    }

    #[tokio::test]
    async fn a_background_worker_without_name_or_address_prints_clearly() {
        let t0 = Instant::now();
        let (mut c, log) = check(vec![
            answer(vec![worker("731")]),
            answer(vec![worker("731")]),
        ]);
        c.check_once(t0).await.unwrap();
        c.check_once(t0 + HOLD_AFTER).await.unwrap();
        let lines = log.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let f: Vec<(String, String)> = decode_line(&lines[0]).unwrap();
        let rest: Vec<(&str, &str)> = f[3..]
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            rest,
            [
                ("holder", "session"),
                ("pid", "4242"),
                ("applicationName", ""),
                ("clientAddr", "local"),
                ("state", ""),
                ("backendType", "background worker"),
                ("heldSeconds", "15"),
                ("ageFrom", "first_seen"),
                ("xminAgeXids", "120"),
                ("slotName", ""),
                ("gid", ""),
                ("deadLockEntryRows", "58953"),
                ("deadJobQueueRows", "0"),
            ]
        );
        assert!(
            lines[0].contains(" applicationName=\"\" clientAddr=local state=\"\" "),
            "{}",
            lines[0]
        );
    }

    #[tokio::test]
    async fn a_moving_horizon_or_no_dead_rows_is_not_a_hold() {
        let t0 = Instant::now();
        // A READ COMMITTED transaction five minutes old: a new snapshot,
        // so a new horizon, at every check.
        let moving = |xid: &str| {
            let mut h = worker(xid);
            h.held_seconds = Some(300.0);
            h
        };
        // Then standing still for 20 s, but with no dead row to keep.
        let mut clean = answer(vec![worker("733")]);
        clean.dead = DeadRows::default();
        let (mut c, log) = check(vec![
            answer(vec![moving("731")]),
            answer(vec![moving("732")]),
            answer(vec![moving("733")]),
            clean,
        ]);
        for s in [0, 10, 20, 40] {
            c.check_once(t0 + Duration::from_secs(s)).await.unwrap();
        }
        assert_eq!(log.lines(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn another_roles_session_says_what_is_hidden() {
        let mut h = worker("731");
        h.visible = false;
        h.backend_type = None;
        h.application_name = Some("forgotten-report".into());
        let t0 = Instant::now();
        let (mut c, log) = check(vec![answer(vec![h.clone()]), answer(vec![h])]);
        c.check_once(t0).await.unwrap();
        c.check_once(t0 + HOLD_AFTER).await.unwrap();
        let f = &decoded(&log)[0];
        assert_eq!(
            (
                f["applicationName"].as_str(),
                f["clientAddr"].as_str(),
                f["state"].as_str(),
                f["backendType"].as_str()
            ),
            ("forgotten-report", HIDDEN, HIDDEN, HIDDEN)
        );
    }
}
