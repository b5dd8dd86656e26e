//! The PostgreSQL layer: connections, the schema, and each table's
//! statements beside the code that runs them.
//!
//! `conn` opens (through the host walk of the `pgconn` crate) and describes connections; `migrate` applies the bundled
//! schema; `lock_entry` holds the statements on `lock_entry` and its takeover
//! outbox, run in batches by `lock_store` (the `LockStore` for `backend=pg`);
//! `job_queue` holds the job queue's statements and its apply transaction;
//! `catalog` holds what the preflight asks the system catalogs; `horizon`
//! what the horizon check asks them (who holds the xmin horizon).
//! Nothing here logs, counts or decides when to run: the services in `sweep`
//! and the commands in `cmd` do. Every statement is a literal; none is
//! assembled at run time.
//!
//! Every statement is sent unnamed (`.persistent(false)`) and inside a
//! transaction (`conn::in_tx`, `conn::begin`): a named one (sqlx caches
//! `sqlx_s_N` per client connection) would outlive its transaction, and
//! behind PgBouncer in transaction mode the next transaction may run on a
//! server connection that never saw it, or saw another client's statement
//! under that name; outside a transaction even an unnamed statement's Parse
//! and Bind may reach different server connections (docs/topologies.md).
//! The exception is the idle probes: one simple-protocol message each
//! (`conn::probe_row`), which is its own implicit transaction.

pub mod catalog;
pub mod conn;
pub mod horizon;
pub mod job_queue;
pub mod lock_entry;
pub mod lock_store;
pub mod migrate;
