//! The lock sweep against a real database: every expired lease reported
//! exactly once, the hand-off that keeps lines off the lock server's path,
//! the shared held-lease count, a lock server's own schema and statements,
//! the rows the schema refuses or sets aside, and the batch that falls back
//! to taking them row by row. Job leases are `jobs`'s; faults from outside
//! are `faults`'s.

mod bad_rows;
mod fallback;
mod handoff;
mod held_count;
mod sweep;
