//! Every SQL statement the daemon sends, each in one small named function.
//!
//! Owns the statement texts (all literals: nothing is assembled at run time)
//! and the row shapes they decode into. It owns no transactions, retries or
//! logging; callers decide those. Schema and server-side functions live in
//! `migrations/`.

pub mod jobs;
pub mod locks;
