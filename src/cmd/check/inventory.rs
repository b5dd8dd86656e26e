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

/// Whose an object is: the lock server's and the job queue's are theirs
/// (adopted, or the stand-ins `migrate` created where there were none), the
/// rest the sidecar's, which `lease-sweeper remove` takes out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    LockServer,
    JobQueue,
    Sidecar,
}

impl Whose {
    pub fn of(object: Object) -> Whose {
        match object.name() {
            "lock_entry" => Whose::LockServer,
            "job_queue"
            | "job_dead_letter"
            | "queue_setting"
            | "job_queue_lease_until_idx"
            | "fn_queue_setting_set"
            | "job_kind_lease"
            | "fn_job_kind_lease_set"
            | "fn_job_default_lease_sec" => Whose::JobQueue,
            _ => Whose::Sidecar,
        }
    }
}

impl fmt::Display for Whose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Whose::LockServer => "the lock server's",
            Whose::JobQueue => "the job queue's",
            Whose::Sidecar => "the sidecar's",
        })
    }
}

/// The schema to find, in the order it is reported. One line per object.
pub const EXPECTED: &[Object] = &[
    // The lock server's table the sweep reads (its deadline index, and
    // whether it fits, are the adoption line's).
    Object::Table("lock_entry"),
    // The sidecar's records: takeovers and late releases, hand-offs, the
    // shared held count.
    Object::Table("lock_expiry_outbox"),
    Object::Table("lock_reap_handoff"),
    Object::Table("lock_held_count"),
    Object::Table("lock_held_delta"),
    // The lock sweep's calls, in the order a sweep makes them.
    Object::Function("lock_sweep_probe"),
    Object::Function("lock_reap_batch"),
    Object::Function("lock_handoff_claim"),
    Object::Function("lock_handoff_recover"),
    Object::Function("lock_drain_takeovers"),
    Object::Function("lock_held_count_get"),
    // The job queue's, which the reaper and `gates`/`leases` use.
    Object::Table("job_queue"),
    Object::Table("job_dead_letter"),
    Object::Table("queue_setting"),
    Object::Index("job_queue_lease_until_idx"),
    Object::Function("fn_queue_setting_set"),
    // Per-kind lease durations (job_kind_lease, fn_job_kind_lease_set,
    // fn_job_default_lease_sec) are optional: the line "job queue's
    // optional features" says whether the queue has them.
    // The reaper's: the daemon's calls, then what `jobs` runs.
    Object::Table("job_reap_handoff"),
    Object::Function("fn_job_reaper_gate_refusal"),
    Object::Function("fn_job_stale_lease_count"),
    Object::Function("fn_job_reap_handoff_abandoned"),
    Object::Function("fn_job_reap_stale_leases_apply_handed_off"),
    Object::Function("fn_job_reap_handoff_claim"),
    Object::Function("fn_job_reap_handoff_recover"),
    Object::Function("fn_job_reaper_limit_refusal"),
    Object::Function("fn_job_reap_stale_leases_dry_run"),
    Object::Function("fn_job_reap_stale_leases_apply"),
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

/// What `run` does with the connecting role's rights, and nothing else. One
/// line per object. The sweep and the reaper delete and update only through
/// SECURITY DEFINER functions, which touch nothing but what expired: no
/// DELETE or UPDATE on any table is needed.
pub const GRANTS: &[Grant] = &[
    Grant {
        on: Object::Function("lock_sweep_probe"),
        privileges: &["EXECUTE"],
        why: "each sweep asks first, in one statement, whether there is anything to reap",
    },
    Grant {
        on: Object::Function("lock_reap_batch"),
        privileges: &["EXECUTE"],
        why: "the sweep deletes a batch of expired leases and records them in one call, so their row locks end before their lines are written",
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
        on: Object::Function("lock_drain_takeovers"),
        privileges: &["EXECUTE"],
        why: "the sweep reports recorded takeovers and late releases through it",
    },
    Grant {
        on: Object::Function("lock_held_count_get"),
        privileges: &["EXECUTE"],
        why: "the lock.held.current gauge reads the fleet's shared count",
    },
    Grant {
        on: Object::Table("queue_setting"),
        privileges: &["SELECT"],
        why: "the daemon reads the queue gates",
    },
    // The gate check and the stale count are SECURITY INVOKER: they read
    // with the caller's rights. The apply is SECURITY DEFINER.
    Grant {
        on: Object::Table("job_queue"),
        privileges: &[
            "SELECT (job_id, job_kind, state, attempts, max_attempts, lease_owner, lease_until)",
        ],
        why: "the stale count behind queue.lease.stale.current reads it",
    },
    Grant {
        on: Object::Function("fn_job_reaper_gate_refusal"),
        privileges: &["EXECUTE"],
        why: "the daemon asks the gates before each apply",
    },
    Grant {
        on: Object::Function("fn_job_stale_lease_count"),
        privileges: &["EXECUTE"],
        why: "the queue.lease.stale.current gauge",
    },
    Grant {
        on: Object::Function("fn_job_reap_handoff_abandoned"),
        privileges: &["EXECUTE"],
        why: "each pass asks, in its first statement, whether a batch another reaper recorded waits",
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
];
