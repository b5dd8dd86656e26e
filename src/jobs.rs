//! The job-queue stale-lease reaper as the daemon runs it (SPEC §4).
//!
//! Owns, once per sweep: reading whether the three gates allow reaping,
//! logging a change of that answer once at INFO (never once per sweep),
//! calling `fn_job_reap_stale_leases_apply` batch by batch while they do,
//! turning each action into one WARN `job_lease_expired` line written and
//! flushed before the batch commits, counting `queue.lease.reaped`, and the
//! `queue.lease.stale.current` gauge from the dry run. It also owns the Rust
//! shapes of the functions' JSON.
//!
//! It does not own the reaping rules (backoff, dead-lettering, the gate order
//! and the stale predicate all live in SQL, `migrations/`), the statements
//! (`queries::jobs`), the loop or error logging (`sweeper`), nor the CLI
//! (`jobs_cli`).

use serde::Deserialize;
use sqlx::{Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::DbTarget;
use crate::db::{BatchFailure, Db};
use crate::events::EventLog;
use crate::metrics::Metrics;
use crate::queries::jobs as q;
use crate::store::StoreError;

/// Most stale jobs one apply transaction handles: apply's own maximum.
/// Measured (docs/performance.md): 100,000 stale jobs took 4.6-4.9 s in
/// batches of 1,000 against 3.3 s in batches of 10,000, because each batch's
/// scan of the stale index steps over the entries earlier batches left. A
/// 10,000 batch holds its row locks for about 0.3 s and buffers about 3 MB of
/// lines before its commit; the sweep loops until a short batch, so a backlog
/// still drains in one sweep.
pub const JOB_BATCH_SIZE: i32 = 10_000;

/// The `backend` tag: the job queue lives only in PostgreSQL.
pub const BACKEND: &str = "pg";

/// The event name of the per-action WARN line.
pub const JOB_LEASE_EXPIRED: &str = "job_lease_expired";

/// Apply's action for a job returned to `retry_waiting`.
pub const ACTION_RESET: &str = "reset_to_retry_waiting";
/// Apply's action for a job moved to the dead-letter table.
pub const ACTION_DEAD_LETTER: &str = "moved_to_dead_letter";

/// The dry run is asked for one job only: the daemon needs its
/// `stale_lease_count`, which counts every stale lease whatever the limit.
const GAUGE_DRY_RUN_LIMIT: i32 = 1;

/// `fn_job_reap_stale_leases_apply`'s answer: a refusal or a report.
#[derive(Debug, Clone, Deserialize)]
pub struct ApplyReport {
    pub refused: bool,
    /// Set on a refusal only.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub actor: Option<String>,
    #[serde(default)]
    pub reset_count: u64,
    #[serde(default)]
    pub dead_letter_count: u64,
    #[serde(default)]
    pub actions: Vec<JobAction>,
    /// Stale jobs apply could not reap (a row failing inside it): left as
    /// they are, each logged once at ERROR as `job_set_aside`. Absent when
    /// there were none.
    #[serde(default)]
    pub set_aside: Vec<SetAsideJob>,
}

/// A stale job apply set aside so the rest of its batch could be reaped.
#[derive(Debug, Clone, Deserialize)]
pub struct SetAsideJob {
    pub job_id: String,
    #[serde(default)]
    pub job_kind: Option<String>,
    #[serde(default)]
    pub lease_owner: Option<String>,
    /// The database's error, with its SQLSTATE.
    pub error: String,
}

/// One reaped job, as apply reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct JobAction {
    /// `reset_to_retry_waiting` or `moved_to_dead_letter`.
    pub action: String,
    pub job_id: String,
    /// Attempts after the bump.
    pub attempts: i64,
    pub job_kind: String,
    pub lease_owner: Option<String>,
    pub max_attempts: i64,
    /// How long past `lease_until` the lease was when reaped, by the
    /// database's clock.
    pub overdue_millis: i64,
    /// Resets only.
    #[serde(default)]
    pub backoff_sec: Option<i64>,
    /// Dead-letter moves only.
    #[serde(default)]
    pub dead_letter: Option<DeadLetter>,
}

/// The `dead_letter` object of a move.
#[derive(Debug, Clone, Deserialize)]
pub struct DeadLetter {
    pub dead_letter_id: String,
}

/// The part of the dry run the daemon reads.
#[derive(Debug, Clone, Deserialize)]
pub struct DryRunSummary {
    pub stale_lease_count: u64,
}

/// What one reaper pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    pub reset: u64,
    pub dead_lettered: u64,
    /// Stale leases left after the pass (the gauge's value).
    pub stale: u64,
    /// Why apply was refused, when it was.
    pub refused: Option<String>,
}

/// The gates' answer as last logged, so a change is logged once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GateState {
    /// Nothing read yet (start, or only failures so far).
    Unknown,
    Refused(String),
    Armed,
}

pub struct JobReaper {
    db: Db,
    actor: String,
    gate: GateState,
}

/// A batch's result when it did not fail.
enum Batch {
    Applied(ApplyReport),
    Refused(String),
}

impl JobReaper {
    /// `actor` is recorded on every dead letter and in apply's report; the
    /// daemon uses `lease-sweeper@<hostname>`.
    pub fn new(target: DbTarget, actor: String) -> Self {
        Self {
            db: Db::new(target),
            actor,
            gate: GateState::Unknown,
        }
    }

