//! The stale-lease reaper honours each job's own lease duration: the real
//! daemon reaps only a short-leased kind's stale jobs while a long-leased
//! kind's jobs claimed with them stay leased, and the dry run reports what
//! each stale job was given and where it came from.
//!
//! Owns none of the reaper's own behaviour (jobs::apply, jobs::daemon) or
//! which lease a claim gives (jobs::lease_duration::claims).

use std::collections::HashMap;
use std::time::Duration;

use lease_sweeper::testing::jobs::Format;
use serde_json::{Value, json};

use crate::jobs::support::{claim, dry_run, enqueue, given, set_kind};
use crate::support::{
    Daemon, SUBSTRATE, StatsdCapture, TestDb, daemon_env, events, insert_stale_jobs, open_gates,
    set_setting, wait_job_passes, wait_until,
};

#[tokio::test]
async fn reaps_short_kind_keeps_long_kind() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut conn = db.connect().await;
    open_gates(&mut conn).await;
    set_kind(&mut conn, "short", Some(1), "alice").await;
    set_kind(&mut conn, "long", Some(3600), "alice").await;
    let mut short = Vec::new();
    let mut long = Vec::new();
    for _ in 0..5 {
        short.push(enqueue(&mut conn, "short", json!({})).await);
        long.push(enqueue(&mut conn, "long", json!({})).await);
    }
    // A long-kind job whose own override is short goes with the short ones.
    let overridden = enqueue(&mut conn, "long", json!({"lease_override_sec": 1})).await;
    short.push(overridden.clone());
    let leased = claim(&mut conn, "worker-1").await;
    assert_eq!(leased.len(), 11, "one claim took them all");
    assert_eq!(leased[&overridden], given(1, "override"));

    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    daemon
        .wait_for_events("job_lease_expired", short.len(), Duration::from_secs(20))
        .await;
    // A few more passes: the long leases are still not stale.
    wait_job_passes(&statsd, 3).await;
    let (code, lines) = daemon.stop().await;

    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    let mut reaped: Vec<String> = events(&lines, "job_lease_expired")
        .iter()
        .map(|e| e["jobId"].clone())
        .collect();
    reaped.sort();
    short.sort();
    assert_eq!(reaped, short, "exactly the short-leased jobs, once each");
    let states: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT job_id::text, state, lease_owner FROM job_queue ORDER BY job_id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    for (id, state, owner) in states {
        if short.contains(&id) {
            assert_eq!((state.as_str(), owner), ("retry_waiting", None), "{id}");
        } else {
            assert!(long.contains(&id));
            assert_eq!(
                (state.as_str(), owner.as_deref()),
                ("leased", Some("worker-1")),
                "{id}"
            );
        }
    }
    assert_eq!(
        statsd.gauge("queue.lease.stale.current", "#backend:pg"),
        Some(0)
    );
}

#[tokio::test]
async fn dry_run_reports_duration_source() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_setting(&mut conn, SUBSTRATE, "true").await;
    set_setting(&mut conn, "queue.lease.duration_sec", "1").await;
    set_kind(&mut conn, "short", Some(1), "alice").await;
    let by_kind = enqueue(&mut conn, "short", json!({})).await;
    let by_override = enqueue(&mut conn, "other", json!({"lease_override_sec": 1})).await;
    let by_default = enqueue(&mut conn, "other", json!({})).await;
    claim(&mut conn, "w").await;
    // Leased without a claim (by hand, or before lease durations existed).
    let unknown = insert_stale_jobs(&mut conn, "by-hand", 1, 0, 5, 60_000).await;
    wait_until(Duration::from_secs(10), "four stale leases", || async {
        let mut c = db.connect().await;
        dry_run(&mut c, Some(10)).await["stale_lease_count"] == 4
    })
    .await;

    let out = dry_run(&mut conn, Some(10)).await;

    let reported: HashMap<String, (Value, Value)> = out["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["job_id"].as_str().unwrap().to_owned(),
                (
                    j["lease_duration_sec"].clone(),
                    j["lease_duration_source"].clone(),
                ),
            )
        })
        .collect();
    let want: HashMap<String, (Value, Value)> = [
        (by_kind, (json!(1), json!("kind"))),
        (by_override, (json!(1), json!("override"))),
        (by_default, (json!(1), json!("default"))),
        (unknown[0].clone(), (Value::Null, Value::Null)),
    ]
    .into_iter()
    .collect();
    assert_eq!(reported, want);

    // The table's LEASE column says the same.
    let mut text = Vec::new();
    let cmd = lease_sweeper::cli::JobsCommand::DryRun(lease_sweeper::cli::LimitArg { limit: 10 });
    lease_sweeper::testing::jobs::run_jobs(&db.target(), cmd, &mut text, Format::Table)
        .await
        .unwrap();
    let table = String::from_utf8(text).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "JOB",
            "KIND",
            "OWNER",
            "ATTEMPTS",
            "LEASE",
            "OVERDUE_S",
            "WOULD"
        ]
    );
    let lease_of = |id: &str| -> Vec<&str> {
        let row = lines.iter().find(|l| l.starts_with(id)).unwrap();
        row.split_whitespace().collect::<Vec<_>>()[4..6].to_vec()
    };
    for (id, (_, source)) in &want {
        match source.as_str() {
            Some(source) => assert_eq!(lease_of(id), ["1s", source], "{table}"),
            None => assert_eq!(lease_of(id)[0], "-", "{table}"),
        }
    }
}
