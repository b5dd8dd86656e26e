//! The job queue's stale-lease reaper: its SQL API (apply, dry run, gates,
//! races, the worker's side), each job's own lease duration, the bad rows
//! it refuses, its daemon pass and its command line. Who may call what is
//! `privilege`'s.

mod apply;
mod bad_rows;
mod cli;
mod daemon;
mod gates;
mod lease_duration;
mod races;
pub mod support;
mod worker;
