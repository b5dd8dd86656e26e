//! lease-sweeper: a sidecar that sweeps expired lock leases and stale job
//! leases out of PostgreSQL and turns each lock-lease expiry into exactly one
//! WARN `lease_expired` line and one StatsD count.
//!
//! Layout: `sweeper` (the loop and one pass) talks to a `store::LockStore`
//! (PostgreSQL in `store::postgres`, statements in `queries`), writes signal
//! lines through `events` and counts through `metrics`; `jobs` is the job-queue
//! reaper; `telemetry` and `logfmt` are the diagnostics; `shutdown` turns
//! signals into cancellation; `config` reads the environment; `cli`/`app` are
//! the command line; `throwaway` and `demo` serve the embedded default and the
//! tests.

pub mod app;
pub mod check;
pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod events;
pub mod jobs;
pub mod jobs_cli;
pub mod logfmt;
pub mod metrics;
pub mod notify;
pub mod pg {
    pub mod target;
}
pub mod queries;
pub mod shutdown;
pub mod store;
pub mod sweeper;
pub mod telemetry;
pub mod throwaway;
