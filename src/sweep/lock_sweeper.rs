//! The lock sweeper: one pass asks the store what there is to do, reaps
//! expired leases batch by batch in deadline order, each from where the last
//! left off, until a short batch, then drains recorded takeovers and late
//! releases the same way, and sets the held-lease gauge. Owns what a lease's
//! line, lateness and count are (`Reaped` for `ExpiredLease`). Not the
//! loop's timing or error logging (`sweep::run`), writing and sending a
//! batch (`sweep::report`), nor any SQL (the store).
//!
//! Everything a reader meets from the timer tick to the `lease_expired`
//! line, failure path and the `lock_batch_fallback` WARN included: every
//! type, trait, constant, SQL function and transaction, 46 in all (the
//! tables and the setting the SQL reads are named last, not counted):
//! - the loop (`sweep`, 7): `Service`, what a loop runs: a pass and the
//!   names its lines use; `SWEEP_DELAY`, the pause between passes;
//!   `DRAIN_GRACE`, how long a pass in flight may finish after a shutdown
//!   signal; `ErrorLog`, which logs a failed pass once and again every
//!   `ERROR_REPEAT`, its count named by `FailedPasses`; `Beat`, told after
//!   every pass, which the watchdog follows;
//! - the pass (5): `LockSweeper`, the service, which also counts and logs a
//!   batch that fell back; `Stage`, the two things a pass drains in order
//!   (expired leases, then recorded expiries); `Drain`, the rule that runs
//!   batches of `BATCH_SIZE` until a short one or a shutdown;
//!   `SweepOutcome`, the pass's counts;
//! - the seam (`store`, `model`, 7): `LockStore`, a pass's calls in their
//!   order; `Probe`, its first answer; `Reporter`, handed to each batch,
//!   through which its lines go and which hears of each commit;
//!   `StoreError`, every failure, naming its `Work`; `ExpiredLease`, one
//!   line's lease, and `ReapedBy`, how it left the table;
//! - the lines (`sweep::report`, `output`, 5): `LineReporter`, the one
//!   `Reporter`, which for any `Reaped` row writes through `EventLog`
//!   (stdout, no log level can silence it), gathers `Lateness` and sends it
//!   with the counts to `Metrics` at each commit;
//! - PostgreSQL (`pg`, 10): `PgLockStore` on its own `Db` (one connection,
//!   reopened after a failure, which `BatchFailure` names); `BatchRow`, a
//!   sweep batch as one row of arrays, taken apart into `LeaseRow`s, one
//!   lease as every lock statement returns it, and `Taken`, a statement's
//!   rows sorted into leases to report, leases set aside, the hand-off and
//!   the fallback's cause; `SWEEP_PROBE`, the first question, its argument
//!   `HELD_COUNT_MAX_AGE`, how old the shared held count may be;
//!   `BEGIN_GUARDED`, how every transaction opens (its timeouts);
//!   `PROBE_TIMEOUT`, the probe's bound;
//! - SQL functions (10): `lock_sweep_probe`, the first question;
//!   `lock_reap_batch`, the batch deleted and handed off (set-based,
//!   falling back on its own row-by-row pass, which it says);
//!   `lock_handoff_claim`, the sweep's own hand-off
//!   taken back; `lock_handoff_recover`, an abandoned one;
//!   `lock_drain_takeovers`, the outbox (falling back and saying so the
//!   same way); `lock_held_count_get`, the shared
//!   count; and the helpers they call: `lease_epoch_millis` (the one
//!   epoch-millisecond rule), `lease_overdue_millis`, `lock_held_counted`
//!   (whether a deleted lease was in the stored count),
//!   `signal_handoff_grace` (when a hand-off counts as abandoned);
//! - two transactions a batch: delete up to `BATCH_SIZE` leases in deadline
//!   order, skipping rows others hold, and record them in a hand-off,
//!   commit; then claim the hand-off, write the lines, commit
//!   (`conn::claim_then_report`, which the job reaper's batches share).
//!   Recovered hand-offs and recorded expiries are one transaction each:
//!   write, then commit.
//!
//! Not counted: connecting (`Db::conn`'s host walk, with `ConnectError`
//! and its hints) and the words a failure's cause is told in
//! (`conn::describe`, with `HOT_STANDBY`), both owned by `pg::conn`; the
//! `Service` impl's names for its lines; and what the SQL reads. The
//! tables:
//! `lock_entry` (the leases), `lock_reap_handoff`,
//! `lock_expiry_outbox`, `lock_held_count` and `lock_held_delta`; the
//! composite `lock_reaped_lease` (a row-by-row pass's rows); the setting
//! `lease_sweeper.reaping` (the sweep's deletions are not late releases).
//!
//! Nothing here waits because other sessions exist: the lock server is
//! protected by how a batch is taken (one short transaction, rows other
//! sessions hold skipped, committed before its lines are written), so the
//! signal is as early under load as alone.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::model::{ExpiredLease, ReapedBy};
use crate::output::events::EventLog;
use crate::output::metrics::{Lateness, Metrics};
use crate::store::{LockStore, StoreError};
use crate::sweep::report::{LineReporter, Reaped};
use crate::sweep::{Drain, FailedPasses, SWEEP_DELAY, Service};

