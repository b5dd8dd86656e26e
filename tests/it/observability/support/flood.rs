//! What the flood suites share: the leases they expire while flooding the
//! endpoint, the wait for every one to be reported, what the daemon said of
//! them, and its peak memory. It sends no flood: each suite owns its own.

use std::time::Duration;

use sqlx::PgConnection;

use crate::support::{Daemon, StatsdCapture, count, events, wait_until};

/// Leases expiring during a flood, one every 2 ms: 500 a second for 10 s.
pub const LEASES: i64 = 5_000;
pub const SPACING_MS: i64 = 2;
/// The first lease expires this long after the insert, once the flood runs.
pub const LEAD_MS: i64 = 1_000;
/// Peak resident memory the daemon may reach under a flood.
pub const MAX_RSS_KIB: u64 = 32 * 1024;
/// Latest any lease may be reported: a sweep held up by the flood for more
/// than a few seconds fails here (the p99 goal is measured, not asserted).
pub const MAX_OVERDUE_MS: i64 = 5_000;

/// Inserts the flood's `LEASES` leases, keyed `prefix` and a number.
pub async fn insert_leases(conn: &mut PgConnection, prefix: &str) {
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         SELECT $4::text || i, 'owner', nextval('lock_fencing_token_seq'),
                now() + ($2 + i * $3) * interval '1 millisecond'
           FROM generate_series(1, $1) AS i",
    )
    .bind(LEASES)
    .bind(LEAD_MS)
    .bind(SPACING_MS)
    .bind(prefix)
    .execute(conn)
    .await
    .unwrap();
}

/// Waits until the daemon has logged `LEASES` expiries.
pub async fn wait_every_lease_reported(daemon: &Daemon) {
    wait_until(Duration::from_secs(30), "every lease reported", || async {
        daemon.count_lines(|l| l.contains(" message=lease_expired ")) >= LEASES as usize
    })
    .await;
}

/// The `lease_expired` events in a daemon's lines.
pub struct Expiries {
    /// How many were logged.
    pub reported: usize,
    /// How many distinct leases they name.
    pub keys: usize,
    /// Each one's `overdueMillis`, smallest first.
    pub overdue: Vec<i64>,
}

impl Expiries {
    pub fn from_lines(lines: &[String]) -> Self {
        let expired = events(lines, "lease_expired");
        let mut keys: Vec<&str> = expired.iter().map(|l| l["lockKey"].as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut overdue: Vec<i64> = expired
            .iter()
            .map(|l| l["overdueMillis"].parse().unwrap())
            .collect();
        overdue.sort_unstable();
        Self {
            reported: expired.len(),
            keys: keys.len(),
            overdue,
        }
    }

    /// The latest any lease was reported, 0 when none was.
    pub fn max_overdue(&self) -> i64 {
        self.overdue.last().copied().unwrap_or(0)
    }
}

/// The daemon exited 0 having reported every lease exactly once, in its
/// log, in the table and to statsd.
pub async fn assert_every_lease_swept_once(
    code: Option<i32>,
    expiries: &Expiries,
    conn: &mut PgConnection,
    statsd: &StatsdCapture,
) {
    assert_eq!(code, Some(0));
    assert_eq!(
        (expiries.reported, expiries.keys),
        (LEASES as usize, LEASES as usize)
    );
    assert_eq!(count(conn, "SELECT count(*) FROM lock_entry").await, 0);
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        LEASES as u64
    );
}

/// No lease was reported later than `MAX_OVERDUE_MS`, and the daemon's peak
/// resident set stayed within `MAX_RSS_KIB`.
pub fn assert_on_time_and_small(max_overdue: i64, peak_rss_kib: u64) {
    assert!(
        max_overdue <= MAX_OVERDUE_MS,
        "a sweep was held up: max overdue {max_overdue} ms"
    );
    assert!(
        peak_rss_kib <= MAX_RSS_KIB,
        "peak RSS {peak_rss_kib} KiB over {MAX_RSS_KIB} KiB"
    );
}

/// The process's peak resident set (VmHWM), in KiB.
pub fn peak_rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}
