//! Integration tests against a real PostgreSQL, real UDP and the real binary.
//! One test binary, so the suite starts one throwaway cluster (see `support`).

mod check;
mod daemon;
mod faults;
mod hostile;
mod jobs_cli;
mod jobs_daemon;
mod jobs_sql;
mod jobs_support;
mod privilege;
mod services;
mod support;
mod sweep;
mod systemd;
