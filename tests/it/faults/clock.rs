//! A host clock an hour ahead or behind, under libfaketime: expiry is the
//! database's clock alone, so no live lease is deleted and `overdueMillis`
//! is the database's lateness.
//!
//! It owns the libfaketime lookup and the switch that skips the test where
//! libfaketime is missing; nothing else here reads the host clock. The test
//! prints its `FIGURES` lines (`--nocapture`) for docs/reliability.md.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::faults::support::{leases, reported, wait_output};
use crate::support::{
    Daemon, StatsdCapture, TestDb, acquire, daemon_env, events, insert_expired, wait_until,
};

/// Set to `1` to skip the host-clock test where libfaketime is missing; without
/// it, a missing libfaketime fails that test.
const SKIP_FAKETIME: &str = "LEASE_SWEEPER_SKIP_FAKETIME";

/// libfaketime's preload library, where Debian's `faketime` package puts it.
fn libfaketime() -> Option<std::path::PathBuf> {
    let mut candidates: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .collect();
    candidates.push("/usr/lib/faketime/libfaketime.so.1".into());
    candidates.push("/usr/local/lib/faketime/libfaketime.so.1".into());
    candidates.into_iter().find(|p| p.is_file())
}

/// Milliseconds since the Unix epoch of an RFC 3339 UTC `ts` such as
/// `2026-11-29T20:45:58.123Z`.
fn ts_millis(ts: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| ts[r].parse::<i64>().expect("ts digits");
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + n(20..23)
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Runs the real binary with its host clock shifted by `shift` (libfaketime
/// syntax) against leases live for 30 more minutes, leases 5 s overdue and
/// leases 30 min overdue. Returns (host clock skew seen, overdue reported).
async fn sweep_under_faketime(lib: &std::path::Path, shift: &str, skew_ms: i64) -> (i64, Vec<i64>) {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let live = acquire(&mut conn, "live-", 10, 1_800_000).await;
    let inserted_at = Instant::now();
    insert_expired(&mut conn, "recent-", 5, 5_000).await;
    insert_expired(&mut conn, "old-", 5, 1_800_000).await;
    let deadlines: HashMap<String, i64> = sqlx::query_as(
        "SELECT lock_key, floor(extract(epoch FROM expires_at) * 1000)::bigint FROM lock_entry",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let lib = lib.to_string_lossy().into_owned();
    let mut env = daemon_env(&db.url, &port);
    env.extend([("LD_PRELOAD", lib.as_str()), ("FAKETIME", shift)]);
    let mut daemon = Daemon::spawn(&env);
    wait_output(
        &daemon,
        Duration::from_secs(15),
        "the expired leases",
        |l| reported(l, false).len() == 10,
    )
    .await;
    let first = crate::support::fields(&daemon.lines()[0]);
    let seen_skew = ts_millis(&first["ts"]) - now_millis();
    assert!(
        (seen_skew - skew_ms).abs() < 60_000,
        "faketime {shift} did not take effect: the daemon's clock is off by {seen_skew} ms"
    );
    // The gauge sent after that sweep counts the live leases it left.
    wait_until(
        Duration::from_secs(10),
        "a gauge of the live leases",
        || async { statsd.gauge("lock.held.current", "#backend:pg") == Some(10) },
    )
    .await;
    assert_eq!(daemon.stop().await.0, Some(0));
    let since_insert = inserted_at.elapsed().as_millis() as i64;

    let lines = daemon.lines();
    let mut overdue = Vec::new();
    for f in events(&lines, "lease_expired") {
        let key = &f["lockKey"];
        assert!(!key.starts_with("live-"), "deleted a live lease: {f:?}");
        assert_eq!(f["expiredAtMillis"], deadlines[key].to_string(), "{f:?}");
        let ago = if key.starts_with("recent-") {
            5_000
        } else {
            1_800_000
        };
        let o: i64 = f["overdueMillis"].parse().unwrap();
        assert!(
            (ago..=ago + since_insert + 1_000).contains(&o),
            "overdueMillis {o} for a lease {ago} ms overdue (by the database): {f:?}"
        );
        overdue.push(o);
    }
    assert_eq!(overdue.len(), 10);
    assert_eq!(leases(&mut conn).await, live, "every live lease untouched");
    (seen_skew, overdue)
}

#[tokio::test]
async fn skewed_host_clock_deletes_no_live_lease() {
    let Some(lib) = libfaketime() else {
        // A missing tool must not pass as a proof: skipping is a choice the
        // runner states, never a default.
        assert!(
            std::env::var_os(SKIP_FAKETIME).is_some_and(|v| v == "1"),
            "libfaketime is not installed, so the host-clock test cannot run: \
             install it (apt-get install faketime), or set {SKIP_FAKETIME}=1 to skip this test"
        );
        eprintln!("SKIPPED: libfaketime not installed and {SKIP_FAKETIME}=1");
        return;
    };
    for (shift, skew) in [("+1h", 3_600_000), ("-1h", -3_600_000)] {
        let (seen, overdue) = sweep_under_faketime(&lib, shift, skew).await;
        eprintln!(
            "FIGURES clock {shift}: host_clock_skew={seen}ms live_deleted=0 \
             overdueMillis(5 s and 30 min overdue)={overdue:?}"
        );
    }
}
