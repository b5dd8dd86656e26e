//! The PostgreSQL layer: connections, the schema, and each table's
//! statements beside the code that runs them.
//!
//! `conn` opens and describes connections; `migrate` applies the bundled
//! schema; `lock_entry` holds the statements on `lock_entry` and its takeover
//! outbox, run in batches by `lock_store` (the `LockStore` for `backend=pg`);
//! `job_queue` holds the job queue's statements and its apply transaction.
//! Nothing here logs, counts or decides when to run: the services in `sweep`
//! and the commands in `cmd` do. Every statement is a literal; none is
//! assembled at run time.

pub mod conn;
pub mod job_queue;
pub mod lock_entry;
pub mod lock_store;
pub mod migrate;
