//! The signal stream: the WARN lines operators alert on.
//!
//! Owns the exact shape of `lease_expired` and `job_lease_expired` (and the
//! line format the horizon check's `xmin_horizon_held` and
//! `xmin_horizon_released` share) and the
//! write discipline behind "at least once, never lost": each call's lines
//! (up to 500 leases; a batch is reported in such chunks) are formatted into
//! one buffer, written whole and flushed, all before the caller commits the
//! batch. These lines deliberately bypass `tracing` and its
//! `RUST_LOG` filter, so no log level can silence them; diagnostics go through
//! `telemetry` and never through here.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use crate::model::ExpiredLease;
use crate::output::logfmt::{push_int_pair, push_pair};

/// Where signal lines go: stdout in the daemon, a shared buffer in tests.
pub struct EventLog {
    out: Box<dyn Write + Send>,
    buf: String,
}

impl EventLog {
    /// Lines go to the process's stdout, shared with diagnostics line by line.
    pub fn stdout() -> Self {
        Self::to_writer(Box::new(io::stdout()))
    }

    pub fn to_writer(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            buf: String::with_capacity(64 * 1024),
        }
    }

    /// An in-memory log for tests; the handle reads what was written.
    pub fn in_memory() -> (Self, MemoryLog) {
        let shared = MemoryLog::default();
        (Self::to_writer(Box::new(shared.clone())), shared)
    }

    /// Writes one `lease_expired` line per lease and flushes them all before
    /// returning; an error means the caller must not commit the batch.
    pub fn lease_expired(&mut self, backend: &str, leases: &[ExpiredLease]) -> io::Result<()> {
        self.buf.clear();
        // The same three pairs start every line of the call: encoded once.
        let mut head = String::with_capacity(64);
        push_head(
            &mut head,
            &crate::output::telemetry::timestamp_now(),
            "lease_expired",
        );
        let line = &mut self.buf;
        for lease in leases {
            line.push_str(&head);
            push_pair(line, "lockKey", &lease.lock_key);
            push_pair(line, "token", &lease.token);
            push_int_pair(line, "expiredAtMillis", lease.expired_at_millis);
            push_int_pair(line, "overdueMillis", lease.overdue_millis);
            push_pair(line, "backend", backend);
            push_pair(line, "reapedBy", lease.reaped_by.as_str());
            push_pair(line, "ownerId", &lease.owner_id);
            line.push('\n');
        }
        self.write_buffered()
    }

    /// Writes pre-built pairs as one WARN line per entry (used by the job
    /// reaper and the horizon check, whose fields are described where they
    /// are built).
    pub fn warn_lines<'a, I>(&mut self, message: &str, rows: I) -> io::Result<()>
    where
        I: IntoIterator<Item = Vec<(&'a str, String)>>,
    {
        self.lines("warn", message, rows)
    }

    /// The same at INFO: the end of a condition a WARN line announced (the
    /// horizon check's `xmin_horizon_released`), which must reach the same
    /// stream however `RUST_LOG` is set.
    pub fn info_lines<'a, I>(&mut self, message: &str, rows: I) -> io::Result<()>
    where
        I: IntoIterator<Item = Vec<(&'a str, String)>>,
    {
        self.lines("info", message, rows)
    }

    fn lines<'a, I>(&mut self, level: &str, message: &str, rows: I) -> io::Result<()>
    where
        I: IntoIterator<Item = Vec<(&'a str, String)>>,
    {
        self.buf.clear();
        let mut head = String::with_capacity(64);
        push_level_head(
            &mut head,
            &crate::output::telemetry::timestamp_now(),
            level,
            message,
        );
        let line = &mut self.buf;
        for pairs in rows {
            line.push_str(&head);
            for (k, v) in &pairs {
                push_pair(line, k, v);
            }
            line.push('\n');
        }
        self.write_buffered()
    }

    fn write_buffered(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.out.write_all(self.buf.as_bytes())?;
        self.out.flush()
    }
}

/// The pairs every signal line starts with.
fn push_head(line: &mut String, ts: &str, message: &str) {
    push_level_head(line, ts, "warn", message);
}

fn push_level_head(line: &mut String, ts: &str, level: &str, message: &str) {
    push_pair(line, "ts", ts);
    push_pair(line, "level", level);
    push_pair(line, "message", message);
}

/// A cloneable in-memory sink; reading it yields whole lines.
#[derive(Clone, Default)]
pub struct MemoryLog(Arc<Mutex<Vec<u8>>>);

impl MemoryLog {
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().expect("memory log poisoned");
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Write for MemoryLog {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .expect("memory log poisoned")
            .extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
