//! The maintenance services (`lock_sweeper`, `job_reaper`, `horizon_check`)
//! and the one loop, `run`, that runs each as its own future, so no pass
//! waits for another service's (the lock sweeper is on a connection of its
//! own; the job reaper and the horizon check take turns on theirs, one
//! statement at a time). A service does one pass; `run` owns time (the
//! delay, shutdown, the drain grace), failure lines, health metrics, StatsD
//! flushes and `progress`; `Drain` is the batch-by-batch rule, and
//! `report::LineReporter` writes a batch's lines and counts them at its
//! commit. No SQL (`store`'s seams), no signals (`shutdown`), no systemd
//! (`notify`).

pub mod horizon_check;
pub mod job_reaper;
pub mod lock_sweeper;
pub mod report;

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::output::metrics::Metrics;
use crate::progress::Beat;
use crate::store::StoreError;

/// Pause between the end of one pass and the start of the next. A fixed
/// delay, not a rate: passes of one service never overlap. One second keeps
/// `overdueMillis` meaningful for the shortest lease the lock server grants
/// (it must be at most a quarter of the shortest TTL).
pub const SWEEP_DELAY: Duration = Duration::from_secs(1);

/// After a shutdown signal, how long a pass in flight may take to finish its
/// batch before it is abandoned (its open transaction then rolls back; what
/// it had already committed stays recorded, so its rows are reported by a
/// later pass: at least once).
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// While the same error persists, it is logged again at most this often.
pub const ERROR_REPEAT: Duration = Duration::from_secs(60);

/// One maintenance service: a pass, and the names its loop logs under.
///
/// A service has one name in the code, `SERVICE` (its module and type say
/// the same). `NAME` and `WORK` are the prefixes of its events as they
/// shipped, and log queries read them: the lock sweeper's lifecycle events
/// say `sweeper` and its failures `sweep`.
pub trait Service: Send {
    /// What a pass did; logged at DEBUG by the loop (`log_done`).
    type Outcome: Debug + Send;

    /// The service's name, and the `service` label of its health series
    /// (`lock_sweeper`, `job_reaper`, `horizon_check`).
    const SERVICE: &'static str;
    /// Its lifecycle events: `<name>_started`, `<name>_stopped`.
    const NAME: &'static str;
    /// Its failure events: `<work>_failed`, `<work>_recovered`,
    /// `<work>_abandoned_at_shutdown`.
    const WORK: &'static str;
    /// The field of its failure events that counts its failed passes.
    const FAILED_PASSES: FailedPasses;
    /// The pause between its passes; `SWEEP_DELAY` unless the service says
    /// otherwise (the horizon check: `horizon_check::HORIZON_DELAY`).
    const DELAY: Duration = SWEEP_DELAY;

    /// Logs the service's settings once, when its loop starts.
    fn log_started(&self);

    /// Logs what a pass did at DEBUG as `<work>_done` with one logfmt field
    /// per count, so a log query can read them without parsing a Rust value.
    fn log_done(outcome: &Self::Outcome);

    /// One pass. Stops between batches once `cancel` fires.
    fn pass(
        &mut self,
        cancel: &CancellationToken,
    ) -> impl Future<Output = Result<Self::Outcome, StoreError>> + Send;
}

/// Runs `service` pass after pass, `S::DELAY` (`SWEEP_DELAY` by default)
/// between the end of one and the start of the next, until `shutdown`
/// fires; then lets the pass in flight finish (or, after `DRAIN_GRACE`,
/// abandons it) and flushes `metrics`. `beat` is told after every pass,
/// failed or not.
pub async fn run<S: Service>(
    mut service: S,
    metrics: Metrics,
    beat: Beat,
    shutdown: CancellationToken,
) {
    service.log_started();
    metrics.service_started(S::SERVICE);
    let mut errors = ErrorLog::new(S::WORK, S::FAILED_PASSES);
    loop {
        let abandon = async {
            shutdown.cancelled().await;
            tokio::time::sleep(DRAIN_GRACE).await;
        };
        let started = Instant::now();
        tokio::select! {
            result = service.pass(&shutdown) => match result {
                Ok(outcome) => {
                    metrics.pass_finished(S::SERVICE, true, started.elapsed());
                    errors.succeeded();
                    S::log_done(&outcome);
                }
                Err(e) => {
                    metrics.pass_finished(S::SERVICE, false, started.elapsed());
                    errors.failed(&e);
                }
            },
            () = abandon => {
                warn!(
                    graceMillis = DRAIN_GRACE.as_millis() as u64,
                    "{}_abandoned_at_shutdown",
                    S::WORK
                );
                break;
            }
        }
        metrics.flush();
        beat.beat();
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(S::DELAY) => {}
        }
    }
    metrics.flush();
    info!("{}_stopped", S::NAME);
}

/// The rule for a pass that drains batch by batch: go on while batches come
/// back full and no shutdown was asked for, so one pass drains any backlog
/// while no transaction holds more than one batch. A pure decision: the
/// service does the I/O and tells it what each batch took.
#[derive(Debug)]
pub struct Drain {
    /// What each batch asks for: one that takes less leaves nothing behind
    /// it, so the drain ends there.
    limit: usize,
    /// Whether the last batch said more may wait (it came back full).
    more: bool,
    /// Batches that took something, for the pass's outcome.
    pub batches: u64,
    /// The drain stopped early because shutdown was requested: the pass
    /// ends there, leaving what is after it (a gauge) to the next pass.
    pub interrupted: bool,
}

