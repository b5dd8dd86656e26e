//! The lateness histograms through the real binary: after a real sweep and
//! job pass, `lock_lease_overdue_seconds` counts exactly the `lease_expired`
//! lines of each way of reaping (sweep, takeover) and sums their
//! `overdueMillis`, `queue_lease_overdue_seconds` does the same per job
//! action, and StatsD gets one `lock.lease.overdue` timer per line (a batch
//! under the sampling bound is sent whole, unsampled).

use std::collections::HashMap;
use std::time::Duration;

use crate::observability::support::{daemon_with_endpoint, scrape, value};
use crate::support::{
    StatsdCapture, TestDb, daemon_env, events, exec, insert_expired, insert_stale_jobs, open_gates,
    wait_until,
};

/// `(count, sum in seconds)` of the lines' `overdueMillis`, per value of
/// `field`.
fn lateness_by(lines: &[HashMap<String, String>], field: &str) -> HashMap<String, (f64, f64)> {
    let mut by = HashMap::new();
    for l in lines {
        let entry: &mut (f64, f64) = by.entry(l[field].clone()).or_default();
        entry.0 += 1.0;
        entry.1 += l["overdueMillis"].parse::<f64>().unwrap() / 1_000.0;
    }
    by
}

#[tokio::test]
async fn histograms_count_lines_by_path() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    // Before the daemon starts: 12 leases to sweep, 4 stolen by an acquire
    // (takeovers), 5 stale jobs to reset and 2 to dead-letter.
    insert_expired(&mut conn, "late-swept-", 12, 700).await;
    insert_expired(&mut conn, "late-stolen-", 4, 300).await;
    exec(
        &mut conn,
        "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry \
         WHERE lock_key LIKE 'late-stolen-%'",
    )
    .await;
    open_gates(&mut conn).await;
    insert_stale_jobs(&mut conn, "mail", 5, 0, 5, 1_500).await;
    insert_stale_jobs(&mut conn, "mail", 2, 4, 5, 2_500).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;

    let count =
        |by: &str| format!("lock_lease_overdue_seconds_count{{backend=\"pg\",reaped_by=\"{by}\"}}");
    let job_count = |action: &str| {
        format!("queue_lease_overdue_seconds_count{{backend=\"pg\",action=\"{action}\"}}")
    };
    wait_until(
        Duration::from_secs(20),
        "every lease and job observed",
        || async {
            let text = scrape(addr).await;
            value(&text, &count("sweep")) == Some(12.0)
                && value(&text, &count("takeover")) == Some(4.0)
                && value(&text, &job_count("reset_to_retry_waiting")) == Some(5.0)
                && value(&text, &job_count("moved_to_dead_letter")) == Some(2.0)
        },
    )
    .await;
    let text = scrape(addr).await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));

    let leases = lateness_by(&events(&lines, "lease_expired"), "reapedBy");
    let jobs = lateness_by(&events(&lines, "job_lease_expired"), "action");
    let sum = |name: &str, label: &str, v: &str| {
        let series = format!("{name}_sum{{backend=\"pg\",{label}=\"{v}\"}}");
        value(&text, &series).unwrap_or_else(|| panic!("{series} in:\n{text}"))
    };
    for (by, (n, seconds)) in &leases {
        assert_eq!(value(&text, &count(by)), Some(*n), "{by}: {text}");
        let scraped = sum("lock_lease_overdue_seconds", "reaped_by", by);
        assert!(
            (scraped - seconds).abs() < 1e-6,
            "{by}: {scraped} s, lines {seconds} s"
        );
    }
    for (action, (n, seconds)) in &jobs {
        assert_eq!(
            value(&text, &job_count(action)),
            Some(*n),
            "{action}: {text}"
        );
        let scraped = sum("queue_lease_overdue_seconds", "action", action);
        assert!(
            (scraped - seconds).abs() < 1e-6,
            "{action}: {scraped} s, lines {seconds} s"
        );
    }
    let lines_per = |m: &HashMap<String, (f64, f64)>, k: &str| m.get(k).map_or(0.0, |v| v.0);
    assert_eq!(
        (lines_per(&leases, "sweep"), lines_per(&leases, "takeover")),
        (12.0, 4.0)
    );
    assert_eq!(
        (
            lines_per(&jobs, "reset_to_retry_waiting"),
            lines_per(&jobs, "moved_to_dead_letter")
        ),
        (5.0, 2.0)
    );

    // StatsD: one unsampled timer per line, tagged the same way.
    let timers = |name: &str, tags: &str| {
        statsd
            .lines()
            .iter()
            .filter(|l| l.starts_with(&format!("{name}:")) && l.ends_with(&format!("|ms|{tags}")))
            .count()
    };
    let expected = [
        ("lock.lease.overdue", "#backend:pg,reaped_by:sweep", 12),
        ("lock.lease.overdue", "#backend:pg,reaped_by:takeover", 4),
        (
            "queue.lease.overdue",
            "#backend:pg,action:reset_to_retry_waiting",
            5,
        ),
        (
            "queue.lease.overdue",
            "#backend:pg,action:moved_to_dead_letter",
            2,
        ),
    ];
    wait_until(Duration::from_secs(10), "every timer received", || async {
        expected
            .iter()
            .all(|&(name, tags, n)| timers(name, tags) >= n)
    })
    .await;
    for (name, tags, n) in expected {
        assert_eq!(timers(name, tags), n, "{name} {tags}");
    }
}
