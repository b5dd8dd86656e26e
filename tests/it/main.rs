//! Integration tests against a real PostgreSQL, real UDP and the real binary.
//! One test binary, so the suite starts one throwaway cluster (see `support`).

mod check;
mod daemon;
mod faults;
mod held_count;
mod hostile;
mod jobs;
mod privilege;
mod reap_walk;
mod support;
mod sweep;
mod systemd;