impl Drain {
    /// A drain whose batches ask for `limit` rows each.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            more: true,
            batches: 0,
            interrupted: false,
        }
    }

    /// Whether to run another batch.
    pub fn go_on(&mut self, cancel: &CancellationToken) -> bool {
        if self.more && cancel.is_cancelled() {
            self.interrupted = true;
            self.more = false;
        }
        self.more
    }

    /// A batch handled `n` rows; a short one (below the limit) ends the
    /// drain.
    pub fn took(&mut self, n: usize) {
        self.batches += u64::from(n > 0);
        self.more = n >= self.limit;
    }

    /// The batches stop here whatever came back (a refusal).
    pub fn stop(&mut self) {
        self.more = false;
    }
}

/// The field of a service's `<work>_failed` and `<work>_recovered` lines
/// that counts its failed passes, named for its pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedPasses {
    /// `failedSweeps`: the lock sweeper's.
    Sweeps,
    /// `failedReaps`: the job reaper's.
    Reaps,
    /// `failedChecks`: the horizon check's.
    Checks,
}

/// Logs a persistent error once, again every `ERROR_REPEAT`, and once more
/// when it clears: a database that is down must not flood the log.
struct ErrorLog {
    /// The events are `<work>_failed` / `<work>_recovered`.
    work: &'static str,
    passes: FailedPasses,
    current: Option<String>,
    since: Option<Instant>,
    last_logged: Option<Instant>,
    failures: u64,
}

impl ErrorLog {
    fn new(work: &'static str, passes: FailedPasses) -> Self {
        Self {
            work,
            passes,
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
            let (work, n) = (self.work, self.failures);
            // A field's name is fixed where it is logged: one line per name.
            match self.passes {
                FailedPasses::Sweeps => {
                    error!(error = %message, failedSweeps = n, "{}_failed", work);
                }
                FailedPasses::Reaps => error!(error = %message, failedReaps = n, "{}_failed", work),
                FailedPasses::Checks => {
                    error!(error = %message, failedChecks = n, "{}_failed", work);
                }
            }
            self.last_logged = Some(now);
        }
        self.since.get_or_insert(now);
        self.current = Some(message);
    }

    fn succeeded(&mut self) {
        if self.current.take().is_some() {
            let down = self
                .since
                .map(|t| t.elapsed().as_millis() as u64)
                .unwrap_or(0);
            let (work, n) = (self.work, self.failures);
            match self.passes {
                FailedPasses::Sweeps => {
                    info!(failedSweeps = n, downMillis = down, "{}_recovered", work);
                }
                FailedPasses::Reaps => {
                    info!(failedReaps = n, downMillis = down, "{}_recovered", work);
                }
                FailedPasses::Checks => {
                    info!(failedChecks = n, downMillis = down, "{}_recovered", work);
                }
            }
        }
        *self = Self::new(self.work, self.passes);
    }
}

#[cfg(test)]
mod test_log;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Work;

    fn down() -> StoreError {
        StoreError::Query {
            work: Work::JobQueue,
            query: "q",
            cause: "down".into(),
            source: None,
        }
    }

    #[test]
    fn failure_lines_count_the_passes_by_their_own_name() {
        for (passes, field) in [
            (FailedPasses::Sweeps, "failedSweeps"),
            (FailedPasses::Reaps, "failedReaps"),
            (FailedPasses::Checks, "failedChecks"),
        ] {
            let log = test_log::capture();
            let mut errors = ErrorLog::new("pass", passes);

            for _ in 0..3 {
                errors.failed(&down());
            }
            errors.succeeded();

            let failed = log.events("pass_failed");
            assert_eq!(failed.len(), 1, "a persistent error is logged once");
            assert_eq!(failed[0][field], "1");
            let recovered = log.events("pass_recovered");
            assert_eq!(recovered.len(), 1);
            assert_eq!(recovered[0][field], "3");
            let others = ["failedSweeps", "failedReaps", "failedChecks"];
            for other in others.into_iter().filter(|o| *o != field) {
                assert!(!failed[0].contains_key(other) && !recovered[0].contains_key(other));
            }
        }
    }

    #[test]
    fn a_drain_goes_on_while_batches_come_back_full() {
        let mut drain = Drain::new(10);
        let go = CancellationToken::new();
        assert!(drain.go_on(&go), "the first batch always runs");
        drain.took(10);
        assert!(drain.go_on(&go), "a full batch: more may wait");
        drain.took(9);
        assert!(!drain.go_on(&go), "a short batch ends it");
        assert_eq!((drain.batches, drain.interrupted), (2, false));
    }

    #[test]
    fn a_shutdown_ends_a_drain_between_batches() {
        let mut drain = Drain::new(10);
        let stop = CancellationToken::new();
        drain.took(10);
        stop.cancel();
        assert!(!drain.go_on(&stop));
        assert!(drain.interrupted);
        let mut done = Drain::new(10);
        done.took(3);
        assert!(!done.go_on(&stop));
        assert!(
            !done.interrupted,
            "a drain already over was not interrupted"
        );
    }
}
