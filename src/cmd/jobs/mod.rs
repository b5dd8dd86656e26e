//! `lease-sweeper jobs dry-run|apply`, `lease-sweeper gates [set]` and
//! `lease-sweeper leases [set|clear]`: the operator's hands on the job
//! reaper and on how long jobs lease for.
//!
//! Owns connecting for one command, calling the SQL function, printing the
//! result on stdout (an aligned table for people; with `--json` the
//! function's JSON unchanged, indented on a terminal and as the database
//! wrote it (one line) otherwise, so scripts can pipe it to `jq`) and the
//! exit status: 0 when the function did what was
//! asked, 1 when it refused (apply with a gate closed, a limit out of range)
//! or a setter rejected the change. It owns no reaping or lease rules and no
//! SQL text (`pg::job_queue`); diagnostics go to stderr through `tracing`, and no
//! database error text is printed without passing the target's redactor.
//!
//! One file per subcommand (`reap` for `jobs dry-run|apply`, `gates`, `leases`)
//! over `common`.

mod common;
mod gates;
mod leases;
mod reap;

pub use common::Format;
pub use gates::{gates, run_gates};
pub use leases::{leases, run_leases};
pub use reap::{jobs, run_jobs};
