//! Integration tests against a real PostgreSQL, real UDP and the real binary.
//! One test binary, so the suite starts one throwaway cluster (see `support`).
//! One folder per subject, each with its own `support` where it has helpers;
//! what every subject uses stays in `support`.

mod adopt;
mod check;
mod cli;
mod daemon;
mod etcd;
mod faults;
mod jobs;
mod locks;
mod observability;
mod privilege;
mod support;
mod topology;
mod web_config;
