//! lease-sweeper: a sidecar that sweeps expired lock leases and stale job
//! leases out of PostgreSQL and turns each lock-lease expiry into exactly one
//! WARN `lease_expired` line and one StatsD count.
//!
//! Layers, each importing only the ones below it:
//! - `cmd`: one module per subcommand; `cmd::run` wires the daemon.
//! - `sweep`: the two independent services (`lock_sweeper`, `job_reaper`)
//!   and the one loop that runs each (`sweep::run`).
//! - `pg`: connections, the schema, and each table's statements.
//! - `output`: signal lines, logfmt, diagnostics, StatsD.
//! - leaves: `store` (the `LockStore` seam and its error), `model` (the
//!   records), `config` (the environment) over the `pgconn` crate (libpq's
//!   target rules and the host walk), `shutdown` (signals), `progress`,
//!   `notify` and `heartbeat` (loop liveness for systemd and containers),
//!   `throwaway` (a local PostgreSQL for the demo and the tests).
//!
//! `unsafe` is denied except where no safe API exists (one place, which
//! says why).

#![deny(unsafe_code)]

pub mod cli;
pub mod cmd;
pub mod config;
mod heartbeat;
pub mod model;
mod notify;
pub mod output;
pub mod pg;
pub mod progress;
mod shutdown;
pub mod store;
pub mod sweep;
pub mod throwaway;
