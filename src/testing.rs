//! The internals the integration tests drive, re-exported for them alone.
//!
//! Not an API: hidden from the documentation, and free to change with the
//! tests. Each module mirrors the one it re-exports from and names only the
//! items some test uses; nothing here adds behaviour.

/// `lease-sweeper check`: its report and the lists the tests compare (all of
/// it, since the command and its tests change together).
pub mod check {
    pub use crate::cmd::check::*;
}

pub mod jobs {
    pub use crate::cmd::jobs::{Format, run_gates, run_jobs, run_leases};
}

pub mod config {
    pub use crate::config::{DbTarget, StatsdTarget};
}

pub mod events {
    pub use crate::output::events::{EventLog, MemoryLog};
}

pub mod logfmt {
    pub use crate::output::logfmt::decode_line;
}

pub mod metrics {
    pub use crate::output::metrics::{MAX_OVERDUE_SAMPLES, Metrics};
}

pub mod conn {
    pub use crate::pg::conn::{
        HOT_STANDBY, PROBE_TIMEOUT, connect, describe, in_tx, probe_row, probe_row_within,
    };
}

pub mod job_queue {
    pub use crate::pg::job_queue::{GATES_THEN_STALE, PgJobQueue, STALE_COUNT};
    pub use crate::store::{ApplyBatch, Gates, JobQueue};
}

pub mod lock_entry {
    pub use crate::pg::lock_store::{
        HELD_COUNT_MAX_AGE, SWEEP_PROBE, held_count, reap_batch, sweep_probe,
    };
}

pub mod lock_store {
    pub use crate::pg::lock_store::PgLockStore;
}

pub mod migrate {
    pub use crate::pg::migrate::{
        BUILT_INDEX_COMMENT, Installed, MIGRATIONS_TABLE, MIGRATOR, MigrateError, Origin, migrate,
        remove,
    };
}

pub mod sql {
    pub use crate::pg::sql::*;
}

pub mod progress {
    pub use crate::progress::Progress;
}

pub mod model {
    pub use crate::model::{ExpiredLease, JobAction};
}

pub mod store {
    pub use crate::store::{LockStore, Probe, StoreError};
}

pub mod sweep {
    pub use crate::sweep::{DRAIN_GRACE, SWEEP_DELAY, run};
}

pub mod lock_sweeper {
    pub use crate::sweep::lock_sweeper::{BATCH_SIZE, LockSweeper};
}

pub mod job_reaper {
    pub use crate::sweep::job_reaper::{JOB_BATCH_SIZE, JobReaper};
}

pub mod throwaway {
    pub use crate::throwaway::{StopMode, ThrowawayPg};
}
