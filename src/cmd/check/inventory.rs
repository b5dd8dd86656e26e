//! What `check` checks: every object the daemon and its commands rely on
//! (`EXPECTED`) and every privilege `run` uses (`GRANTS`), one entry each, so
//! a migration that adds one adds a line here. It knows no SQL and prints
//! nothing.

use std::fmt;

/// A database object the daemon or its commands rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// A table, looked up through the connecting role's `search_path`.
    Table(&'static str),
    /// An index, which must also be valid (not a failed concurrent build).
    Index(&'static str),
    /// A function, by name, whatever its argument list.
    Function(&'static str),
}

impl Object {
    pub(super) fn kind(self) -> &'static str {
        match self {
            Self::Table(_) => "table",
            Self::Index(_) => "index",
            Self::Function(_) => "function",
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Table(n) | Self::Index(n) | Self::Function(n) => n,
        }
    }
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.name())
    }
}

/// The schema to find, in the order it is reported. One line per object.
pub const EXPECTED: &[Object] = &[
    // Lock leases (migrations/20261129000100_lock_leases.sql).
    Object::Table("lock_session"),
    Object::Table("lock_entry"),
    Object::Table("lock_expiry_outbox"),
    Object::Index("lock_entry_expiry_idx"),
    Object::Function("lock_acquire"),
    Object::Function("lock_renew"),
    Object::Function("lock_release"),
    Object::Function("lock_reap_expired"),
    Object::Function("lock_drain_takeovers"),
    // Backlog walk and shared held count (migrations/20261130000300_…).
    Object::Table("lock_held_count"),
    Object::Function("lock_reap_expired_walk"),
    Object::Function("lock_held_count_get"),
    Object::Function("lock_sweep_probe"),
    // Sweeps lower the shared count at once (migrations/20261201000100_…).
    Object::Table("lock_held_delta"),
    // Batches handed off before their lines are written
    // (migrations/20261202000100_…).
    Object::Table("lock_reap_handoff"),
    Object::Function("lock_reap_expired_handed_off"),
    Object::Function("lock_handoff_claim"),
    Object::Function("lock_handoff_recover"),
    // The backlog walk without row locks (migrations/20261204000200_…).
    Object::Function("lock_reap_walk"),
    Object::Function("lock_reap_busy"),
    // Job leases (migrations/20261129000200_job_queue.sql).
    Object::Table("job_queue"),
    Object::Table("job_dead_letter"),
    Object::Table("queue_setting"),
    Object::Index("job_queue_lease_until_idx"),
    Object::Function("fn_job_reaper_gate_refusal"),
    Object::Function("fn_job_reaper_limit_refusal"),
    Object::Function("fn_job_reap_stale_leases_dry_run"),
    Object::Function("fn_job_reap_stale_leases_apply"),
    Object::Function("fn_queue_setting_set"),
    // The stale gauge alone (migrations/20261130000400_…).
    Object::Function("fn_job_stale_lease_count"),
    // Lease durations per kind and per job (migrations/20261201000200_…):
    // `lease-sweeper leases` and the claim and heartbeat of workers.
    Object::Table("job_kind_lease"),
    Object::Function("fn_job_kind_lease_set"),
    Object::Function("fn_job_default_lease_sec"),
    // Apply reports handed off before their lines are written
    // (migrations/20261202000100_…).
    Object::Table("job_reap_handoff"),
    Object::Function("fn_job_reap_stale_leases_apply_handed_off"),
    Object::Function("fn_job_reap_handoff_claim"),
    Object::Function("fn_job_reap_handoff_recover"),
    Object::Function("fn_job_reap_handoff_abandoned"),
];

/// A privilege the daemon's role needs, and why.
///
/// A privilege written `SELECT (a, b)` needs that privilege on each listed
/// column, not on the whole table: the daemon's role may read the job
/// columns the dry run uses, but not job payloads.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub on: Object,
    pub privileges: &'static [&'static str],
    pub why: &'static str,
}