/// Most leases one batch deletes. Its transaction holds their row locks
/// until it commits, and a lock-server call on one of their keys (a storm's
/// callers re-acquire exactly those keys) waits for that commit, so a
/// caller waits on one short transaction at most; the lines are written
/// after it commits. A pass runs batch after batch (`Drain`), so the limit
/// bounds that wait, never how much one pass reaps. docs/performance.md
/// has the figures behind the choice.
pub const BATCH_SIZE: usize = 1_000;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Leases this sweep reported as swept (`reapedBy` sweep, expiry or
    /// revoke): its own batches', a hand-off's it recovered from a sweeper
    /// that did not report them, and with etcd the deletions it saw.
    pub swept: u64,
    /// Leases this sweep reported from the record of a takeover, a late
    /// release or a late renewal.
    pub taken_over: u64,
    /// Batches that took something.
    pub batches: u64,
    /// Leases held after the sweep, when it got that far.
    pub held: Option<i64>,
    /// The sweep stopped early because shutdown was requested.
    pub interrupted: bool,
}

/// The lock-lease service.
pub struct LockSweeper<S: LockStore> {
    /// The leases' backend: where a pass's calls go, in `LockStore`'s order.
    store: S,
    /// Where the `lease_expired` lines go (stdout in the daemon): no log
    /// level can silence them.
    events: EventLog,
    /// Where each batch's counts and lateness go as it commits, and the
    /// pass's gauge after it.
    metrics: Metrics,
    /// The cause of the last `lock_batch_fallback` line: a batch that falls
    /// back for this cause again is counted, not logged again.
    fallback_logged: Option<String>,
}

impl<S: LockStore> LockSweeper<S> {
    pub fn new(store: S, events: EventLog, metrics: Metrics) -> Self {
        // The counter exists from the first scrape, at zero: `rate` and
        // `increase` need a sample before the first expiry.
        metrics.lease_expired(store.backend_id(), 0);
        metrics.events_missed(store.backend_id(), 0);
        metrics.batch_fallback(store.backend_id(), 0);
        Self {
            store,
            events,
            metrics,
            fallback_logged: None,
        }
    }

    /// Counts a batch the store took row by row, and logs its cause when it
    /// differs from the last one logged: a cause that persists is one WARN
    /// line, however many batches it fails, and a new cause is another.
    fn fell_back(&mut self) {
        let Some(cause) = self.store.take_fallback() else {
            return;
        };
        let backend = self.store.backend_id();
        self.metrics.batch_fallback(backend, 1);
        if self.fallback_logged.as_deref() != Some(cause.as_str()) {
            warn!(backend, cause = %cause, "lock_batch_fallback");
            self.fallback_logged = Some(cause);
        }
    }

