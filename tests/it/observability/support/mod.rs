//! Helpers the observability suites share: `scrape` (a daemon with its
//! endpoint, an HTTP client, reading a series) and `prometheus` (a real
//! Prometheus and mtail on loopback). Re-exported here, so suites name
//! `crate::observability::support::X`.

mod prometheus;
mod scrape;

pub use prometheus::*;
pub use scrape::*;
