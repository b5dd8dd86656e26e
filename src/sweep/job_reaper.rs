//! The job reaper: a pass reports abandoned hand-offs, then returns stale
//! job leases to the queue (or the dead-letter table) batch by batch while
//! the gates allow, and sets the stale-lease gauge. Owns logging a change of
//! the gates' answer once, and what an action's `job_lease_expired` line,
//! lateness and counts are (`Reaped` for `JobAction`). Not the reaping rules
//! (SQL, behind a `JobQueue`), writing and sending a batch
//! (`sweep::report`), timing or error logging (`sweep::run`), nor the CLI
//! (`cmd::jobs`).

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::model::{ACTION_DEAD_LETTER, ACTION_RESET, JobAction};
use crate::output::events::EventLog;
use crate::output::metrics::{Lateness, Metrics};
use crate::store::{ApplyBatch, Gates, JobQueue, StoreError};
use crate::sweep::report::{LineReporter, Reaped};
use crate::sweep::{Drain, FailedPasses, SWEEP_DELAY, Service};

/// Most stale jobs one apply transaction handles. It holds their row locks
/// until it commits (a worker's heartbeat or completion of one of them
/// waits for that commit, which comes before the lines are written) and
/// carries one action each in its report, so a worker waits on one short
/// transaction at most and a report stays bounded. A pass runs batch after
/// batch until a short one (`Drain`), so the limit bounds that wait, never
/// how much one pass reaps. docs/performance.md has the figures behind the
/// choice.
pub const JOB_BATCH_SIZE: usize = 1_000;

/// The event name of the per-action WARN line.
pub const JOB_LEASE_EXPIRED: &str = "job_lease_expired";

/// What one reaper pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReapOutcome {
    pub reset: u64,
    pub dead_lettered: u64,
    /// Stale leases left after the pass (the gauge's value).
    pub stale: u64,
    /// Why apply was refused, when it was.
    pub refused: Option<String>,
    /// The pass stopped early because shutdown was requested.
    pub interrupted: bool,
}

/// The gates' answer as last logged, so a change is logged once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GateState {
    /// Nothing read yet (start, or only failures so far).
    Unknown,
    Refused(String),
    Armed,
}

/// The job-lease service.
pub struct JobReaper<Q: JobQueue> {
    queue: Q,
    events: EventLog,
    metrics: Metrics,
    actor: String,
    gate: GateState,
}

impl<Q: JobQueue> JobReaper<Q> {
    /// `actor` is recorded on every dead letter and in apply's report; the
    /// daemon uses `lease-sweeper@<hostname>`.
    pub fn new(queue: Q, events: EventLog, metrics: Metrics, actor: String) -> Self {
        // Both actions' counters exist from the first scrape, at zero.
        for action in [ACTION_RESET, ACTION_DEAD_LETTER] {
            metrics.job_lease_reaped(queue.backend_id(), action, 0);
        }
        Self {
            queue,
            events,
            metrics,
            actor,
            gate: GateState::Unknown,
        }
    }

    /// One pass: if the gates allow, reap batch by batch until a short batch
    /// (or until `cancel` fires, checked between batches); then report the
    /// stale-lease gauge. An error ends the pass: a batch in flight is rolled
    /// back (its jobs, still stale, are reaped by a later pass) or, once
    /// handed off, stays recorded (its lines are written by a later pass). A
    /// batch a reaper handed off but did not report (it died, or its output
    /// failed) is reported first, whatever the gates say now: its jobs were
    /// reaped while they allowed it.
    pub async fn reap_once(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<ReapOutcome, StoreError> {
        let mut outcome = ReapOutcome::default();
        // One statement when the gates refuse: their reason and the gauge.
        let start = self.queue.gates().await?;
        if start.abandoned {
            self.recover(&mut outcome).await?;
        }
        let (mut refusal, stale) = match start.gates {
            Gates::Allow => (None, None),
            Gates::Refuse { reason, stale } => (Some(reason), Some(stale)),
        };
        let backend = self.queue.backend_id();
        let mut drain = Drain::new(JOB_BATCH_SIZE);
        while refusal.is_none() && drain.go_on(cancel) {
            self.note_gate(None);
            let mut report =
                LineReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
            match self
                .queue
                .apply_batch(&self.actor, JOB_BATCH_SIZE, &mut report)
                .await?
            {
                ApplyBatch::Refused(reason) => {
                    // Closed since they were read: the gauge is read below.
                    refusal = Some(reason);
                    drain.stop();
                }
                ApplyBatch::Applied { n } => drain.took(n),
            }
        }
        if drain.interrupted {
            outcome.interrupted = true;
            return Ok(outcome);
        }
        if let Some(reason) = &refusal {
            self.note_gate(Some(reason));
        }
        outcome.refused = refusal;
        outcome.stale = match stale {
            Some(stale) => stale,
            None => self.queue.stale_count().await?,
        };
        self.metrics.stale_jobs_current(backend, outcome.stale);
        Ok(outcome)
    }

    /// Reports every abandoned hand-off, one transaction each.
    async fn recover(&mut self, outcome: &mut ReapOutcome) -> Result<(), StoreError> {
        let backend = self.queue.backend_id();
        loop {
            let mut report = LineReporter::new(&mut self.events, &self.metrics, backend, outcome);
            if self.queue.recover(&mut report).await? == 0 {
                return Ok(());
            }
        }
    }

    /// Logs the gates' answer when it differs from the last one logged.
    fn note_gate(&mut self, refusal: Option<&str>) {
        let state = match refusal {
            Some(reason) => GateState::Refused(reason.to_owned()),
            None => GateState::Armed,
        };
        if self.gate == state {
            return;
        }
        match &state {
            GateState::Refused(reason) => {
                info!(reason = %reason, actor = %self.actor, "job_reaper_gated");
            }
            GateState::Armed => {
                info!(actor = %self.actor, batchSize = JOB_BATCH_SIZE, "job_reaper_armed");
            }
            GateState::Unknown => {}
        }
        self.gate = state;
    }
}

/// A job action's line, lateness and counts, for the reaper's
/// `LineReporter` (applied or recovered alike).
impl Reaped for JobAction {
    type Tag = &'static str;
    type Outcome = ReapOutcome;