/// What `run` does with the connecting role's rights. One line per object.
pub const GRANTS: &[Grant] = &[
    Grant {
        on: Object::Function("lock_held_count_get"),
        privileges: &["EXECUTE"],
        why: "the lock.held.current gauge reads the fleet's shared count",
    },
    // The sweep deletes only through these SECURITY DEFINER functions, which
    // can delete nothing but expired rows: no DELETE on the tables is needed.
    Grant {
        on: Object::Function("lock_reap_expired"),
        privileges: &["EXECUTE"],
        why: "the sweep deletes expired leases through it",
    },
    Grant {
        on: Object::Function("lock_reap_expired_walk"),
        privileges: &["EXECUTE"],
        why: "the sweep drains a backlog of expired leases through it",
    },
    Grant {
        on: Object::Function("lock_sweep_probe"),
        privileges: &["EXECUTE"],
        why: "an idle sweep asks in one statement whether there is anything to reap",
    },
    Grant {
        on: Object::Function("lock_drain_takeovers"),
        privileges: &["EXECUTE"],
        why: "the sweep drains recorded takeovers through it",
    },
    Grant {
        on: Object::Function("lock_reap_expired_handed_off"),
        privileges: &["EXECUTE"],
        why: "the sweep deletes expired leases and records them in one call, so their row locks end before their lines are written",
    },
    Grant {
        on: Object::Function("lock_reap_walk"),
        privileges: &["EXECUTE"],
        why: "the sweep drains a backlog the same way, walking the heap",
    },
    Grant {
        on: Object::Function("lock_reap_busy"),
        privileges: &["EXECUTE"],
        why: "the job reaper paces a backlog while other sessions (the workers) are at work",
    },
    Grant {
        on: Object::Function("lock_handoff_claim"),
        privileges: &["EXECUTE"],
        why: "the recorded batch is deleted once its lines are written",
    },
    Grant {
        on: Object::Function("lock_handoff_recover"),
        privileges: &["EXECUTE"],
        why: "a batch another sweeper recorded but did not report is reported",
    },
    Grant {
        on: Object::Table("queue_setting"),
        privileges: &["SELECT"],
        why: "the daemon reads the queue gates",
    },
    // The gate check and the dry run are SECURITY INVOKER: they read with
    // the caller's rights. The apply is SECURITY DEFINER: EXECUTE suffices.
    Grant {
        on: Object::Table("job_queue"),
        privileges: &[
            "SELECT (job_id, job_kind, state, attempts, max_attempts, lease_owner, lease_until, lease_duration_sec, lease_duration_source)",
        ],
        why: "the dry run behind queue.lease.stale.current reads it",
    },
    Grant {
        on: Object::Function("fn_job_reaper_gate_refusal"),
        privileges: &["EXECUTE"],
        why: "the daemon asks the gates before each apply",
    },
    Grant {
        on: Object::Function("fn_job_reaper_limit_refusal"),
        privileges: &["EXECUTE"],
        why: "the dry run calls it",
    },
    Grant {
        on: Object::Function("fn_job_reap_stale_leases_dry_run"),
        privileges: &["EXECUTE"],
        why: "lease-sweeper jobs dry-run",
    },
    Grant {
        on: Object::Function("fn_job_stale_lease_count"),
        privileges: &["EXECUTE"],
        why: "the queue.lease.stale.current gauge",
    },
    Grant {
        on: Object::Function("fn_job_reap_stale_leases_apply"),
        privileges: &["EXECUTE"],
        why: "the daemon reaps stale job leases when the gates allow",
    },
    Grant {
        on: Object::Function("fn_job_reap_stale_leases_apply_handed_off"),
        privileges: &["EXECUTE"],
        why: "the daemon reaps stale job leases and records the report in one call, so the jobs' row locks end before their lines are written",
    },
    Grant {
        on: Object::Function("fn_job_reap_handoff_claim"),
        privileges: &["EXECUTE"],
        why: "the recorded batch is deleted once its lines are written",
    },
    Grant {
        on: Object::Function("fn_job_reap_handoff_recover"),
        privileges: &["EXECUTE"],
        why: "a batch another reaper recorded but did not report is reported",
    },
    Grant {
        on: Object::Function("fn_job_reap_handoff_abandoned"),
        privileges: &["EXECUTE"],
        why: "each pass asks, in its first statement, whether such a batch waits",
    },
];
