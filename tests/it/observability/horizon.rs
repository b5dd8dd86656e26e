//! The horizon check names what holds the xmin horizon while the swept
//! tables keep dead rows, once, and says once when the hold ends: a
//! forgotten transaction, a prepared transaction, an abandoned replication
//! slot, a query on a standby that sends feedback without a slot; a
//! hostile application_name or gid stays one escaped value; a role without
//! pg_read_all_stats still names the holder and says what it cannot see; a
//! check refused by the server says why once while sweeps go on.
//! Real holders on a real server, the real binary.

use std::collections::HashMap;
use std::time::Duration;

use lease_sweeper::testing::check::{Status, preflight};
use lease_sweeper::testing::config::DbTarget;
use lease_sweeper::testing::throwaway::{StopMode, ThrowawayPg};
use sqlx::{Connection as _, PgConnection};

use crate::observability::support::{daemon_with_endpoint, scrape, value};
use crate::privilege::support::GRANTED;
use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, acquire, daemon_env, events, exec, free_port, poll,
    wait_until,
};

const HELD: &str = "xmin_horizon_held";
const RELEASED: &str = "xmin_horizon_released";
/// Leases acquired, expired and swept behind each hold: its dead rows.
const LEASES: usize = 50;
/// A hold is named 15 s after it began, at a check every 10 s.
const WAIT: Duration = Duration::from_secs(60);

/// The fields every `xmin_horizon_held` line has, in order, after `ts`,
/// `level` and `message`.
const HELD_FIELDS: [&str; 13] = [
    "holder",
    "pid",
    "applicationName",
    "clientAddr",
    "state",
    "backendType",
    "heldSeconds",
    "ageFrom",
    "xminAgeXids",
    "slotName",
    "gid",
    "deadLockEntryRows",
    "deadJobQueueRows",
];

/// Opens a REPEATABLE READ transaction on `conn` named `app` that reads
/// `lock_entry` and stays open; returns its pid and the application_name
/// the server reports for it.
async fn forget_a_report(conn: &mut PgConnection, app: &str) -> (i32, String) {
    sqlx::query("SELECT set_config('application_name', $1, false)")
        .bind(app)
        .execute(&mut *conn)
        .await
        .unwrap();
    exec(
        conn,
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM lock_entry",
    )
    .await;
    sqlx::query_as(
        "SELECT pid, application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Dead rows behind the hold: `LEASES` leases acquired, expired and swept.
async fn sweep_leases(conn: &mut PgConnection, daemon: &Daemon) {
    acquire(conn, "horizon-", LEASES, 100).await;
    daemon.wait_for_events("lease_expired", LEASES, WAIT).await;
}

/// Waits for `n` lines of `event`, then returns them (each decoded).
async fn wait_lines(daemon: &Daemon, event: &str, n: usize) -> Vec<HashMap<String, String>> {
    daemon.wait_for_events(event, n, WAIT).await;
    events(&daemon.lines(), event)
}

/// Stops the daemon and asserts it wrote exactly `held` WARN and `released`
/// INFO horizon lines, and no error.
async fn stop_and_count(daemon: &mut Daemon, held: usize, released: usize) {
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert_eq!(
        (events(&lines, HELD).len(), events(&lines, RELEASED).len()),
        (held, released),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("level=error")),
        "{lines:#?}"
    );
}

fn seconds(f: &HashMap<String, String>) -> u64 {
    f["heldSeconds"].parse().expect("heldSeconds is a number")
}

#[tokio::test]
async fn forgotten_transaction_named_and_gauged() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&db.url, &port)).await;
    let mut conn = db.connect().await;
    let mut report = db.connect().await;
    let (pid, _) = forget_a_report(&mut report, "forgotten-report").await;
    sweep_leases(&mut conn, &daemon).await;

    let held = wait_lines(&daemon, HELD, 1).await;
    let f = &held[0];
    assert_eq!(f["level"], "warn");
    let pid = pid.to_string();
    let expect = [
        ("holder", "session"),
        ("pid", pid.as_str()),
        ("applicationName", "forgotten-report"),
        ("clientAddr", "local"),
        ("state", "idle in transaction"),
        ("backendType", "client backend"),
        ("ageFrom", "server"),
        ("slotName", ""),
        ("gid", ""),
        ("deadLockEntryRows", "50"),
        ("deadJobQueueRows", "0"),
    ];
    for (k, v) in expect {
        assert_eq!((k, f[k].as_str()), (k, v), "{f:?}");
    }
    assert!(seconds(f) >= 15, "{f:?}");
    assert!(f["xminAgeXids"].parse::<i64>().unwrap() >= 1, "{f:?}");

    // The gauges, in both sinks.
    let text = scrape(addr).await;
    assert_eq!(
        value(&text, "pg_dead_rows_current{table=\"lock_entry\"}"),
        Some(50.0)
    );
    assert!(value(&text, "pg_xmin_horizon_age_seconds").unwrap() >= 15.0);
    assert_eq!(
        statsd.gauge("pg.dead_rows.current", "#table:lock_entry"),
        Some(50)
    );
    assert!(statsd.gauge("pg.xmin_horizon.age_seconds", "").unwrap() >= 15);

    exec(&mut report, "COMMIT").await;
    let released = wait_lines(&daemon, RELEASED, 1).await;
    let r = &released[0];
    assert_eq!(
        (r["level"].as_str(), r["holder"].as_str(), r["pid"].as_str()),
        ("info", "session", pid.as_str())
    );
    assert!(seconds(r) >= seconds(f), "{r:?}");
    wait_until(WAIT, "the age gauge back to 0", || async {
        value(&scrape(addr).await, "pg_xmin_horizon_age_seconds") == Some(0.0)
    })
    .await;
    stop_and_count(&mut daemon, 1, 1).await;
}

