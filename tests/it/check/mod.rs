//! `lease-sweeper check`, the preflight: the binary's exit codes and list,
//! reaching its target, and what it says about the schema and the role's
//! grants.

mod command;
mod connection;
mod schema;
mod support;