    /// One pass (`LockStore` says the order of its calls). Stops between
    /// batches once `cancel` fires.
    pub async fn sweep_once(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<SweepOutcome, StoreError> {
        let mut outcome = SweepOutcome::default();
        let backend = self.store.backend_id();
        let probe = self.store.probe().await?;
        if probe.missed > 0 {
            self.metrics.events_missed(backend, probe.missed);
        }
        if probe.expired && self.drain(Stage::Expired, cancel, &mut outcome).await? {
            return Ok(outcome);
        }
        if probe.recorded && self.drain(Stage::Recorded, cancel, &mut outcome).await? {
            return Ok(outcome);
        }
        // The fleet's shared count, already lowered by this sweep's
        // deletions; the probe's answer when nothing had expired.
        let held = match probe.held {
            Some(held) => held,
            None => self.store.held_count().await?,
        };
        self.metrics.held_current(backend, held.max(0) as u64);
        outcome.held = Some(held);
        Ok(outcome)
    }

    /// Drains one stage batch by batch into `outcome`; whether a shutdown
    /// interrupted it (the pass then ends).
    async fn drain(
        &mut self,
        stage: Stage,
        cancel: &CancellationToken,
        outcome: &mut SweepOutcome,
    ) -> Result<bool, StoreError> {
        let backend = self.store.backend_id();
        let mut drain = Drain::new(BATCH_SIZE);
        while drain.go_on(cancel) {
            let mut report = LineReporter::new(&mut self.events, &self.metrics, backend, outcome);
            let n = match stage {
                Stage::Expired => self.store.reap_batch(BATCH_SIZE, &mut report).await,
                Stage::Recorded => self.store.drain_recorded(BATCH_SIZE, &mut report).await,
            };
            // Before the `?`: a batch that fell back and then failed to
            // write its lines still fell back.
            self.fell_back();
            drain.took(n?);
        }
        outcome.batches += drain.batches;
        outcome.interrupted = drain.interrupted;
        Ok(drain.interrupted)
    }
}

/// The two stages a pass drains, in this order: expired leases
/// (`LockStore::reap_batch`), then recorded expiries
/// (`LockStore::drain_recorded`).
#[derive(Debug, Clone, Copy)]
enum Stage {
    Expired,
    Recorded,
}

/// A lease's line, lateness and count, for the sweeper's `LineReporter`.
impl Reaped for ExpiredLease {
    type Tag = ReapedBy;
    type Outcome = SweepOutcome;

    fn write(events: &mut EventLog, backend: &'static str, leases: &[Self]) -> std::io::Result<()> {
        events.lease_expired(backend, leases)
    }

    fn gather(leases: &[Self], lateness: &mut Lateness<ReapedBy>, batch: &mut SweepOutcome) {
        lateness.add_leases(leases);
        for lease in leases {
            match lease.reaped_by {
                ReapedBy::Sweep | ReapedBy::Expiry | ReapedBy::Revoke => batch.swept += 1,
                ReapedBy::Takeover | ReapedBy::Release | ReapedBy::Renewal => batch.taken_over += 1,
            }
        }
    }

    fn send(
        metrics: &Metrics,
        backend: &'static str,
        lateness: &mut Lateness<ReapedBy>,
        batch: &SweepOutcome,
    ) {
        metrics.lease_overdue(backend, lateness);
        metrics.lease_expired(backend, batch.swept + batch.taken_over);
    }

    fn add(pass: &mut SweepOutcome, batch: &SweepOutcome) {
        pass.swept += batch.swept;
        pass.taken_over += batch.taken_over;
    }
}

impl<S: LockStore> Service for LockSweeper<S> {
    type Outcome = SweepOutcome;
    const SERVICE: &'static str = "lock_sweeper";
    const NAME: &'static str = "sweeper";
    const WORK: &'static str = "sweep";
    const FAILED_PASSES: FailedPasses = FailedPasses::Sweeps;