    /// One pass: if the gates allow, reap batch by batch until a short batch
    /// (or until `cancel` fires, checked between batches); then report the
    /// stale-lease gauge. Errors leave the batch in flight
    /// rolled back (its jobs are reaped, and their lines written, by a later
    /// pass).
    pub async fn reap_once(
        &mut self,
        events: &mut EventLog,
        metrics: &Metrics,
        cancel: &CancellationToken,
    ) -> Result<JobOutcome, StoreError> {
        let mut outcome = JobOutcome::default();
        let mut refusal = self.gate_refusal().await?;
        while refusal.is_none() {
            if cancel.is_cancelled() {
                // Shutdown: stop between batches, like the lock sweep.
                return Ok(outcome);
            }
            self.note_gate(None);
            match self.apply_batch(events).await? {
                Batch::Refused(reason) => refusal = Some(reason),
                Batch::Applied(report) => {
                    metrics.job_lease_reaped(BACKEND, ACTION_RESET, report.reset_count);
                    metrics.job_lease_reaped(BACKEND, ACTION_DEAD_LETTER, report.dead_letter_count);
                    metrics.flush().await;
                    outcome.reset += report.reset_count;
                    outcome.dead_lettered += report.dead_letter_count;
                    if report.actions.len() < JOB_BATCH_SIZE as usize {
                        break;
                    }
                }
            }
        }
        if let Some(reason) = &refusal {
            self.note_gate(Some(reason));
        }
        outcome.refused = refusal;
        outcome.stale = self.stale_count().await?;
        metrics.stale_jobs_current(BACKEND, outcome.stale);
        Ok(outcome)
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
                info!(
                    actor = %self.actor,
                    batchSize = JOB_BATCH_SIZE,
                    "job_reaper_armed"
                );
            }
            GateState::Unknown => {}
        }
        self.gate = state;
    }

    /// The gates' refusal reason, or `None` when they allow reaping.
    async fn gate_refusal(&mut self) -> Result<Option<String>, StoreError> {
        let conn = self.db.conn().await?;
        let json = match q::gate_refusal(conn).await {
            Ok(json) => json,
            Err(e) => return Err(self.db.query_failed("fn_job_reaper_gate_refusal", e)),
        };
        match json {
            None => Ok(None),
            Some(text) => match serde_json::from_str::<ApplyReport>(&text) {
                Ok(r) => Ok(Some(r.reason.unwrap_or_else(|| text.clone()))),
                Err(e) => Err(self.decode_failed("fn_job_reaper_gate_refusal", &e, &text)),
            },
        }
    }

    async fn stale_count(&mut self) -> Result<u64, StoreError> {
        let conn = self.db.conn().await?;
        let text = match q::dry_run(conn, GAUGE_DRY_RUN_LIMIT).await {
            Ok(text) => text,
            Err(e) => return Err(self.db.query_failed("fn_job_reap_stale_leases_dry_run", e)),
        };
        serde_json::from_str::<DryRunSummary>(&text)
            .map(|s| s.stale_lease_count)
            .map_err(|e| self.decode_failed("fn_job_reap_stale_leases_dry_run", &e, &text))
    }

    async fn apply_batch(&mut self, events: &mut EventLog) -> Result<Batch, StoreError> {
        let conn = self.db.conn().await?;
        apply_in_tx(conn, &self.actor, events)
            .await
            .map_err(|failure| self.db.batch_failed(failure))
    }

    fn decode_failed(
        &mut self,
        query: &'static str,
        err: &serde_json::Error,
        text: &str,
    ) -> StoreError {
        self.db.batch_failed(BatchFailure::Decode(
            query,
            format!("unexpected JSON ({err}): {text}"),
        ))
    }
}

/// Apply, write and flush the lines, commit: the order that makes a line
/// precede its commit. Any early return drops the transaction, which rolls
/// the reaping back, so its jobs stay stale for the next pass (at least once).
async fn apply_in_tx(
    conn: &mut PgConnection,
    actor: &str,
    events: &mut EventLog,
) -> Result<Batch, BatchFailure> {
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| BatchFailure::Query("BEGIN", e))?;
    let text = q::apply(&mut tx, actor, JOB_BATCH_SIZE)
        .await
        .map_err(|e| BatchFailure::Query("fn_job_reap_stale_leases_apply", e))?;
    let report: ApplyReport = serde_json::from_str(&text).map_err(|e| {
        BatchFailure::Decode(
            "fn_job_reap_stale_leases_apply",
            format!("unexpected JSON ({e}): {text}"),
        )
    })?;
    if report.refused {
        // Nothing was changed; the gates closed since they were read.
        return Ok(Batch::Refused(report.reason.unwrap_or(text)));
    }
    // Not reaped, so nothing to write before the commit; a set-aside job
    // keeps the batch short, so the sweep moves on and the next retries it.
    for job in &report.set_aside {
        tracing::error!(
            jobId = %job.job_id,
            jobKind = %job.job_kind.as_deref().unwrap_or(""),
            leaseOwner = %job.lease_owner.as_deref().unwrap_or(""),
            cause = %job.error,
            backend = BACKEND,
            "job_set_aside"
        );
    }
    if !report.actions.is_empty() {
        events
            .warn_lines(JOB_LEASE_EXPIRED, report.actions.iter().map(line_fields))
            .map_err(BatchFailure::Report)?;
    }
    tx.commit()
        .await
        .map_err(|e| BatchFailure::Query("COMMIT", e))?;
    Ok(Batch::Applied(report))
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
