//! Each job's own lease duration: what a claim or heartbeat gives a job,
//! the setter and its audit, the per-job override at the door, the reaper
//! honouring it and the `leases` command.

mod claims;
mod cli;
mod overrides;
mod reaper;
mod setter;