    fn log_started(&self) {
        info!(
            backend = self.store.backend_id(),
            delayMillis = SWEEP_DELAY.as_millis() as u64,
            batchSize = BATCH_SIZE,
            "sweeper_started"
        );
    }

    fn log_done(outcome: &SweepOutcome) {
        tracing::debug!(
            swept = outcome.swept,
            takenOver = outcome.taken_over,
            batches = outcome.batches,
            held = outcome.held,
            interrupted = outcome.interrupted,
            "sweep_done"
        );
    }

    async fn pass(&mut self, cancel: &CancellationToken) -> Result<SweepOutcome, StoreError> {
        self.sweep_once(cancel).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::progress::Progress;
    use crate::store::{Probe, Reporter, Work};
    use crate::sweep::report::testing::{discarded_metrics, written};

    /// What the stub's next `reap_batch` call does.
    enum Step {
        Reap(usize),
        Fail,
        /// Reap this many, then fire the token (a signal arriving mid-drain).
        ReapThenCancel(usize, CancellationToken),
    }

    #[derive(Clone, Default)]
    struct Stub {
        probe: Arc<Mutex<Probe>>,
        script: Arc<Mutex<VecDeque<Step>>>,
        /// What each `drain_recorded` call reports, in order (then 0).
        recorded: Arc<Mutex<VecDeque<usize>>>,
        /// Every call, in order.
        calls: Arc<Mutex<Vec<&'static str>>>,
    }

    impl Stub {
        fn new(expired: bool, recorded: bool, steps: Vec<Step>) -> Self {
            let stub = Self::default();
            *stub.probe.lock().unwrap() = Probe {
                expired,
                recorded,
                held: (!expired).then_some(7),
                missed: 0,
            };
            *stub.script.lock().unwrap() = steps.into();
            stub
        }
        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }
        fn called(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }
    }

    /// `n` leases, each 5 ms late.
    fn leases(n: usize, reaped_by: ReapedBy) -> Vec<ExpiredLease> {
        crate::model::testing::leases(n, reaped_by, |_| 5)
    }

    impl LockStore for Stub {
        fn backend_id(&self) -> &'static str {
            "stub"
        }

        async fn probe(&mut self) -> Result<Probe, StoreError> {
            self.called("probe");
            Ok(*self.probe.lock().unwrap())
        }

        async fn reap_batch(
            &mut self,
            limit: usize,
            report: &mut dyn Reporter<ExpiredLease>,
        ) -> Result<usize, StoreError> {
            self.called("reap");
            let step = self
                .script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Step::Reap(0));
            let n = match step {
                Step::Reap(n) => n,
                Step::Fail => {
                    return Err(StoreError::Query {
                        work: Work::LockLeases,
                        query: "lock_reap_batch",
                        cause: "boom".into(),
                        source: None,
                    });
                }
                Step::ReapThenCancel(n, token) => {
                    token.cancel();
                    n
                }
            };
            assert!(n <= limit);
            let rows = leases(n, ReapedBy::Sweep);
            written(report, &rows, Work::LockLeases)?;
            Ok(n)
        }

        async fn drain_recorded(
            &mut self,
            limit: usize,
            report: &mut dyn Reporter<ExpiredLease>,
        ) -> Result<usize, StoreError> {
            self.called("drain");
            let n = self.recorded.lock().unwrap().pop_front().unwrap_or(0);
            assert!(n <= limit);
            written(report, &leases(n, ReapedBy::Takeover), Work::LockLeases)?;
            Ok(n)
        }

