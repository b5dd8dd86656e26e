//! The daemon in the topologies it is deployed in: a promoted hot standby,
//! libpq's variables and defaults, PgBouncer in front, and TLS with
//! `verify-full`. Each starts what it needs beside the shared cluster.

mod connections;
mod failover;
mod libpq;
mod pgbouncer;
mod support;
mod tls;
