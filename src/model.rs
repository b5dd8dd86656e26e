//! The records the services pass around: reaped lock leases and the job
//! reaper's reports, as plain data.
//!
//! Owns the shapes and their stable spellings (`ReapedBy::as_str`, the job
//! action names) and nothing else: it imports nothing of this crate, so every
//! layer (PostgreSQL, services, output, commands) may use it without an import
//! ever pointing back up. How a record is read (`pg`), written (`output`) or
//! acted on (`sweep`) lives with those layers.

use serde::Deserialize;

/// One lease that reached its deadline while still held.
///
/// `lock_key` + `token` is the dedupe key: after a crash between writing a
/// batch's lines and committing it, the same pair can be reported again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredLease {
    pub lock_key: String,
    pub owner_id: String,
    /// The lock server's token as its text, whatever its column's type
    /// (`bigint`, `uuid`, `text`, …); empty where that column holds NULL.
    pub token: String,
    /// The lease's deadline, in milliseconds since the Unix epoch.
    pub expired_at_millis: i64,
    /// How long past its deadline the lease was when it left the table (swept,
    /// stolen, or released late) or was renewed late, by the database's clock.
    pub overdue_millis: i64,
    pub reaped_by: ReapedBy,
}

/// How an expired lease left the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapedBy {
    /// Deleted by a sweeper.
    Sweep,
    /// Stolen by a new acquire before any sweeper saw it; recorded by the
    /// backend at the moment of the steal and drained by a sweeper.
    Takeover,
    /// Deleted by its holder after its deadline, before any sweeper saw it
    /// (the holder paused past the deadline, then released); recorded by
    /// the backend in the deleting statement and drained by a sweeper.
    Release,
    /// Renewed by its holder after its deadline, before any sweeper saw it
    /// (the holder woke after the deadline and extended with the same
    /// token): the lease is held again, but was not while the holder was
    /// away. Recorded by the backend in the renewing statement and drained
    /// by a sweeper.
    Renewal,
    /// Deleted by etcd when the lease it was attached to ran out (the
    /// holder died, paused, or lost etcd). etcd carries the expiry out and
    /// says nothing; the sidecar saw the deletion.
    Expiry,
    /// Deleted when its holder revoked the lease while it held the lock (a
    /// lease revoke, or a session closed without an unlock): before the
    /// deadline the sidecar last learned, with the lease gone.
    Revoke,
}

impl ReapedBy {
    /// Every way, in the order metrics list them.
    pub const ALL: [ReapedBy; 6] = [
        ReapedBy::Sweep,
        ReapedBy::Takeover,
        ReapedBy::Release,
        ReapedBy::Renewal,
        ReapedBy::Expiry,
        ReapedBy::Revoke,
    ];

    /// The ways a backend reports, by its `backend` tag: PostgreSQL's
    /// sweeps and records, etcd's own expiries and revokes.
    pub fn of_backend(backend: &str) -> &'static [ReapedBy] {
        match backend {
            "etcd" => &[ReapedBy::Expiry, ReapedBy::Revoke],
            _ => &ReapedBy::ALL[..4],
        }
    }

    /// The `reapedBy` value on a `lease_expired` line.
    pub fn as_str(self) -> &'static str {
        match self {
            ReapedBy::Sweep => "sweep",
            ReapedBy::Takeover => "takeover",
            ReapedBy::Release => "release",
            ReapedBy::Renewal => "renewal",
            ReapedBy::Expiry => "expiry",
            ReapedBy::Revoke => "revoke",
        }
    }

    /// The value as the backend records it (`lock_expiry_outbox.reaped_by`);
    /// `None` for a word this build does not know.
    pub fn parse(word: &str) -> Option<ReapedBy> {
        match word {
            "sweep" => Some(ReapedBy::Sweep),
            "takeover" => Some(ReapedBy::Takeover),
            "release" => Some(ReapedBy::Release),
            "renewal" => Some(ReapedBy::Renewal),
            "expiry" => Some(ReapedBy::Expiry),
            "revoke" => Some(ReapedBy::Revoke),
            _ => None,
        }
    }
}

/// Apply's action for a job returned to `retry_waiting`.
pub const ACTION_RESET: &str = "reset_to_retry_waiting";
/// Apply's action for a job moved to the dead-letter table.
pub const ACTION_DEAD_LETTER: &str = "moved_to_dead_letter";
/// The dry run's `would_action` for a job on its last attempt (a reset is
/// `ACTION_RESET`, spelled as apply spells it).
pub const WOULD_DEAD_LETTER: &str = "move_to_dead_letter";

/// `fn_job_reap_stale_leases_apply`'s answer: a refusal or a report.
#[derive(Debug, Clone, Deserialize)]
pub struct ApplyReport {
    pub refused: bool,
    /// Set on a refusal only.
    #[serde(default)]
    pub reason: Option<String>,
    /// Who applied (absent on a refusal).
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
    /// `ACTION_RESET` or `ACTION_DEAD_LETTER`.
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

/// `fn_job_reap_stale_leases_dry_run`'s answer: a refusal (a limit out of
/// range) or what an apply would do now, changing nothing.
#[derive(Debug, Clone, Deserialize)]
pub struct DryRunReport {
    /// Absent unless it refused.
    #[serde(default)]
    pub refused: bool,
    /// Set on a refusal only.
    #[serde(default)]
    pub reason: Option<String>,
    /// Every stale job lease, not only the `limit` listed.
    #[serde(default)]
    pub stale_lease_count: u64,
    /// The limit asked for.
    #[serde(default)]
    pub limit: Option<i64>,
    /// The oldest stale leases, at most `limit`.
    #[serde(default)]
    pub jobs: Vec<DryRunJob>,
}

/// One stale job of the dry run.
#[derive(Debug, Clone, Deserialize)]
pub struct DryRunJob {
    pub job_id: String,
    pub job_kind: String,
    pub lease_owner: Option<String>,
    pub attempts: i64,
    pub max_attempts: i64,
    /// The lease its latest claim or heartbeat gave it, and where that came
    /// from (`override`, `kind` or `default`); absent when none recorded one.
    #[serde(default)]
    pub lease_duration_sec: Option<i64>,
    #[serde(default)]
    pub lease_duration_source: Option<String>,
    /// Whole seconds past `lease_until`, by the database's clock.
    pub overdue_seconds: i64,
    /// `ACTION_RESET` or `WOULD_DEAD_LETTER`.
    pub would_action: String,
}

/// What the unit tests build their leases from.
#[cfg(test)]
pub mod testing {
    use super::{ExpiredLease, ReapedBy};

    /// `n` leases (`k0`, `k1`, …, token `i`, owner `o`), deadlines counting
    /// up from the epoch, lease `i` `overdue(i)` ms late, all `reaped_by`.
    pub fn leases(n: usize, reaped_by: ReapedBy, overdue: fn(usize) -> i64) -> Vec<ExpiredLease> {
        (0..n)
            .map(|i| ExpiredLease {
                lock_key: format!("k{i}"),
                owner_id: "o".into(),
                token: i.to_string(),
                expired_at_millis: i as i64,
                overdue_millis: overdue(i),
                reaped_by,
            })
            .collect()
    }
}
