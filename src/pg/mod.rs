//! The PostgreSQL layer: connections, the schema, and each table's
//! statements beside the code that runs them.
//!
//! `conn` opens (through the `pgconn` crate's host walk) and describes
//! connections; `migrate` installs the sidecar beside the lock server's
//! tables (or takes it out), `adopt` judges whether those tables fit, `sql`
//! embeds the SQL files it runs; `lock_store` holds the statements on
//! `lock_entry` and the sidecar's records of it, and the transactions a batch
//! runs them in (the `LockStore` for `backend=pg`); `job_queue` the job
//! queue's; `catalog` what the preflight asks the catalogs; `horizon` what
//! the horizon check asks them. Nothing here counts or decides when to run
//! (`sweep` and `cmd` do), and the only lines logged here name the rows a
//! batch set aside, which only this layer sees. Every statement is a literal,
//! sent unnamed inside a transaction (`conn::in_tx`), the idle probes
//! excepted (`conn::probe_row`): why, docs/decisions.md, section 12.

pub mod adopt;
pub mod catalog;
pub mod conn;
pub mod horizon;
pub mod job_queue;
pub mod lock_store;
pub mod migrate;
pub mod sql;