        async fn held_count(&mut self) -> Result<i64, StoreError> {
            self.called("held");
            Ok(3)
        }
    }

    fn sweeper(stub: &Stub) -> (LockSweeper<Stub>, crate::output::events::MemoryLog) {
        let (log, lines) = EventLog::in_memory();
        (
            LockSweeper::new(stub.clone(), log, discarded_metrics()),
            lines,
        )
    }

    #[tokio::test]
    async fn full_batches_are_followed_by_more_each_from_where_the_last_left_off() {
        let stub = Stub::new(
            true,
            false,
            vec![
                Step::Reap(BATCH_SIZE),
                Step::Reap(BATCH_SIZE),
                Step::Reap(3),
                Step::Reap(99),
            ],
        );
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        let swept = 2 * BATCH_SIZE + 3;
        assert_eq!((outcome.swept, outcome.batches), (swept as u64, 3));
        assert_eq!(outcome.held, Some(3), "read after reaping");
        assert_eq!(stub.calls(), ["probe", "reap", "reap", "reap", "held"]);
        assert_eq!(lines.lines().len(), swept);
    }

    #[tokio::test]
    async fn an_idle_sweep_is_one_question_and_its_count() {
        let stub = Stub::new(false, false, vec![]);
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(stub.calls(), ["probe"]);
        assert_eq!(outcome.held, Some(7), "the probe's count");
        assert!(lines.lines().is_empty());
    }

    #[tokio::test]
    async fn recorded_expiries_drain_after_the_reaping_then_the_gauge() {
        let stub = Stub::new(true, true, vec![Step::Reap(2)]);
        *stub.recorded.lock().unwrap() = vec![BATCH_SIZE, 4, 9].into();
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(stub.calls(), ["probe", "reap", "drain", "drain", "held"]);
        assert_eq!(
            (outcome.swept, outcome.taken_over, outcome.batches),
            (2, BATCH_SIZE as u64 + 4, 3)
        );
        let takeover_lines = lines
            .lines()
            .iter()
            .filter(|l| l.contains("reapedBy=takeover"))
            .count();
        assert_eq!(takeover_lines, BATCH_SIZE + 4);
    }

    #[tokio::test]
    async fn a_shutdown_mid_drain_stops_between_batches_and_skips_the_gauge() {
        let token = CancellationToken::new();
        let stub = Stub::new(
            true,
            true,
            vec![
                Step::ReapThenCancel(BATCH_SIZE, token.clone()),
                Step::Reap(BATCH_SIZE),
            ],
        );
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&token).await.unwrap();

        assert!(outcome.interrupted);
        assert_eq!((outcome.swept, outcome.held), (BATCH_SIZE as u64, None));
        assert_eq!(stub.calls(), ["probe", "reap"]);
        assert_eq!(
            lines.lines().len(),
            BATCH_SIZE,
            "the finished batch was reported"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_store_fails_the_sweep_but_not_the_loop() {
        let stub = Stub::new(true, false, vec![Step::Fail, Step::Reap(2)]);
        let (sweeper, lines) = sweeper(&stub);
        let token = CancellationToken::new();
        let beat = Progress::new(1).beat(0);
        let task = tokio::spawn(crate::sweep::run(
            sweeper,
            discarded_metrics(),
            beat,
            token.clone(),
        ));

        // Paused time: each sweep's delay passes at once, the order stays.
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            while lines.lines().len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        token.cancel();
        task.await.unwrap();

        assert!(waited.is_ok(), "the sweep after the failure never reported");
        assert_eq!(stub.calls()[..4], ["probe", "reap", "probe", "reap"]);
        assert_eq!(lines.lines().len(), 2);
    }

    #[tokio::test]
    async fn an_unwritable_log_fails_the_batch_instead_of_losing_lines() {
        struct Broken;
        impl std::io::Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let stub = Stub::new(true, false, vec![Step::Reap(4)]);
        let mut sweeper = LockSweeper::new(
            stub.clone(),
            EventLog::to_writer(Box::new(Broken)),
            discarded_metrics(),
        );

        let err = sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap_err();

        assert!(matches!(err, StoreError::Report { .. }), "{err}");
    }
}
