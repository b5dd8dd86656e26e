//! lease-sweeper: a sidecar that turns each expired lock lease, in
//! PostgreSQL or in etcd, into exactly one WARN `lease_expired` line and one
//! StatsD count, and sweeps stale job leases out of PostgreSQL.
//!
//! Layers; imports point down, never up, and no two modules import each
//! other (within a layer a module may use a sibling below it):
//! - `cmd`: one module per subcommand; `cmd::run` wires the daemon.
//! - `sweep`: the independent services (`lock_sweeper`, `job_reaper`, and
//!   `horizon_check`, which watches the xmin horizon) and the one loop that
//!   runs each (`sweep::run`).
//! - `pg`: connections, the schema, and each table's statements.
//! - `etcd`: the etcd lock backend (its watch, its claims), beside `pg`.
//! - `output`: signal lines, logfmt, diagnostics, StatsD.
//! - leaves: `store` (the `LockStore` and `JobQueue` seams and their error), `model` (the
//!   records), `config` (the environment) over the `pgconn` crate (libpq's
//!   target rules and the host walk), `shutdown` (signals), `progress`,
//!   `notify` and `heartbeat` (loop liveness for systemd and containers),
//!   `throwaway` (a local PostgreSQL for the demo and the tests).
//!
//! `unsafe` is denied except where no safe API exists (one place, which
//! says why).
//!
//! Public: what the binary needs (`cli`, `cmd`'s dispatch, `telemetry`).
//! The integration tests reach the few internals they drive through
//! `testing`, which is no API.

#![deny(unsafe_code)]

pub mod cli;
pub mod cmd;
mod config;
mod etcd;
mod heartbeat;
mod model;
mod notify;
mod output;
mod pg;
mod progress;
mod shutdown;
mod store;
mod sweep;
#[doc(hidden)]
pub mod testing;
mod throwaway;

pub use output::telemetry;
