//! Integration tests against a real PostgreSQL, real UDP and the real binary.
//! One test binary, so the suite starts one throwaway cluster (see `support`).

mod bad_rows;
mod check;
mod cli_output;
mod daemon;
mod dashboard;
mod faults;
mod held_count;
mod holes;
mod hostile;
mod job_lease_duration;
mod jobs_cli;
mod jobs_daemon;
mod jobs_sql;
mod jobs_support;
mod liveness;
mod man;
mod mtail;
mod privilege;
mod prometheus_support;
mod reap_walk;
mod scrape;
mod scrape_flood;
mod scrape_support;
mod services;
mod simple_probe;
mod support;
mod sweep;
mod systemd;
mod topology;
mod topology_support;
