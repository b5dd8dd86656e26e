//! The sweep: one pass (`sweep_once`) and the loop around it (`run`).
//!
//! `sweep_once` reaps expired leases batch by batch until a short batch (so one
//! pass drains any backlog while no transaction holds more than one batch),
//! drains recorded takeovers the same way, and reports the held-lease gauge.
//! It returns counts and leaves timing to the loop. `run` owns the fixed delay,
//! cancellation and error logging: a failed sweep is logged at ERROR and the
//! next one still runs. This module knows no SQL and no backend; it talks to a
//! `LockStore`.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::events::EventLog;
use crate::jobs::JobReaper;
use crate::metrics::Metrics;
use crate::store::{ExpiredLease, LockStore, StoreError};

/// Pause between the end of one sweep and the start of the next. A fixed
/// delay, not a rate: sweeps never overlap. One second keeps `overdueMillis`
/// meaningful for the shortest lease the lock server grants (it must be at
/// most a quarter of the shortest TTL).
pub const SWEEP_DELAY: Duration = Duration::from_secs(1);

/// Most leases one transaction deletes. Bounds the row locks a sweeper holds,
/// the lines buffered before a commit and the memory of a backlog drain; see
/// docs/performance.md for how it was chosen: with resumed batches, 5,000
/// drains 1,000,000 leases as fast as 20,000 or 50,000 do (within the noise
/// of this 2-core machine) at 7.6 MiB peak RSS instead of 15 or 28 MiB.
pub const BATCH_SIZE: usize = 5_000;

/// After a shutdown signal, how long a sweep in flight may take to finish its
/// batch before it is abandoned (its transaction then rolls back, so its
/// leases are reported again by the next sweeper: at least once).
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// While the same error persists, it is logged again at most this often.
pub const ERROR_REPEAT: Duration = Duration::from_secs(60);

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

/// One sweeper replica's loop state.
pub struct Sweeper<S: LockStore> {
    store: S,
    jobs: Option<JobReaper>,
    events: EventLog,
    metrics: Metrics,
    lock_errors: ErrorLog,
    job_errors: ErrorLog,
    on_sweep: Option<Box<dyn FnMut() + Send>>,
}

impl<S: LockStore> Sweeper<S> {
    pub fn new(store: S, events: EventLog, metrics: Metrics) -> Self {
        Self {
            store,
            jobs: None,
            events,
            metrics,
            lock_errors: ErrorLog::new("sweep"),
            job_errors: ErrorLog::new("job_reap"),
            on_sweep: None,
        }
    }

    /// Also reap stale job leases on every sweep (when the gates allow).
    pub fn with_jobs(mut self, jobs: JobReaper) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// Called after every sweep, failed or not: the systemd watchdog ping.
    pub fn on_sweep(mut self, hook: impl FnMut() + Send + 'static) -> Self {
        self.on_sweep = Some(Box::new(hook));
        self
    }

