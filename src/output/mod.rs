//! What the daemon writes: the signal lines (`events`, through `logfmt`),
//! the diagnostics (`telemetry`) and the StatsD metrics (`metrics`).
//!
//! Nothing here reads the database or decides when to write; the services
//! in `sweep` and the commands in `cmd` call in.

pub mod events;
pub mod logfmt;
pub mod metrics;
pub mod table;
pub mod telemetry;
