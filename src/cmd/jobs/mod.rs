//! `jobs dry-run|apply`, `gates [set]` and `leases [set|clear]`: the
//! operator's hands on the job reaper and on how long jobs lease for, one
//! file per command over `common`. Each command has its edge (the
//! environment, stdout) and one core, `run_<command>`, which prints a table
//! or the SQL function's JSON unchanged and returns the exit status (1 for a
//! refusal or a rejected change); a database error's text passes the
//! target's redactor. No reaping rules and no SQL (`pg::job_queue`).

mod common;
mod gates;
mod leases;
mod reap;

pub use common::Format;
pub use gates::{gates, run_gates};
pub use leases::{leases, run_leases};
pub use reap::{jobs, run_jobs};
