//! What the daemon writes: the signal lines (`events`, through `logfmt`),
//! the diagnostics (`telemetry`), and the metrics (`metrics`, delivered by
//! `statsd` and, when it is on, served by `scrape` from `prometheus`).
//!
//! Nothing here reads the database or decides when to write; the services
//! in `sweep` and the commands in `cmd` call in.

pub mod events;
pub mod logfmt;
pub mod metrics;
pub mod prometheus;
pub mod scrape;
pub mod statsd;
pub mod table;
pub mod telemetry;
pub mod web_config;

#[cfg(test)]
pub mod test_agent;
