//! The shipped dashboard and rules against live series: a real Prometheus
//! (Debian's 2.42, loopback) scrapes the daemon's endpoint and mtail reading
//! the daemon's lines, with the shipped rules loaded, while expiries,
//! takeovers and job reaps flow. Every panel's query must parse and
//! evaluate, and the core panels must give the numbers this test produced.
//!
//! With `LEASE_SWEEPER_GRAPH_PNG=PATH` it also takes a screenshot of
//! Prometheus's graph page (headless Chromium) for the docs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::time::Duration;

use crate::observability::support::daemon_with_endpoint;
use crate::observability::support::{Mtail, Prometheus, repo};
use crate::support::{
    DRY_ONLY, StatsdCapture, TempDir, TestDb, daemon_env, insert_expired, insert_stale_jobs,
    open_gates, set_setting, wait_until,
};

/// Leases held all through (the held panels must read exactly this).
const HELD: i64 = 12;
/// Expired leases swept, in three waves so the graph shows steps.
const WAVES: [i64; 3] = [10, 15, 5];
/// Expired leases taken over by an acquire before any sweep.
const TAKEOVERS: i64 = 4;
/// Stale jobs reset, dead-lettered, and left stale behind a closed gate.
const RESET: i64 = 7;
const DEAD: i64 = 3;
const STALE: i64 = 4;