    /// One pass: drain expired leases and takeovers, batch by batch, then
    /// report the gauge. Stops between batches once `cancel` fires.
    pub async fn sweep_once(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<SweepOutcome, StoreError> {
        let mut outcome = SweepOutcome::default();
        let backend = self.store.backend_id();
        for takeovers in [false, true] {
            loop {
                if cancel.is_cancelled() {
                    outcome.interrupted = true;
                    return Ok(outcome);
                }
                let events = &mut self.events;
                let mut report = |leases: &[ExpiredLease]| events.lease_expired(backend, leases);
                let n = if takeovers {
                    self.store.drain_takeovers(BATCH_SIZE, &mut report).await?
                } else {
                    self.store.reap_expired(BATCH_SIZE, &mut report).await?
                };
                if n == 0 {
                    break;
                }
                outcome.batches += 1;
                if takeovers {
                    outcome.taken_over += n as u64;
                } else {
                    outcome.swept += n as u64;
                }
                self.metrics.lease_expired(backend, n as u64);
                // A long drain must not hold committed counts until it ends
                // (a crash would lose them): send them with their batch.
                self.metrics.flush().await;
                if n < BATCH_SIZE {
                    break;
                }
            }
        }
        // The store's count is shared by the fleet and at most its documented
        // age (PgLockStore: 10 s): one cheap read per sweep, one recount per
        // interval for all replicas together.
        let held = self.store.held_count().await?;
        self.metrics.held_current(backend, held.max(0) as u64);
        outcome.held = Some(held);
        Ok(outcome)
    }

    /// Sweeps every `SWEEP_DELAY` until `shutdown` fires, then finishes (or,
    /// after `DRAIN_GRACE`, abandons) the batch in flight and flushes metrics.
    pub async fn run(mut self, shutdown: CancellationToken) {
        info!(
            backend = self.store.backend_id(),
            delayMillis = SWEEP_DELAY.as_millis() as u64,
            batchSize = BATCH_SIZE,
            jobs = self.jobs.is_some(),
            "sweeper_started"
        );
        loop {
            let abandon = async {
                shutdown.cancelled().await;
                tokio::time::sleep(DRAIN_GRACE).await;
            };
            tokio::select! {
                () = self.sweep_all(&shutdown) => {}
                () = abandon => {
                    warn!(graceMillis = DRAIN_GRACE.as_millis() as u64, "sweep_abandoned_at_shutdown");
                    break;
                }
            }
            self.metrics.flush().await;
            if let Some(hook) = self.on_sweep.as_mut() {
                hook();
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(SWEEP_DELAY) => {}
            }
        }
        self.metrics.flush().await;
        info!("sweeper_stopped");
    }

    /// The lock sweep, then the job reaper, each logging its own errors; a
    /// failure of one does not skip the other.
    async fn sweep_all(&mut self, cancel: &CancellationToken) {
        match self.sweep_once(cancel).await {
            Ok(outcome) => {
                self.lock_errors.succeeded();
                debug!(
                    swept = outcome.swept,
                    takenOver = outcome.taken_over,
                    batches = outcome.batches,
                    held = outcome.held.unwrap_or(-1),
                    "sweep_done"
                );
            }
            Err(e) => self.lock_errors.failed(&e),
        }
        if let Some(jobs) = self.jobs.as_mut() {
            if cancel.is_cancelled() {
                return;
            }
            match jobs
                .reap_once(&mut self.events, &self.metrics, cancel)
                .await
            {
                Ok(_) => self.job_errors.succeeded(),
                Err(e) => self.job_errors.failed(&e),
            }
        }
    }
}

/// Logs a persistent error once, again every `ERROR_REPEAT`, and once more
/// when it clears: a database that is down must not flood the log.
struct ErrorLog {
    /// `sweep` or `job_reap`: the events are `<what>_failed` / `<what>_recovered`.
    what: &'static str,
    current: Option<String>,
    since: Option<Instant>,
    last_logged: Option<Instant>,
    failures: u64,
}

impl ErrorLog {
    fn new(what: &'static str) -> Self {
        Self {
            what,
            current: None,
            since: None,
            last_logged: None,
            failures: 0,
        }
    }

    fn failed(&mut self, err: &StoreError) {
        let message = err.to_string();
        let now = Instant::now();
        self.failures += 1;
        let changed = self.current.as_deref() != Some(message.as_str());
        let due = self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= ERROR_REPEAT);
        if changed || due {
            error!(error = %message, failedSweeps = self.failures, "{}_failed", self.what);
            self.last_logged = Some(now);
        }
        if self.since.is_none() {
            self.since = Some(now);
        }
        self.current = Some(message);
    }

