//! The lock sweeper: one pass asks the store what there is to do, reaps
//! expired leases batch by batch in deadline order, each from where the last
//! left off, until a short batch, then drains recorded takeovers and late
//! releases the same way, and sets the held-lease gauge. Owns each batch's
//! `lease_expired` lines and counts, sent with the batch. Not the loop's
//! timing or error logging (`sweep::run`) nor any SQL (the store).
//!
//! What a reader must hold to change how a batch is reaped, all of it:
//! - types: `LockSweeper`, `SweepOutcome`, `LeaseReporter`, `Drain`,
//!   `LockStore` with its `Probe` and `Batch`, `PgLockStore`;
//! - constants: `BATCH_SIZE`, `SWEEP_DELAY`, `HELD_COUNT_MAX_AGE`;
//! - SQL functions on the path: `lock_sweep_probe`, `lock_reap_batch` (and
//!   `lock_reap_expired`, the row-by-row path it falls back on),
//!   `lock_handoff_claim`, `lock_handoff_recover`, `lock_drain_takeovers`,
//!   `lock_held_count_get`: 18 in all;
//! - one connection, one batch shape: delete up to `BATCH_SIZE` rows in
//!   deadline order, skipping rows others hold, commit them with their
//!   hand-off, write their lines, clear the hand-off.
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
use crate::store::{LockStore, Reporter, StoreError};
use crate::sweep::{Drain, FailedPasses, Outcome, SWEEP_DELAY, Service};

/// Most leases one batch deletes: its transaction holds their row locks,
/// and a lock-server call on one of their keys (a storm's callers
/// re-acquire exactly those keys) waits for it, so a batch is kept to a
/// few milliseconds of work; the lines are written after it commits. Large
/// enough that a 200,000-lease storm is still reported within 10 s;
/// docs/performance.md has the figures behind the choice.
pub const BATCH_SIZE: usize = 1_000;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Expired leases deleted by this sweep.
    pub swept: u64,
    /// Expired leases taken over or released late, or swept by a sweeper
    /// that did not report them, and reported by this sweep.
    pub taken_over: u64,
    /// Batches that took something.
    pub batches: u64,
    /// Leases held after the sweep, when it got that far.
    pub held: Option<i64>,
    /// The sweep stopped early because shutdown was requested.
    pub interrupted: bool,
}

impl Outcome for SweepOutcome {
    fn log_done(&self) {
        tracing::debug!(
            swept = self.swept,
            takenOver = self.taken_over,
            batches = self.batches,
            held = self.held,
            interrupted = self.interrupted,
            "sweep_done"
        );
    }
}

/// The lock-lease service.
pub struct LockSweeper<S: LockStore> {
    store: S,
    events: EventLog,
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
        if probe.expired {
            let mut drain = Drain::new(BATCH_SIZE);
            while drain.go_on(cancel) {
                let mut report =
                    LeaseReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
                let n = self.store.reap_batch(BATCH_SIZE, &mut report).await;
                self.fell_back();
                drain.took(n?);
            }
            outcome.batches += drain.batches;
            if drain.interrupted {
                outcome.interrupted = true;
                return Ok(outcome);
            }
        }
        if probe.recorded {
            let mut drain = Drain::new(BATCH_SIZE);
            while drain.go_on(cancel) {
                let mut report =
                    LeaseReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
                let n = self.store.drain_recorded(BATCH_SIZE, &mut report).await?;
                drain.took(n);
            }
            outcome.batches += drain.batches;
            if drain.interrupted {
                outcome.interrupted = true;
                return Ok(outcome);
            }
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
}

/// The store's `Reporter` for one call of a sweep's stages: writes the
/// `lease_expired` lines, counts them as written in the sweep's outcome (a
/// batch whose lines another sweeper wrote, having recovered its hand-off
/// first, counts there) and gathers their lateness, which it sends with
/// their count as each batch commits. What it gathered for a batch that
/// never commits is dropped with it: an uncommitted batch counts nothing.
struct LeaseReporter<'a> {
    events: &'a mut EventLog,
    metrics: &'a Metrics,
    backend: &'static str,
    outcome: &'a mut SweepOutcome,
    /// One entry a lease written since the last commit, so also how many
    /// to count.
    lateness: Lateness<ReapedBy>,
}