#[tokio::test]
async fn prepared_transaction_named_by_gid() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    let mut conn = db.connect().await;
    let mut twopc = db.connect().await;
    exec(
        &mut twopc,
        "BEGIN; SELECT count(*) FROM lock_entry; PREPARE TRANSACTION 'forgotten-2pc'",
    )
    .await;
    sweep_leases(&mut conn, &daemon).await;

    let held = wait_lines(&daemon, HELD, 1).await;
    let f = &held[0];
    for (k, v) in [
        ("holder", "prepared_transaction"),
        ("pid", ""),
        ("applicationName", ""),
        ("clientAddr", ""),
        ("state", "prepared"),
        ("ageFrom", "server"),
        ("slotName", ""),
        ("gid", "forgotten-2pc"),
        ("deadLockEntryRows", "50"),
    ] {
        assert_eq!((k, f[k].as_str()), (k, v), "{f:?}");
    }
    assert!(seconds(f) >= 15, "{f:?}");

    exec(&mut conn, "ROLLBACK PREPARED 'forgotten-2pc'").await;
    let released = wait_lines(&daemon, RELEASED, 1).await;
    assert_eq!(
        (released[0]["holder"].as_str(), released[0]["gid"].as_str()),
        ("prepared_transaction", "forgotten-2pc")
    );
    stop_and_count(&mut daemon, 1, 1).await;
}

#[tokio::test]
async fn abandoned_slot_named_until_dropped() {
    const SLOT: &str = "forgotten_slot";
    // A cluster of its own: a slot's xmin holds every database of it.
    let primary_port = free_port();
    let primary = ThrowawayPg::start_tcp(
        primary_port,
        &[("hot_standby_feedback", "on"), ("primary_slot_name", SLOT)],
    )
    .expect("a primary");
    let url = primary.url("postgres");
    let mut conn = PgConnection::connect(&url).await.unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    exec(
        &mut conn,
        "SELECT pg_create_physical_replication_slot('forgotten_slot', true)",
    )
    .await;
    // A standby with hot_standby_feedback gives the slot its xmin, which
    // the slot keeps once the standby is gone.
    let mut standby = ThrowawayPg::standby_of(&primary, free_port()).expect("a standby");
    let xmin_of_slot =
        "SELECT xmin::text FROM pg_replication_slots WHERE slot_name = 'forgotten_slot'";
    poll(
        WAIT,
        "the standby's feedback to reach the slot",
        async || {
            let xmin: Option<String> = sqlx::query_scalar(xmin_of_slot)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            xmin.ok_or_else(|| "no xmin yet".to_owned())
        },
    )
    .await;
    standby.stop(StopMode::Fast);
    drop(standby);

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&url, &port));
    sweep_leases(&mut conn, &daemon).await;

    let held = wait_lines(&daemon, HELD, 1).await;
    let f = &held[0];
    for (k, v) in [
        ("holder", "replication_slot"),
        ("pid", ""),
        ("state", "inactive"),
        ("backendType", "physical"),
        ("ageFrom", "first_seen"),
        ("slotName", SLOT),
        ("gid", ""),
        ("deadLockEntryRows", "50"),
    ] {
        assert_eq!((k, f[k].as_str()), (k, v), "{f:?}");
    }
    assert!(seconds(f) >= 15, "{f:?}");

    exec(
        &mut conn,
        "SELECT pg_drop_replication_slot('forgotten_slot')",
    )
    .await;
    let released = wait_lines(&daemon, RELEASED, 1).await;
    assert_eq!(
        (
            released[0]["holder"].as_str(),
            released[0]["slotName"].as_str()
        ),
        ("replication_slot", SLOT)
    );
    stop_and_count(&mut daemon, 1, 1).await;
}

