//! The lock sweeper: a pass reaps expired leases, then recorded takeovers,
//! batch by batch through a `LockStore`'s stages, and sets the held-lease
//! gauge. Owns each batch's `lease_expired` lines and counts, sent with the
//! batch, and how a backlog is drained beside the workload: smaller batches
//! while lock-server calls wait on them, a pause after each batch while
//! other sessions are busy (for the drain's first `PACED_DRAIN_LIMIT`), full
//! speed otherwise. Not the loop's timing or error logging (`sweep::run`)
//! nor any SQL (the store).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::model::{ExpiredLease, ReapedBy};
use crate::output::events::EventLog;
use crate::output::metrics::{Lateness, Metrics};
use crate::store::{ExpiryStage, LockStore, Reaped, Reporter, StoreError, TakeoverStage, Workload};
use crate::sweep::{Drain, FailedPasses, Hold, Outcome, SWEEP_DELAY, Service};

/// Most leases one transaction deletes while no lock-server call waits on
/// the sweep. Bounds the row locks a sweeper holds, the lines buffered
/// before a hand-off is claimed and the memory of a backlog drain; see
/// docs/performance.md for how it was chosen: with resumed batches, 5,000
/// drains 1,000,000 leases as fast as 20,000 or 50,000 do (within the noise
/// of a 2-core machine) at 7.6 MiB peak RSS instead of 15 or 28 MiB.
pub const BATCH_SIZE: usize = 5_000;

/// The batch of a sweep that may be harming someone: the first of every
/// sweep (taken before anything is known of a storm), and every batch while
/// lock-server calls wait on the sweep's rows or other sessions are busy. A
/// call on a key of the batch being deleted waits for the reaping statement,
/// about 5 ms per 1,000 leases, and a batch takes its share of a storm's
/// keys: at 5,000 of 200,000, one re-acquire in 40 waited about 25 ms (80 ms
/// beside a busy workload), enough to move the callers' 99th percentile.
/// 500 makes that one in 400, for a few ms.
pub const SMALL_BATCH_SIZE: usize = 500;

/// How long batches stay at `SMALL_BATCH_SIZE` after the last one a
/// lock-server call was seen waiting on, and a drain careful and paced after
/// the last batch that saw other sessions busy. Small batches are rarely
/// hit, so the hold, not the next hit, keeps them small while a storm lasts;
/// a drain alone on the server never sees either and keeps `BATCH_SIZE`.
pub const CONTENTION_HOLD: Duration = Duration::from_secs(5);

/// The pause after each full batch while other sessions are busy, as a
/// multiple of the time the batch took: the backlog then takes at most
/// 1 / (1 + `BUSY_PACE`) of the time, its lines are written before the next
/// batch is taken, and the workload keeps the rest of the server. On an idle
/// server the drain runs unpaced, its lines written while the next batch is
/// taken. Three rather than one: beside a lock server on 2 cores its
/// callers' median p99 over 16 runs rose less, and a 200,000-lease storm still
/// drains in under 10 s (docs/performance.md, the harm step).
pub const BUSY_PACE: u32 = 3;

/// How long one sweep's drain may pause beside a workload. Past it the
/// drain keeps its careful batches but stops pausing: its lines are the
/// signal operators alert on, and a 200,000-lease storm must be reported
/// within 10 s. Beside a lock server's callers on 2 cores its paced drain
/// took 6.2-8.7 s; six seconds of pacing, then the rest at the careful
/// walk's own speed (a quarter of the paced time), keeps such a storm within
/// 10 s on a server twice as slow (docs/performance.md, the harm step).
pub const PACED_DRAIN_LIMIT: Duration = Duration::from_secs(6);

/// What the last batches said about the sweeper's neighbours: how big the
/// next batch is, whether to pause after it, and whether its lines may wait
/// for the next batch.
#[derive(Debug, Default)]
struct Neighbours {
    /// Lock-server calls waited on a batch; small batches while it holds.
    contended: Hold,
    /// Other sessions were busy; a paced drain while it holds.
    busy: Hold,
}