    fn succeeded(&mut self) {
        if self.current.take().is_some() {
            let down = self
                .since
                .map(|t| t.elapsed().as_millis() as u64)
                .unwrap_or(0);
            info!(
                failedSweeps = self.failures,
                downMillis = down,
                "{}_recovered",
                self.what
            );
        }
        *self = Self::new(self.what);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::config::StatsdTarget;
    use crate::store::ReapedBy;

    /// What the stub's next `reap_expired` call does.
    enum Step {
        Reap(usize),
        Fail,
        /// Reap this many, then fire the token (a signal arriving mid-drain).
        ReapThenCancel(usize, CancellationToken),
    }

    #[derive(Clone, Default)]
    struct Stub {
        script: Arc<Mutex<VecDeque<Step>>>,
        reap_calls: Arc<Mutex<u32>>,
    }

    impl Stub {
        fn new(steps: Vec<Step>) -> Self {
            Self {
                script: Arc::new(Mutex::new(steps.into())),
                reap_calls: Arc::default(),
            }
        }
        fn calls(&self) -> u32 {
            *self.reap_calls.lock().unwrap()
        }
    }

    fn leases(n: usize) -> Vec<ExpiredLease> {
        (0..n)
            .map(|i| ExpiredLease {
                lock_key: format!("k{i}"),
                owner_id: "o".into(),
                token: i as i64,
                expired_at_millis: 0,
                overdue_millis: 5,
                reaped_by: ReapedBy::Sweep,
            })
            .collect()
    }

    impl LockStore for Stub {
        fn backend_id(&self) -> &'static str {
            "stub"
        }

        async fn reap_expired(
            &mut self,
            limit: usize,
            report: &mut (dyn FnMut(&[ExpiredLease]) -> std::io::Result<()> + Send),
        ) -> Result<usize, StoreError> {
            *self.reap_calls.lock().unwrap() += 1;
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
                        query: "reap_expired",
                        cause: "boom".into(),
                    });
                }
                Step::ReapThenCancel(n, token) => {
                    token.cancel();
                    n
                }
            };
            assert!(n <= limit);
            report(&leases(n)).map_err(StoreError::Report)?;
            Ok(n)
        }

        async fn drain_takeovers(
            &mut self,
            _limit: usize,
            _report: &mut (dyn FnMut(&[ExpiredLease]) -> std::io::Result<()> + Send),
        ) -> Result<usize, StoreError> {
            Ok(0)
        }

        async fn held_count(&mut self) -> Result<i64, StoreError> {
            Ok(3)
        }
    }

    fn sweeper(stub: &Stub) -> (Sweeper<Stub>, crate::events::MemoryLog) {
        let (log, lines) = EventLog::in_memory();
        // Port 9 (discard) on loopback: metrics are not what these tests check.
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        (Sweeper::new(stub.clone(), log, metrics), lines)
    }

    #[tokio::test]
    async fn full_batches_are_followed_by_more_until_a_short_one() {
        let stub = Stub::new(vec![
            Step::Reap(BATCH_SIZE),
            Step::Reap(BATCH_SIZE),
            Step::Reap(3),
            Step::Reap(99),
        ]);
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(outcome.swept, 2 * BATCH_SIZE as u64 + 3);
        assert_eq!(outcome.batches, 3);
        assert_eq!(outcome.held, Some(3));
        assert_eq!(stub.calls(), 3, "a short batch ends the drain");
        assert_eq!(lines.lines().len(), 2 * BATCH_SIZE + 3);
    }

    #[tokio::test]
    async fn a_shutdown_mid_drain_stops_between_batches() {
        let token = CancellationToken::new();
        let stub = Stub::new(vec![
            Step::ReapThenCancel(BATCH_SIZE, token.clone()),
            Step::Reap(BATCH_SIZE),
        ]);
        let (mut sweeper, lines) = sweeper(&stub);

        let outcome = sweeper.sweep_once(&token).await.unwrap();

        assert!(outcome.interrupted);
        assert_eq!((outcome.swept, stub.calls()), (BATCH_SIZE as u64, 1));
        assert_eq!(
            lines.lines().len(),
            BATCH_SIZE,
            "the finished batch was reported"
        );
    }

    #[tokio::test]
    async fn a_failing_store_fails_the_sweep_but_not_the_loop() {
        let stub = Stub::new(vec![Step::Fail, Step::Reap(2)]);
        let (sweeper, lines) = sweeper(&stub);
        let token = CancellationToken::new();
        let task = tokio::spawn(sweeper.run(token.clone()));

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

        assert!(stub.calls() >= 2);
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
            Sweeper::new(stub.clone(), EventLog::to_writer(Box::new(Broken)), metrics);

        let err = sweeper
            .sweep_once(&CancellationToken::new())
            .await
            .unwrap_err();

        assert!(matches!(err, StoreError::Report(_)), "{err}");
    }
}