#[tokio::test]
async fn standby_feedback_without_slot_is_named() {
    // A cluster of its own: a standby's feedback holds every database of it.
    // The standby inherits hot_standby_feedback; `pg_basebackup -R` gives it
    // no slot, so the primary keeps the feedback on the walsender alone.
    let primary =
        ThrowawayPg::start_tcp(free_port(), &[("hot_standby_feedback", "on")]).expect("a primary");
    let url = primary.url("postgres");
    let mut conn = PgConnection::connect(&url).await.unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    let standby = ThrowawayPg::standby_of(&primary, free_port()).expect("a standby");
    let mut query = PgConnection::connect(&standby.url("postgres"))
        .await
        .unwrap();
    exec(
        &mut query,
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM lock_entry",
    )
    .await;
    let snapshot_xmin: String =
        sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
            .fetch_one(&mut query)
            .await
            .unwrap();
    // The walsender takes the standby's oldest snapshot as its own xmin when
    // the next feedback arrives (every wal_receiver_status_interval).
    let (walsender, app, addr, state): (i32, String, String, String) = poll(
        WAIT,
        "the standby's query to reach the primary's walsender",
        async || {
            let row: Option<(i32, String, String, String, Option<String>)> = sqlx::query_as(
                "SELECT pid, application_name, host(client_addr), state, backend_xmin::text \
                   FROM pg_stat_replication",
            )
            .fetch_optional(&mut conn)
            .await
            .unwrap();
            match row {
                Some((pid, app, addr, state, Some(xmin))) if xmin == snapshot_xmin => {
                    Ok((pid, app, addr, state))
                }
                other => Err(format!("{other:?}, the query's xmin {snapshot_xmin}")),
            }
        },
    )
    .await;
    assert_eq!(
        (app.as_str(), addr.as_str(), state.as_str()),
        ("walreceiver", "127.0.0.1", "streaming")
    );
    let slots: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(slots, 0);

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&url, &port));
    sweep_leases(&mut conn, &daemon).await;

    let held = wait_lines(&daemon, HELD, 1).await;
    let f = &held[0];
    let walsender = walsender.to_string();
    for (k, v) in [
        ("holder", "standby"),
        ("pid", walsender.as_str()),
        ("applicationName", app.as_str()),
        ("clientAddr", addr.as_str()),
        ("state", state.as_str()),
        ("backendType", "walsender"),
        ("ageFrom", "first_seen"),
        ("slotName", ""),
        ("gid", ""),
        ("deadLockEntryRows", "50"),
        ("deadJobQueueRows", "0"),
    ] {
        assert_eq!((k, f[k].as_str()), (k, v), "{f:?}");
    }
    assert!(seconds(f) >= 15, "{f:?}");
    // Every acquire behind the hold spent a transaction id.
    assert!(
        f["xminAgeXids"].parse::<usize>().unwrap() >= LEASES,
        "{f:?}"
    );

    exec(&mut query, "COMMIT").await;
    let released = wait_lines(&daemon, RELEASED, 1).await;
    let r = &released[0];
    assert_eq!(
        (
            r["level"].as_str(),
            r["holder"].as_str(),
            r["pid"].as_str(),
            r["slotName"].as_str()
        ),
        ("info", "standby", walsender.as_str(), "")
    );
    assert!(seconds(r) >= seconds(f), "{r:?}");
    stop_and_count(&mut daemon, 1, 1).await;
}

#[tokio::test]
async fn hostile_names_stay_one_value() {
    const APP: &str = "forgotten-report\" level=error message=lease_expired x=\"\ny";
    const GID: &str = "forgotten\nts=0 level=error message=lease_expired gid=forged";
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    let mut conn = db.connect().await;
    let mut report = db.connect().await;
    // PostgreSQL turns the newline of an application_name into `?`; the
    // quotes, `=` and spaces it keeps. A gid keeps its newline.
    let (_, app) = forget_a_report(&mut report, APP).await;
    assert_eq!(app, APP.replace('\n', "?"));
    let mut twopc = db.connect().await;
    exec(
        &mut twopc,
        "BEGIN; SELECT 1; \
         PREPARE TRANSACTION E'forgotten\\nts=0 level=error message=lease_expired gid=forged'",
    )
    .await;
    sweep_leases(&mut conn, &daemon).await;

    let held = wait_lines(&daemon, HELD, 2).await;
    let lines: Vec<String> = daemon
        .lines()
        .into_iter()
        .filter(|l| l.contains(HELD))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for line in &lines {
        let pairs = lease_sweeper::testing::logfmt::decode_line(line).expect("one logfmt line");
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        let mut expected = vec!["ts", "level", "message"];
        expected.extend(HELD_FIELDS);
        assert_eq!(keys, expected, "{line}");
    }
    let by_kind = |kind: &str| held.iter().find(|f| f["holder"] == kind).unwrap().clone();
    assert_eq!(by_kind("session")["applicationName"], app);
    assert_eq!(by_kind("prepared_transaction")["gid"], GID);

    exec(&mut report, "COMMIT").await;
    exec(
        &mut conn,
        &format!("ROLLBACK PREPARED E'{}'", GID.replace('\n', "\\n")),
    )
    .await;
    wait_lines(&daemon, RELEASED, 2).await;
    let (_, all) = daemon.stop().await;
    // No line but the daemon's own starts a line: nothing was forged.
    assert!(all.iter().all(|l| l.starts_with("ts=")), "{all:#?}");
    assert_eq!(
        all.iter()
            .filter(|l| crate::support::fields(l)["level"] == "error")
            .count(),
        0,
        "{all:#?}"
    );
}