impl Neighbours {
    /// Small while lock-server calls wait on the sweep or others are busy.
    fn limit(&self, now: Instant) -> usize {
        if self.contended.holds(now) || self.workload(now) == Workload::Busy {
            SMALL_BATCH_SIZE
        } else {
            BATCH_SIZE
        }
    }

    /// The pause after a full batch, as a multiple of its time.
    fn pace(&self, now: Instant) -> u32 {
        match self.workload(now) {
            Workload::Busy => BUSY_PACE,
            Workload::Idle => 0,
        }
    }

    /// Busy while the hold lasts: the store then skips rows others hold and
    /// writes each batch's lines before the next.
    fn workload(&self, now: Instant) -> Workload {
        if self.busy.holds(now) {
            Workload::Busy
        } else {
            Workload::Idle
        }
    }

    fn saw(&mut self, reaped: Reaped, now: Instant) {
        self.contended.saw(reaped.waiters > 0, now, CONTENTION_HOLD);
        self.saw_busy(reaped.busy, now);
    }

    /// `busy` other sessions were at work (a batch's, or the sweep's first
    /// question's, count).
    fn saw_busy(&mut self, busy: u32, now: Instant) {
        self.busy.saw(busy > 0, now, CONTENTION_HOLD);
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Expired leases deleted by this sweep.
    pub swept: u64,
    /// Expired leases stolen by an acquire and reported by this sweep.
    pub taken_over: u64,
    /// Transactions committed.
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
    neighbours: Neighbours,
}

impl<S: LockStore> LockSweeper<S> {
    pub fn new(store: S, events: EventLog, metrics: Metrics) -> Self {
        // The counter exists from the first scrape, at zero: `rate` and
        // `increase` need a sample before the first expiry.
        metrics.lease_expired(store.backend_id(), 0);
        Self {
            store,
            events,
            metrics,
            neighbours: Neighbours::default(),
        }
    }

    /// One pass: drain expired leases, then takeovers (and batches another
    /// sweep handed off but did not report), batch by batch, then report the
    /// gauge. Stops between batches once `cancel` fires.
    pub async fn sweep_once(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<SweepOutcome, StoreError> {
        let mut outcome = SweepOutcome::default();
        let backend = self.store.backend_id();
        let mut expired = self.store.begin_sweep().await?;
        self.neighbours.saw_busy(expired.busy(), Instant::now());
        let mut drain = Drain::new(BATCH_SIZE);
        drain.pace_for_at_most(PACED_DRAIN_LIMIT);
        let mut first = true;
        while drain.go_on(cancel) {
            let now = Instant::now();
            let limit = if std::mem::take(&mut first) {
                SMALL_BATCH_SIZE
            } else {
                self.neighbours.limit(now)
            };
            drain.limit_to(limit);
            let workload = self.neighbours.workload(now);
            let reaped = {
                let mut report =
                    LeaseReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
                expired.reap_expired(limit, workload, &mut report).await?
            };
            let took = now.elapsed();
            let now = Instant::now();
            self.neighbours.saw(reaped, now);
            drain.pace(self.neighbours.pace(now));
            drain.took_in(reaped.n, reaped.batches);
            drain.rest(took, cancel).await;
        }
        // The last batch's lines, if they were to go with a next one.
        {
            let mut report =
                LeaseReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
            expired.finish(&mut report).await?;
        }
        outcome.batches += drain.batches;
        if drain.interrupted {
            outcome.interrupted = true;
            return Ok(outcome);
        }
        // Outbox drains hold no lease a lock-server call could wait on.
        let mut takeovers = expired.into_takeovers();
        let mut drain = Drain::new(BATCH_SIZE);
        while drain.go_on(cancel) {
            let n = {
                let mut report =
                    LeaseReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
                takeovers.drain_takeovers(BATCH_SIZE, &mut report).await?
            };
            drain.took(n);
        }
        outcome.batches += drain.batches;
        if drain.interrupted {
            outcome.interrupted = true;
            return Ok(outcome);
        }
        // The store's count is shared by the fleet and already lowered by
        // this sweep's deletions (PgLockStore: by the database, in the same
        // read); one cheap read per sweep, one recount per interval for all
        // replicas together.
        let held = takeovers.held_count().await?;
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
                ReapedBy::Sweep => self.outcome.swept += 1,
                ReapedBy::Takeover => self.outcome.taken_over += 1,
            }
        }
        Ok(())
    }

