//! Every SQL statement the daemon sends, each in one small named function.
//!
//! Owns the statement texts (all literals: nothing is assembled at run time)
//! and the row shapes they decode into. Every statement is sent unnamed
//! (`.persistent(false)`): a named one (sqlx caches `sqlx_s_N` per client
//! connection) would outlive its transaction, and behind PgBouncer in
//! transaction mode the next transaction may run on a server connection
//! that never saw it, or saw another client's statement under that name. It owns no transactions, retries or
//! logging; callers decide those. Schema and server-side functions live in
//! `migrations/`.

pub mod jobs;
pub mod locks;
