//! The real binary as a service: signals, exit codes and recovery, the two
//! services kept independent, liveness for containers, systemd's unit and
//! notify protocol, and the idle probes it sends.

mod lifecycle;
mod liveness;
mod probes;
mod services;
mod systemd;
