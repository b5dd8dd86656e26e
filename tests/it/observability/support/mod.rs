//! Helpers the observability suites share: `scrape` (a daemon with its
//! endpoint, an HTTP client, reading a series), `prometheus` (a real
//! Prometheus and mtail on loopback) and `flood` (the leases a flood test
//! expires and what it measures of them). Re-exported here, so suites name
//! `crate::observability::support::X`.

mod flood;
mod prometheus;
mod scrape;

pub use flood::*;
pub use prometheus::*;
pub use scrape::*;