impl<'a> LeaseReporter<'a> {
    fn new(
        events: &'a mut EventLog,
        metrics: &'a Metrics,
        backend: &'static str,
        outcome: &'a mut SweepOutcome,
    ) -> Self {
        Self {
            events,
            metrics,
            backend,
            outcome,
            lateness: Lateness::default(),
        }
    }
}

impl Reporter<ExpiredLease> for LeaseReporter<'_> {
    fn lines(&mut self, leases: &[ExpiredLease]) -> std::io::Result<()> {
        self.events.lease_expired(self.backend, leases)?;
        self.lateness.add_leases(leases);
        for lease in leases {
            match lease.reaped_by {
                ReapedBy::Sweep | ReapedBy::Expiry | ReapedBy::Revoke => self.outcome.swept += 1,
                ReapedBy::Takeover | ReapedBy::Release | ReapedBy::Renewal => {
                    self.outcome.taken_over += 1
                }
            }
        }
        Ok(())
    }

    /// Counts the leases written since the last commit, records their
    /// lateness and sends both at once. As each batch commits, not when the
    /// sweep ends: a long drain must not hold committed counts until it
    /// ends, where a crash would lose them.
    fn committed(&mut self) {
        let n = self.lateness.count();
        if n > 0 {
            self.metrics.lease_overdue(self.backend, &mut self.lateness);
            self.metrics.lease_expired(self.backend, n);
            self.metrics.flush();
        }
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
    use crate::config::StatsdTarget;
    use crate::progress::Progress;
    use crate::store::{Probe, Report, Work};

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

    /// `n` leases whose deadlines count up from `first`.
    fn leases(n: usize, first: i64, reaped_by: ReapedBy) -> Vec<ExpiredLease> {
        (0..n)
            .map(|i| ExpiredLease {
                lock_key: format!("k{i}"),
                owner_id: "o".into(),
                token: i.to_string(),
                expired_at_millis: first + i as i64,
                overdue_millis: 5,
                reaped_by,
            })
            .collect()
    }

    fn written(report: Report<'_, ExpiredLease>, rows: &[ExpiredLease]) -> Result<(), StoreError> {
        report.lines(rows).map_err(|source| StoreError::Report {
            work: Work::LockLeases,
            source,
        })?;
        report.committed();
        Ok(())
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
            report: Report<'_, ExpiredLease>,
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
            let rows = leases(n, 1, ReapedBy::Sweep);
            written(report, &rows)?;
            Ok(n)
        }

        async fn drain_recorded(
            &mut self,
            limit: usize,
            report: Report<'_, ExpiredLease>,
        ) -> Result<usize, StoreError> {
            self.called("drain");
            let n = self.recorded.lock().unwrap().pop_front().unwrap_or(0);
            assert!(n <= limit);
            written(report, &leases(n, 0, ReapedBy::Takeover))?;
            Ok(n)
        }

        async fn held_count(&mut self) -> Result<i64, StoreError> {
            self.called("held");
            Ok(3)
        }
    }

    fn metrics() -> Metrics {
        // Port 9 (discard) on loopback: metrics are not what these tests check.
        Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        })
    }

    fn sweeper(stub: &Stub) -> (LockSweeper<Stub>, crate::output::events::MemoryLog) {
        let (log, lines) = EventLog::in_memory();
        (LockSweeper::new(stub.clone(), log, metrics()), lines)
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
        let task = tokio::spawn(crate::sweep::run(sweeper, metrics(), beat, token.clone()));

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
            metrics(),
        );

        let err = sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap_err();

        assert!(matches!(err, StoreError::Report { .. }), "{err}");
    }
}