    fn write(
        events: &mut EventLog,
        backend: &'static str,
        actions: &[Self],
    ) -> std::io::Result<()> {
        events.warn_lines(
            JOB_LEASE_EXPIRED,
            actions.iter().map(|a| line_fields(a, backend)),
        )
    }

    fn gather(actions: &[Self], lateness: &mut Lateness<&'static str>, batch: &mut ReapOutcome) {
        lateness.add_jobs(actions);
        for a in actions {
            if a.action == ACTION_DEAD_LETTER {
                batch.dead_lettered += 1;
            } else {
                batch.reset += 1;
            }
        }
    }

    fn send(
        metrics: &Metrics,
        backend: &'static str,
        lateness: &mut Lateness<&'static str>,
        batch: &ReapOutcome,
    ) {
        metrics.job_lease_overdue(backend, lateness);
        metrics.job_lease_reaped(backend, ACTION_RESET, batch.reset);
        metrics.job_lease_reaped(backend, ACTION_DEAD_LETTER, batch.dead_lettered);
    }

    fn add(pass: &mut ReapOutcome, batch: &ReapOutcome) {
        pass.reset += batch.reset;
        pass.dead_lettered += batch.dead_lettered;
    }
}

impl<Q: JobQueue> Service for JobReaper<Q> {
    type Outcome = ReapOutcome;
    const SERVICE: &'static str = "job_reaper";
    const NAME: &'static str = "job_reaper";
    const WORK: &'static str = "job_reap";
    const FAILED_PASSES: FailedPasses = FailedPasses::Reaps;

    fn log_started(&self) {
        info!(
            actor = %self.actor,
            delayMillis = SWEEP_DELAY.as_millis() as u64,
            batchSize = JOB_BATCH_SIZE,
            "job_reaper_started"
        );
    }

    fn log_done(outcome: &ReapOutcome) {
        tracing::debug!(
            reset = outcome.reset,
            deadLettered = outcome.dead_lettered,
            stale = outcome.stale,
            refused = outcome.refused.as_deref(),
            interrupted = outcome.interrupted,
            "job_reap_done"
        );
    }

    async fn pass(&mut self, cancel: &CancellationToken) -> Result<ReapOutcome, StoreError> {
        self.reap_once(cancel).await
    }
}

/// The fields of one `job_lease_expired` line, in a fixed order. `jobId` +
/// `attempts` is the dedupe key: after a crash between writing and
/// committing, the same pair can be reported again by the next pass, while
/// one job expiring on two attempts is two events.
fn line_fields(a: &JobAction, backend: &str) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("jobId", a.job_id.clone()),
        ("jobKind", a.job_kind.clone()),
        ("leaseOwner", a.lease_owner.clone().unwrap_or_default()),
        ("attempts", a.attempts.to_string()),
        ("maxAttempts", a.max_attempts.to_string()),
        ("overdueMillis", a.overdue_millis.to_string()),
        ("action", a.action.clone()),
    ];
    if let Some(backoff) = a.backoff_sec {
        pairs.push(("backoffSec", backoff.to_string()));
    }
    if let Some(dead) = &a.dead_letter {
        pairs.push(("deadLetterId", dead.dead_letter_id.clone()));
    }
    pairs.push(("backend", backend.to_owned()));
    pairs
}

#[cfg(test)]
mod tests;