    /// Counts the leases written since the last commit, records their
    /// lateness and sends both at once. As each batch commits, not when the
    /// call returns: a call that commits two batches (two walkers') must not
    /// hold the first one's count while the second is written, and a long
    /// drain must not hold committed counts until it ends; a crash would
    /// lose them.
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

    use std::time::{Duration, Instant};

    use super::*;
    use crate::config::StatsdTarget;
    use crate::progress::Progress;
    use crate::store::{Reaped, Report, Work};

    /// What the stub's next `reap_expired` call does.
    enum Step {
        Reap(usize),
        /// Reap this many while lock-server calls wait on the batch.
        Contended(usize),
        /// Reap this many while other sessions are busy, taking `BUSY_BATCH`.
        Busy(usize),
        Fail,
        /// Reap this many, then fire the token (a signal arriving mid-drain).
        ReapThenCancel(usize, CancellationToken),
    }

    #[derive(Clone, Default)]
    struct Stub {
        script: Arc<Mutex<VecDeque<Step>>>,
        /// What each `drain_takeovers` call reports, in order (then 0).
        takeovers: Arc<Mutex<VecDeque<usize>>>,
        /// Every stage call, in order: `begin`, `reap`, `finish`, `drain`,
        /// `held`.
        calls: Arc<Mutex<Vec<&'static str>>>,
        /// The limit of every `reap_expired` call, in order.
        limits: Arc<Mutex<Vec<usize>>>,
        /// The workload each `reap_expired` call was told of.
        workloads: Arc<Mutex<Vec<Workload>>>,
        /// What `busy` says when the next sweep begins.
        busy_at_begin: Arc<Mutex<u32>>,
        /// Fired by the next `drain_takeovers` (a signal mid-drain).
        cancel_on_drain: Arc<Mutex<Option<CancellationToken>>>,
    }