#[tokio::test]
async fn every_panel_evaluates() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut conn = db.connect().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;

    // The daemon's stdout, as a log file mtail tails.
    let logs = TempDir::new("dashboard-logs");
    let log = logs.join("lease-sweeper.log");
    std::fs::File::create(&log).unwrap();
    let mtail = Mtail::start(&log).await;
    let prometheus = Prometheus::start(&[("lease-sweeper", addr), ("mtail", mtail.addr)]).await;
    let mut copied = 0;
    let mut copy_lines = |daemon: &crate::support::Daemon| {
        let lines = daemon.lines();
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        for line in &lines[copied..] {
            writeln!(file, "{line}").unwrap();
        }
        copied = lines.len();
    };

    crate::support::acquire(&mut conn, "held-", HELD as usize, 3_600_000).await;
    let mut expired = 0;
    for (i, n) in WAVES.into_iter().enumerate() {
        insert_expired(&mut conn, &format!("wave{i}-"), n, 200).await;
        expired += n;
        let want = expired as usize;
        wait_until(Duration::from_secs(20), "a wave reported", || async {
            daemon.count_lines(|l| l.contains(" message=lease_expired ")) >= want
        })
        .await;
        copy_lines(&daemon);
        // Let Prometheus take a few samples between waves.
        wait_until(Duration::from_secs(20), "a wave scraped", || async {
            prometheus
                .value("sum(lock_lease_expired_total{job=\"lease-sweeper\"})")
                .await
                == Some(want as f64)
        })
        .await;
    }
    for i in 0..TAKEOVERS {
        // Planted expired and stolen in one transaction: no sweep can reap
        // it in between, so each one is a takeover.
        let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
        let key = format!("stolen-{i}-");
        insert_expired(&mut tx, &key, 1, 50).await;
        let token: Option<i64> =
            sqlx::query_scalar("SELECT lock_acquire($1, 'worker-new', 3600000)")
                .bind(format!("{key}1"))
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        assert!(token.is_some(), "the expired lease was stolen");
        tx.commit().await.unwrap();
    }
    open_gates(&mut conn).await;
    insert_stale_jobs(&mut conn, "mail", RESET, 0, 5, 1_000).await;
    insert_stale_jobs(&mut conn, "report", DEAD, 4, 5, 1_000).await;
    let jobs = (RESET + DEAD) as usize;
    wait_until(Duration::from_secs(20), "the jobs reaped", || async {
        daemon.count_lines(|l| l.contains(" message=job_lease_expired ")) >= jobs
    })
    .await;
    set_setting(&mut conn, DRY_ONLY, "true").await;
    insert_stale_jobs(&mut conn, "mail", STALE, 0, 5, 1_000).await;

    let lines = || daemon.count_lines(|l| l.contains(" message=lease_expired "));
    let total = expired + TAKEOVERS;
    wait_until(Duration::from_secs(30), "every expiry reported", || async {
        lines() >= total as usize
    })
    .await;
    copy_lines(&daemon);
    let held = HELD + TAKEOVERS;
    // What Prometheus must end up with, scraped from the daemon and mtail.
    let settled = [
        (
            "sum(lock_lease_expired_total{job=\"lease-sweeper\"})",
            total as f64,
        ),
        ("sum(lease_sweeper_log_lease_expired_total)", total as f64),
        (
            "sum(lease_sweeper_log_lease_expired_total{reaped_by=\"takeover\"})",
            TAKEOVERS as f64,
        ),
        (
            "sum(queue_lease_reaped_total{job=\"lease-sweeper\",action=\"reset_to_retry_waiting\"})",
            RESET as f64,
        ),
        (
            "sum(lease_sweeper_log_job_lease_expired_total{action=\"moved_to_dead_letter\"})",
            DEAD as f64,
        ),
        ("max(lock_held_current{job=\"lease-sweeper\"})", held as f64),
        (
            "max(queue_lease_stale_current{job=\"lease-sweeper\"})",
            STALE as f64,
        ),
    ];
    let queries = panel_queries();
    wait_until(
        Duration::from_secs(40),
        "Prometheus holding the final numbers, and every panel a result",
        || async {
            for (expr, want) in settled {
                if prometheus.value(expr).await != Some(want) {
                    return false;
                }
            }
            // A rate needs two samples of a series, and mtail exports a
            // labelled counter only from its first increment.
            for (_, expr) in &queries {
                let answer = prometheus.query(expr).await;
                if answer["data"]["result"]
                    .as_array()
                    .is_some_and(|r| r.is_empty())
                {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // Every panel's every query: parses, evaluates, and gives a result.
    let mut answers: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for (title, expr) in queries {
        let answer = prometheus.query(&expr).await;
        assert_eq!(answer["status"], "success", "{title}: {expr}: {answer}");
        let result = &answer["data"]["result"];
        assert!(
            result.as_array().is_some_and(|r| !r.is_empty()) || result.is_string(),
            "{title}: {expr} returned nothing: {answer}"
        );
        answers.insert(format!("{title} | {expr}"), answer);
    }
    assert!(answers.len() >= 15, "{} queries", answers.len());

    // The core panels, with this test's numbers.
    let single = |title: &str| {
        let (key, answer) = answers
            .iter()
            .find(|(k, _)| k.starts_with(&format!("{title} | ")))
            .unwrap_or_else(|| panic!("no panel {title:?}"));
        let result = answer["data"]["result"].as_array().unwrap();
        assert_eq!(result.len(), 1, "{key}: {answer}");
        result[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(single("Leases held now"), held as f64);
    assert_eq!(single("Stale job leases now"), STALE as f64);
    assert_eq!(single("Instances up"), 1.0);
    assert_eq!(single("Unparsed signal lines (mtail)"), 0.0);
    assert!(single("Lock-lease expiries (5m rate)") > 0.0);
    let labels = |title: &str, label: &str| -> BTreeSet<String> {
        answers
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{title} | ")))
            .flat_map(|(_, a)| a["data"]["result"].as_array().unwrap().clone())
            .filter_map(|s| Some(s["metric"][label].as_str()?.to_owned()))
            .collect()
    };
    assert_eq!(
        labels("Lock-lease expiries by reapedBy (log lines)", "reaped_by"),
        BTreeSet::from(["sweep".to_owned(), "takeover".to_owned()])
    );
    assert_eq!(
        labels("Job leases reaped per second, by action", "action"),
        BTreeSet::from([
            "moved_to_dead_letter".to_owned(),
            "reset_to_retry_waiting".to_owned()
        ])
    );
    for (key, answer) in answers
        .iter()
        .filter(|(k, _)| k.starts_with("Time since the last successful pass | "))
    {
        for sample in answer["data"]["result"].as_array().unwrap() {
            let age: f64 = sample["value"][1].as_str().unwrap().parse().unwrap();
            assert!((0.0..30.0).contains(&age), "{key}: {age} s");
        }
    }
    for (key, answer) in answers
        .iter()
        .filter(|(k, _)| k.starts_with("Failed passes per second | "))
    {
        for sample in answer["data"]["result"].as_array().unwrap() {
            assert_eq!(sample["value"][1], "0", "{key}");
        }
    }

    if let Ok(png) = std::env::var("LEASE_SWEEPER_GRAPH_PNG") {
        screenshot(&prometheus, &png);
    }
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));
}

/// (panel title, query) for every target of every panel in the dashboard.
fn panel_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/lease-sweeper.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        // Rows may nest panels.
        if let Some(inner) = panel["panels"].as_array() {
            panels.extend(inner);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                assert!(
                    !expr.contains('$'),
                    "{expr}: a Grafana variable this test cannot evaluate"
                );
                queries.push((panel["title"].as_str().unwrap().to_owned(), expr.to_owned()));
            }
        }
    }
    queries
}

/// Prometheus's graph page for the expiry counters and the held gauge.
fn screenshot(prometheus: &Prometheus, png: &str) {
    let chromium = crate::support::tool("chromium", "chromium");
    let enc = |e: &str| url::form_urlencoded::byte_serialize(e.as_bytes()).collect::<String>();
    let url = format!(
        "http://{}/graph?g0.expr={}&g0.tab=0&g0.range_input=30s&g1.expr={}&g1.tab=0&g1.range_input=30s",
        prometheus.addr,
        enc(concat!(
            "label_replace(sum(lock_lease_expired_total{job=\"lease-sweeper\"}), ",
            "\"from\", \"daemon counter\", \"\", \"\") or ",
            "label_replace(sum by (reaped_by) (lease_sweeper_log_lease_expired_total), ",
            "\"from\", \"mtail, log lines\", \"\", \"\")"
        )),
        enc("max(lock_held_current{job=\"lease-sweeper\"})"),
    );
    let profile = TempDir::new("chromium");
    let status = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1400,1500",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={png}"))
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running chromium");
    assert!(status.success(), "chromium: {status}");
}
