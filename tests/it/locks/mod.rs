//! The lock sweep against a real database: every expired lease reported
//! exactly once, the hand-off that keeps lines off the lock server's path,
//! the shared held-lease count, a lock server's own schema and statements, and the rows the schema
//! refuses or sets aside. Job leases are `jobs`'s; faults from outside are
//! `faults`'s.

mod bad_rows;
mod handoff;
mod held_count;
mod sweep;