#[tokio::test]
async fn without_read_all_stats_holder_named() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "horizon", GRANTED).await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, &port));
    let mut report = db.connect().await;
    let (pid, _) = forget_a_report(&mut report, "forgotten-report").await;
    sweep_leases(&mut admin, &daemon).await;

    let held = wait_lines(&daemon, HELD, 1).await;
    let f = &held[0];
    let pid = pid.to_string();
    for (k, v) in [
        ("holder", "session"),
        ("pid", pid.as_str()),
        ("applicationName", "forgotten-report"),
        ("clientAddr", "hidden"),
        ("state", "hidden"),
        ("backendType", "hidden"),
        ("ageFrom", "first_seen"),
        ("deadLockEntryRows", "50"),
    ] {
        assert_eq!((k, f[k].as_str()), (k, v), "{f:?}");
    }
    exec(&mut report, "COMMIT").await;
    wait_lines(&daemon, RELEASED, 1).await;
    let partial = events(&daemon.lines(), "xmin_horizon_partial_view");
    assert_eq!(partial.len(), 1);
    assert_eq!(partial[0]["level"], "warn");
    assert_eq!(partial[0]["missing"], "pg_read_all_stats");
    stop_and_count(&mut daemon, 1, 1).await;

    // The preflight says the same as a warning, and no more once granted.
    let view = async |url: &str| {
        let target = DbTarget::from_url("LOCKDB_URL", url).unwrap();
        let report = preflight(&target, &statsd.target()).await;
        let line = report
            .lines
            .into_iter()
            .find(|l| l.what == "horizon check's view of sessions")
            .expect("a horizon line");
        (line.status, line.detail)
    };
    let (status, detail) = view(&sweeper.url).await;
    assert_eq!(status, Status::Warn, "{detail}");
    assert!(
        detail.contains("GRANT pg_read_all_stats TO lease_sweeper"),
        "{detail}"
    );
    exec(
        &mut admin,
        &format!("GRANT pg_read_all_stats TO {}", sweeper.role),
    )
    .await;
    assert_eq!(view(&sweeper.url).await.0, Status::Ok);
    sweeper.drop(&mut admin).await;
}

#[tokio::test]
async fn denied_check_says_why_once() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "denied", GRANTED).await;
    // A view the check reads, taken from PUBLIC in this database only.
    exec(
        &mut admin,
        "REVOKE SELECT ON pg_catalog.pg_prepared_xacts FROM PUBLIC",
    )
    .await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let (mut daemon, addr) = daemon_with_endpoint(&daemon_env(&sweeper.url, &port)).await;
    let failures = "lease_sweeper_pass_failures_total{service=\"horizon_check\"}";
    wait_until(WAIT, "two failed horizon checks", || async {
        value(&scrape(addr).await, failures).is_some_and(|n| n >= 2.0)
    })
    .await;
    sweep_leases(&mut admin, &daemon).await;

    let failed = events(&daemon.lines(), "horizon_check_failed");
    assert_eq!(failed.len(), 1, "said once: {failed:#?}");
    assert!(
        failed[0]["error"].starts_with("xmin horizon check: `HOLDERS` failed: ")
            && failed[0]["error"].contains("permission denied for view pg_prepared_xacts")
            && failed[0]["error"].contains("SQLSTATE 42501"),
        "{failed:#?}"
    );
    exec(
        &mut admin,
        "GRANT SELECT ON pg_catalog.pg_prepared_xacts TO PUBLIC",
    )
    .await;
    daemon.wait_for_event("horizon_check_recovered", WAIT).await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert!(events(&lines, "sweep_failed").is_empty(), "{lines:#?}");
    assert_eq!(events(&lines, "lease_expired").len(), LEASES);
    sweeper.drop(&mut admin).await;
}