    impl Stub {
        fn new(steps: Vec<Step>) -> Self {
            Self {
                script: Arc::new(Mutex::new(steps.into())),
                ..Self::default()
            }
        }
        fn called(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }
        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }
        /// How many `reap_expired` calls there were.
        fn reaps(&self) -> usize {
            self.calls().iter().filter(|c| **c == "reap").count()
        }
    }

    /// How long a `Step::Busy` batch takes (paused time).
    const BUSY_BATCH: Duration = Duration::from_millis(40);

    fn leases(n: usize, reaped_by: ReapedBy) -> Vec<ExpiredLease> {
        (0..n)
            .map(|i| ExpiredLease {
                lock_key: format!("k{i}"),
                owner_id: "o".into(),
                token: i as i64,
                expired_at_millis: 0,
                overdue_millis: 5,
                reaped_by,
            })
            .collect()
    }

    impl LockStore for Stub {
        type Sweep<'s> = Stub;

        fn backend_id(&self) -> &'static str {
            "stub"
        }

        async fn begin_sweep(&mut self) -> Result<Stub, StoreError> {
            self.called("begin");
            Ok(self.clone())
        }
    }

    impl ExpiryStage for Stub {
        type Takeovers = Stub;

        async fn reap_expired(
            &mut self,
            limit: usize,
            workload: Workload,
            report: Report<'_, ExpiredLease>,
        ) -> Result<Reaped, StoreError> {
            self.called("reap");
            self.limits.lock().unwrap().push(limit);
            self.workloads.lock().unwrap().push(workload);
            let step = self
                .script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Step::Reap(0));
            let (n, waiters, busy) = match step {
                Step::Reap(n) => (n, 0, 0),
                Step::Contended(n) => (n, 2, 0),
                Step::Busy(n) => {
                    tokio::time::advance(BUSY_BATCH).await;
                    (n, 0, 3)
                }
                Step::Fail => {
                    return Err(StoreError::Query {
                        work: Work::LockLeases,
                        query: "reap_expired",
                        cause: "boom".into(),
                        source: None,
                    });
                }
                Step::ReapThenCancel(n, token) => {
                    token.cancel();
                    (n, 0, 0)
                }
            };
            assert!(n <= limit);
            report
                .lines(&leases(n, ReapedBy::Sweep))
                .map_err(|source| StoreError::Report {
                    work: Work::LockLeases,
                    source,
                })?;
            report.committed();
            Ok(Reaped {
                n,
                batches: u32::from(n > 0),
                waiters,
                busy,
            })
        }

        fn busy(&self) -> u32 {
            *self.busy_at_begin.lock().unwrap()
        }

        async fn finish(&mut self, _report: Report<'_, ExpiredLease>) -> Result<(), StoreError> {
            self.called("finish");
            Ok(())
        }

        fn into_takeovers(self) -> Stub {
            self
        }
    }

    impl TakeoverStage for Stub {
        async fn drain_takeovers(
            &mut self,
            limit: usize,
            report: Report<'_, ExpiredLease>,
        ) -> Result<usize, StoreError> {
            self.called("drain");
            let n = self.takeovers.lock().unwrap().pop_front().unwrap_or(0);
            if let Some(token) = self.cancel_on_drain.lock().unwrap().take() {
                token.cancel();
            }
            assert!(n <= limit);
            report
                .lines(&leases(n, ReapedBy::Takeover))
                .map_err(|source| StoreError::Report {
                    work: Work::LockLeases,
                    source,
                })?;
            report.committed();
            Ok(n)
        }

        async fn held_count(self) -> Result<i64, StoreError> {
            self.called("held");
            Ok(3)
        }
    }

    fn sweeper(stub: &Stub) -> (LockSweeper<Stub>, crate::output::events::MemoryLog) {
        let (log, lines) = EventLog::in_memory();
        // Port 9 (discard) on loopback: metrics are not what these tests check.
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        (LockSweeper::new(stub.clone(), log, metrics), lines)
    }

    #[tokio::test]
    async fn full_batches_are_followed_by_more_until_a_short_one() {
        let stub = Stub::new(vec![
            Step::Reap(SMALL_BATCH_SIZE),
            Step::Reap(BATCH_SIZE),
            Step::Reap(3),
            Step::Reap(99),
        ]);
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        let swept = SMALL_BATCH_SIZE + BATCH_SIZE + 3;
        assert_eq!(outcome.swept, swept as u64);
        assert_eq!(outcome.batches, 3);
        assert_eq!(outcome.held, Some(3));
        assert_eq!(stub.reaps(), 3, "a short batch ends the drain");
        assert_eq!(
            *stub.limits.lock().unwrap(),
            [SMALL_BATCH_SIZE, BATCH_SIZE, BATCH_SIZE],
            "a sweep's first batch is small, the next ones full-size"
        );
        assert_eq!(lines.lines().len(), swept);
    }

    #[tokio::test]
    async fn takeovers_drain_after_expiries_then_the_gauge() {
        let stub = Stub::new(vec![Step::Reap(2)]);
        *stub.takeovers.lock().unwrap() = vec![BATCH_SIZE, 4, 9].into();
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            stub.calls(),
            ["begin", "reap", "finish", "drain", "drain", "held"]
        );
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
    async fn an_interrupted_sweep_skips_the_gauge_and_the_next_begins_anew() {
        let token = CancellationToken::new();
        let stub = Stub::new(vec![Step::Reap(1)]);
        *stub.takeovers.lock().unwrap() = vec![BATCH_SIZE].into();
        *stub.cancel_on_drain.lock().unwrap() = Some(token.clone());
        let (mut sweeper, _lines) = sweeper(&stub);

        // The first drain is full; the cancel lands before the second.
        let first = sweeper.sweep_once(&token).await.unwrap();
        assert!(first.interrupted);
        assert_eq!(first.held, None);
        sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            stub.calls(),
            [
                "begin", "reap", "finish", "drain", "begin", "reap", "finish", "drain", "held"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn batches_shrink_while_lock_server_calls_wait_and_grow_back_after_the_hold() {
        let stub = Stub::new(vec![
            Step::Reap(SMALL_BATCH_SIZE),
            Step::Contended(BATCH_SIZE),
            Step::Reap(SMALL_BATCH_SIZE),
            Step::Reap(7),
        ]);
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            *stub.limits.lock().unwrap(),
            [
                SMALL_BATCH_SIZE,
                BATCH_SIZE,
                SMALL_BATCH_SIZE,
                SMALL_BATCH_SIZE
            ],
            "smaller batches once a call waited; a full small batch goes on"
        );
        assert_eq!(
            outcome.swept,
            (BATCH_SIZE + 2 * SMALL_BATCH_SIZE + 7) as u64
        );
        assert_eq!(lines.lines().len(), outcome.swept as usize);

        // Within the hold the next sweep stays small after its first batch;
        // after it, full-size again.
        *stub.script.lock().unwrap() = vec![Step::Reap(SMALL_BATCH_SIZE), Step::Reap(1)].into();
        sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
        tokio::time::advance(CONTENTION_HOLD).await;
        *stub.script.lock().unwrap() = vec![Step::Reap(SMALL_BATCH_SIZE), Step::Reap(1)].into();
        sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
        let limits = stub.limits.lock().unwrap();
        assert_eq!(
            limits[4..],
            [
                SMALL_BATCH_SIZE,
                SMALL_BATCH_SIZE,
                SMALL_BATCH_SIZE,
                BATCH_SIZE
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn busy_neighbours_get_small_paced_batches_that_skip_their_rows() {
        let stub = Stub::new(vec![
            Step::Reap(SMALL_BATCH_SIZE),
            Step::Busy(BATCH_SIZE),
            Step::Busy(SMALL_BATCH_SIZE),
            Step::Reap(7),
        ]);
        let (mut sweeper, lines) = sweeper(&stub);

        let started = tokio::time::Instant::now();
        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            *stub.workloads.lock().unwrap(),
            [
                Workload::Idle,
                Workload::Idle,
                Workload::Busy,
                Workload::Busy
            ],
            "the store is told once a batch saw others busy"
        );
        assert_eq!(
            *stub.limits.lock().unwrap(),
            [
                SMALL_BATCH_SIZE,
                BATCH_SIZE,
                SMALL_BATCH_SIZE,
                SMALL_BATCH_SIZE
            ]
        );
        assert_eq!(
            started.elapsed(),
            2 * (1 + BUSY_PACE) * BUSY_BATCH,
            "each busy batch, then a pause BUSY_PACE times as long, after every full batch from \
             the first busy one"
        );
        assert_eq!(
            outcome.swept,
            (BATCH_SIZE + 2 * SMALL_BATCH_SIZE + 7) as u64
        );
        assert_eq!(lines.lines().len(), outcome.swept as usize);

        // Within the hold the next sweep is paced from its first batch;
        // after it, it overlaps again.
        *stub.script.lock().unwrap() = vec![Step::Reap(1)].into();
        sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
        tokio::time::advance(CONTENTION_HOLD).await;
        *stub.script.lock().unwrap() = vec![Step::Reap(1)].into();
        sweeper.sweep_once(&CancellationToken::new()).await.unwrap();
        assert_eq!(
            stub.workloads.lock().unwrap()[4..],
            [Workload::Busy, Workload::Idle]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_drain_stops_pausing_at_its_limit_and_stays_careful() {
        // Busy batches each take BUSY_BATCH and are followed by a pause
        // BUSY_PACE times as long while the drain is within its limit.
        let cycle = (1 + BUSY_PACE) * BUSY_BATCH;
        // The batches that end within the limit: (k - 1) cycles + one batch.
        let paced = (PACED_DRAIN_LIMIT - BUSY_BATCH)
            .as_millis()
            .div_ceil(cycle.as_millis()) as u32;
        let unpaced = 10;
        let mut steps: Vec<Step> = (0..paced + unpaced)
            .map(|_| Step::Busy(SMALL_BATCH_SIZE))
            .collect();
        steps.push(Step::Busy(1));
        let stub = Stub::new(steps);
        *stub.busy_at_begin.lock().unwrap() = 1;
        let (mut sweeper, lines) = sweeper(&stub);

        let started = tokio::time::Instant::now();
        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            started.elapsed(),
            paced * cycle + (unpaced + 1) * BUSY_BATCH,
            "a pause after each batch that ended within the limit, none after"
        );
        assert!(
            stub.workloads
                .lock()
                .unwrap()
                .iter()
                .all(|w| *w == Workload::Busy),
            "past the limit the batches stay careful"
        );
        let swept = (paced + unpaced) as usize * SMALL_BATCH_SIZE + 1;
        assert_eq!(outcome.swept, swept as u64);
        assert_eq!(lines.lines().len(), swept);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_that_begins_beside_busy_sessions_starts_careful() {
        let stub = Stub::new(vec![Step::Reap(SMALL_BATCH_SIZE), Step::Reap(3)]);
        *stub.busy_at_begin.lock().unwrap() = 2;
        let (mut sweeper, _lines) = sweeper(&stub);

        sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            *stub.workloads.lock().unwrap(),
            [Workload::Busy, Workload::Busy]
        );
        assert_eq!(
            *stub.limits.lock().unwrap(),
            [SMALL_BATCH_SIZE, SMALL_BATCH_SIZE]
        );
    }

    #[tokio::test]
    async fn a_shutdown_mid_drain_stops_between_batches() {
        let token = CancellationToken::new();
        let stub = Stub::new(vec![
            Step::ReapThenCancel(SMALL_BATCH_SIZE, token.clone()),
            Step::Reap(BATCH_SIZE),
        ]);
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&token).await.unwrap();

        assert!(outcome.interrupted);
        assert_eq!((outcome.swept, stub.reaps()), (SMALL_BATCH_SIZE as u64, 1));
        assert_eq!(
            lines.lines().len(),
            SMALL_BATCH_SIZE,
            "the finished batch was reported"
        );
        assert_eq!(
            stub.calls(),
            ["begin", "reap", "finish"],
            "lines still waiting for a next batch are written before it stops"
        );
    }

    #[tokio::test]
    async fn a_failing_store_fails_the_sweep_but_not_the_loop() {
        let stub = Stub::new(vec![Step::Fail, Step::Reap(2)]);
        let (sweeper, lines) = sweeper(&stub);
        let token = CancellationToken::new();
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        let beat = Progress::new(1).beat(0);
        let task = tokio::spawn(crate::sweep::run(sweeper, metrics, beat, token.clone()));

        let deadline = Instant::now() + Duration::from_secs(10);
        while lines.lines().len() < 2 {
            assert!(
                Instant::now() < deadline,
                "the sweep after the failure never reported"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        token.cancel();
        task.await.unwrap();

        assert!(stub.reaps() >= 2);
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
        let stub = Stub::new(vec![Step::Reap(4)]);
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        let mut sweeper =
            LockSweeper::new(stub.clone(), EventLog::to_writer(Box::new(Broken)), metrics);

        let err = sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap_err();

        assert!(matches!(err, StoreError::Report { .. }), "{err}");
    }
}
