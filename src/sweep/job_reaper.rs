//! The job reaper: one pass returns stale job leases to the queue (or the
//! dead-letter table) while the three gates allow it, and reports the
//! stale-lease gauge, `queue.lease.stale.current`.
//!
//! Owns, once per pass: asking whether the gates allow reaping, logging a
//! change of that answer once at INFO (never once per pass), applying batch
//! by batch while they do, one WARN `job_lease_expired` line per action
//! written before its batch's hand-off is gone (the jobs' row locks end
//! before the lines are written), reporting a hand-off another reaper left,
//! `queue.lease.reaped` counts flushed with each batch, and the
//! `queue.lease.stale.current` gauge. Timing, shutdown
//! and error logging are `sweep::run`'s; it runs in its own loop on its own
//! connection, so it never holds up the lock sweeper.
//!
//! It does not own the reaping rules (backoff, dead-lettering, the gate order
//! and the stale predicate all live in SQL, `migrations/`), the statements
//! (`pg::job_queue`), nor the CLI (`cmd::jobs`).

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::model::{ACTION_DEAD_LETTER, ACTION_RESET, JobAction};
use crate::output::events::EventLog;
use crate::output::metrics::Metrics;
use crate::pg::job_queue::{ApplyBatch, Gates, PgJobQueue};
use crate::store::StoreError;
use crate::sweep::{Drain, Outcome, SWEEP_DELAY, Service};

/// Most stale jobs one apply transaction handles. The apply holds its rows
/// for its statement, about 50 µs of server CPU a job (docs/performance.md),
/// and shares the machine with the workers while a backlog drains: 1,000
/// keeps a statement near 50 ms. Larger batches drain faster (100,000 stale
/// jobs took 3.3 s in batches of 10,000 against 4.6-4.9 s in batches of
/// 1,000 on an idle database, each batch's scan of the stale index stepping
/// over the entries earlier batches left); the pass loops until a short
/// batch, so a backlog still drains in one pass.
pub const JOB_BATCH_SIZE: i32 = 1_000;

/// The `backend` tag: the job queue lives only in PostgreSQL.
pub const BACKEND: &str = "pg";

/// The event name of the per-action WARN line.
pub const JOB_LEASE_EXPIRED: &str = "job_lease_expired";

/// What one reaper pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    pub reset: u64,
    pub dead_lettered: u64,
    /// Stale leases left after the pass (the gauge's value).
    pub stale: u64,
    /// Why apply was refused, when it was.
    pub refused: Option<String>,
    /// The pass stopped early because shutdown was requested.
    pub interrupted: bool,
}

impl Outcome for JobOutcome {
    fn log_done(&self) {
        tracing::debug!(
            reset = self.reset,
            deadLettered = self.dead_lettered,
            stale = self.stale,
            refused = self.refused.as_deref(),
            interrupted = self.interrupted,
            "job_reap_done"
        );
    }
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
pub struct JobReaper {
    queue: PgJobQueue,
    events: EventLog,
    metrics: Metrics,
    actor: String,
    gate: GateState,
}

impl JobReaper {
    /// `actor` is recorded on every dead letter and in apply's report; the
    /// daemon uses `lease-sweeper@<hostname>`.
    pub fn new(queue: PgJobQueue, events: EventLog, metrics: Metrics, actor: String) -> Self {
        // Both actions' counters exist from the first scrape, at zero.
        for action in [ACTION_RESET, ACTION_DEAD_LETTER] {
            metrics.job_lease_reaped(BACKEND, action, 0);
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
    /// stale-lease gauge. An error leaves the batch in flight recorded (its
    /// jobs are reaped, and their lines written, by a later pass). A batch a
    /// reaper handed off but did not report (it died, or its output failed)
    /// is reported first, whatever the gates say now: its jobs were reaped
    /// while they allowed it.
    pub async fn reap_once(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<JobOutcome, StoreError> {
        let mut outcome = JobOutcome::default();
        // One statement when the gates refuse: their reason and the gauge.
        let start = self.queue.gates().await?;
        if start.abandoned {
            self.recover(&mut outcome).await?;
        }
        let (mut refusal, stale) = match start.gates {
            Gates::Allow => (None, None),
            Gates::Refuse { reason, stale } => (Some(reason), Some(stale)),
        };
        let mut drain = Drain::new(JOB_BATCH_SIZE as usize);
        while refusal.is_none() && drain.go_on(cancel) {
            self.note_gate(None);
            let (events, metrics) = (&mut self.events, &self.metrics);
            let mut report = |actions: &[JobAction]| {
                events
                    .warn_lines(JOB_LEASE_EXPIRED, actions.iter().map(line_fields))
                    .inspect(|()| metrics.job_lease_overdue(BACKEND, actions))
            };
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
                ApplyBatch::Applied(report) => {
                    drain.took(report.actions.len());
                    self.metrics
                        .job_lease_reaped(BACKEND, ACTION_RESET, report.reset_count);
                    self.metrics.job_lease_reaped(
                        BACKEND,
                        ACTION_DEAD_LETTER,
                        report.dead_letter_count,
                    );
                    self.metrics.flush().await;
                    outcome.reset += report.reset_count;
                    outcome.dead_lettered += report.dead_letter_count;
                }
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
        self.metrics.stale_jobs_current(BACKEND, outcome.stale);
        Ok(outcome)
    }

    /// Reports every abandoned hand-off, one transaction each, counting its
    /// actions as they are written.
    async fn recover(&mut self, outcome: &mut JobOutcome) -> Result<(), StoreError> {
        loop {
            let (mut reset, mut dead) = (0, 0);
            let (events, metrics) = (&mut self.events, &self.metrics);
            let mut report = |actions: &[JobAction]| {
                events.warn_lines(JOB_LEASE_EXPIRED, actions.iter().map(line_fields))?;
                metrics.job_lease_overdue(BACKEND, actions);
                for a in actions {
                    if a.action == ACTION_DEAD_LETTER {
                        dead += 1;
                    } else {
                        reset += 1;
                    }
                }
                Ok(())
            };
            if self.queue.recover(&mut report).await? == 0 {
                return Ok(());
            }
            self.metrics.job_lease_reaped(BACKEND, ACTION_RESET, reset);
            self.metrics
                .job_lease_reaped(BACKEND, ACTION_DEAD_LETTER, dead);
            self.metrics.flush().await;
            outcome.reset += reset;
            outcome.dead_lettered += dead;
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

impl Service for JobReaper {
    type Outcome = JobOutcome;
    const NAME: &'static str = "job_reaper";
    const WORK: &'static str = "job_reap";
    const SERVICE: &'static str = "job_reaper";

    fn log_started(&self) {
        info!(
            actor = %self.actor,
            delayMillis = SWEEP_DELAY.as_millis() as u64,
            batchSize = JOB_BATCH_SIZE,
            "job_reaper_started"
        );
    }

    async fn pass(&mut self, cancel: &CancellationToken) -> Result<JobOutcome, StoreError> {
        self.reap_once(cancel).await
    }
}

/// The fields of one `job_lease_expired` line, in a fixed order. `jobId` +
/// `attempts` is the dedupe key: after a crash between writing and
/// committing, the same pair can be reported again by the next pass, while
/// one job expiring on two attempts is two events.
fn line_fields(a: &JobAction) -> Vec<(&'static str, String)> {
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
    pairs.push(("backend", BACKEND.to_owned()));
    pairs
}
