//! `lease-sweeper check` on a real PostgreSQL: passes on a migrated database,
//! fails with a clear list on an empty one, names the exact grants a
//! least-privilege role lacks (and those grants are enough for the daemon),
//! gives up quickly on a silent server, and never prints a password.

use std::time::{Duration, Instant};

use lease_sweeper::testing::check::{self, EXPECTED, GRANTS, Report};
use lease_sweeper::testing::config::{DbTarget, StatsdTarget};
use sqlx::{Connection as _, PgConnection};

use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, binary, count, daemon_env, events, insert_expired,
    wait_job_passes, wait_sweeps, wait_until,
};

/// Put into every URL these tests hand to `check`; must never be printed.
const PASSWORD: &str = "Pre-Fl1ght-S3cret";

/// `url` with a password. Servers with trust authentication (the throwaway
/// cluster) ignore it; a URL that already carries one keeps it. Returns the
/// URL and the password to look for in the output. (A role of the test's
/// own gets its password from `LoginRole::with_password`.)
fn with_credentials(url: &str, password: &str) -> (String, String) {
    let mut url = url::Url::parse(url).expect("test URL parses");
    if url.password().is_none() {
        url.set_password(Some(password)).unwrap();
    }
    let secret = url.password().unwrap().to_owned();
    (url.to_string(), secret)
}

async fn preflight(url: &str, statsd: &StatsdTarget) -> Report {
    let target = DbTarget::from_url("LOCKDB_URL", url).expect("URL parses");
    check::preflight(&target, statsd).await
}

fn line<'a>(report: &'a Report, what: &str) -> &'a check::Line {
    report
        .lines
        .iter()
        .find(|l| l.what == what)
        .unwrap_or_else(|| panic!("no line for {what:?} in:\n{report}"))
}

fn grant_line(grant: &check::Grant) -> String {
    format!("grant {} on {}", grant.privileges.join(", "), grant.on)
}

#[tokio::test]
async fn check_passes_on_a_migrated_database_and_never_prints_the_password() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let (url, secret) = with_credentials(&db.url, PASSWORD);

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();
    println!("{text}");

    assert!(report.passed(), "{text}");
    assert!(!text.contains(&secret), "{text}");
    assert!(
        line(&report, "migrations").detail.starts_with("all "),
        "{text}"
    );
    for object in EXPECTED {
        assert!(line(&report, &object.to_string()).ok, "{text}");
    }
    for grant in GRANTS {
        assert!(line(&report, &grant_line(grant)).ok, "{text}");
    }
    let statsd_line = format!("statsd 127.0.0.1:{}", statsd.port);
    assert!(line(&report, &statsd_line).ok, "{text}");
    assert!(
        text.lines()
            .all(|l| l.starts_with("ok ") || l.starts_with("check passed")),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "check passed: all {} checks ok\n",
            report.lines.len()
        )),
        "{text}"
    );
}

#[tokio::test]
async fn check_fails_with_a_clear_list_on_an_empty_database() {
    let db = TestDb::empty().await;
    let statsd = StatsdCapture::start().await;
    let (url, secret) = with_credentials(&db.url, PASSWORD);

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();
    println!("{text}");

    assert!(!report.passed(), "{text}");
    assert!(!text.contains(&secret), "{text}");
    assert!(report.lines[0].ok, "the connection works: {text}");
    let migrations = line(&report, "migrations");
    assert!(
        !migrations.ok && migrations.detail.contains("lease-sweeper migrate"),
        "{text}"
    );
    for object in EXPECTED {
        let l = line(&report, &object.to_string());
        assert!(!l.ok, "{text}");
        assert!(
            l.detail.starts_with("missing; run `lease-sweeper migrate`"),
            "{text}"
        );
    }
    for grant in GRANTS {
        assert!(!line(&report, &grant_line(grant)).ok, "{text}");
    }
    // Every FAIL line says what to do; the summary counts them.
    let expected_failures = 1 + EXPECTED.len() + GRANTS.len();
    assert_eq!(report.failed(), expected_failures, "{text}");
    assert!(
        text.ends_with(&format!(
            "check FAILED: {expected_failures} of {} checks failed (see the FAIL lines above)\n",
            report.lines.len()
        )),
        "{text}"
    );
    for l in text.lines().filter(|l| l.starts_with("FAIL")) {
        assert!(l.contains("lease-sweeper migrate"), "says what to do: {l}");
    }
}

/// Every `GRANT … TO <this role>` the report asks for, for `role`.
fn requested_grants(report: &Report, role: &str) -> Vec<String> {
    report
        .lines
        .iter()
        .filter(|l| !l.ok)
        .map(|l| {
            let start = l
                .detail
                .find("GRANT ")
                .unwrap_or_else(|| panic!("FAIL line without a GRANT to run: {l}"));
            l.detail[start..].replace("<this role>", role)
        })
        .collect()
}

#[tokio::test]
async fn check_names_the_grants_a_least_privilege_role_lacks_and_they_are_enough_to_sweep() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut admin = db.connect().await;
    let login = LoginRole::with_password(&db, &mut admin, "sweeper", PASSWORD, "").await;
    let role = login.role.clone();
    let (url, secret) = (login.url.clone(), PASSWORD);

    // A role with no grants: connects, sees the schema, may do nothing.
    let bare = preflight(&url, &statsd.target()).await;
    let text = bare.to_string();
    println!("{text}");
    assert!(!bare.passed(), "{text}");
    assert!(!text.contains(secret), "{text}");
    assert!(
        bare.lines[0].detail.contains(&format!("as role {role}")),
        "{text}"
    );
    for object in EXPECTED {
        assert!(
            line(&bare, &object.to_string()).ok,
            "visible to any role: {text}"
        );
    }
    // Every missing privilege is a FAIL line that ends in the GRANT to run.
    for grant in GRANTS {
        let l = line(&bare, &grant_line(grant));
        if !l.ok {
            assert!(l.detail.starts_with("this role lacks "), "{text}");
            assert!(l.detail.ends_with(" TO <this role>"), "{text}");
        }
    }
    assert!(
        text.contains("GRANT lease_sweeper TO <this role>"),
        "points at the shipped role: {text}"
    );

    // Grant exactly what the report asks for: then everything passes…
    let grants = requested_grants(&bare, &role);
    assert!(!grants.is_empty(), "{bare}");
    for grant in &grants {
        sqlx::raw_sql(sqlx::AssertSqlSafe(grant.clone()))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{grant}: {e}"));
    }
    let granted = preflight(&url, &statsd.target()).await;
    assert!(granted.passed(), "after {grants:#?}:\n{granted}");
    assert!(!granted.lines[0].detail.contains("superuser"), "{granted}");

    // …and the real daemon, as that role, sweeps without a single error.
    insert_expired(&mut admin, "lp-", 3, 10).await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&url, &port));
    wait_until(Duration::from_secs(10), "the sweep as the role", || async {
        events(&daemon.lines(), "lease_expired").len() == 3
    })
    .await;
    // One more whole pass of each service after that (a pass that failed
    // would send no gauge): the role lacks nothing either of them needs.
    wait_sweeps(&statsd, 2).await;
    wait_job_passes(&statsd, 2).await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    for failure in ["sweep_failed", "job_reap_failed"] {
        assert!(events(&lines, failure).is_empty(), "{}", lines.join("\n"));
    }
    assert!(!lines.join("\n").contains(secret));
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_entry").await,
        0
    );

    // Nothing asked for is decoration: take it all back, and check names
    // every privilege again while the sweep itself is refused by PostgreSQL.
    for grant in &grants {
        let revoke = grant
            .replacen("GRANT ", "REVOKE ", 1)
            .replace(" TO ", " FROM ");
        sqlx::raw_sql(sqlx::AssertSqlSafe(revoke.clone()))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{revoke}: {e}"));
    }
    let revoked = preflight(&url, &statsd.target()).await;
    assert_eq!(
        requested_grants(&revoked, &role),
        grants,
        "the same list again:\n{revoked}"
    );
    insert_expired(&mut admin, "denied-", 1, 10).await;
    let mut as_role = PgConnection::connect(&url).await.unwrap();
    let err = lease_sweeper::testing::lock_entry::reap_expired(&mut as_role, 10, None)
        .await
        .expect_err("the sweep needs what check asks for");
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("42501"),
        "{err}"
    );
    drop(as_role);

    login.drop(&mut admin).await;
}

#[tokio::test]
async fn check_passes_for_a_login_role_granted_the_migrated_lease_sweeper_role() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut admin = db.connect().await;
    let login =
        LoginRole::with_password(&db, &mut admin, "host", PASSWORD, "IN ROLE lease_sweeper").await;
    let (url, secret) = (login.url.clone(), PASSWORD);

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();

    assert!(
        report.passed(),
        "the shipped role and the preflight agree:\n{text}"
    );
    assert!(!text.contains(secret), "{text}");
    assert!(!report.lines[0].detail.contains("superuser"), "{text}");
    login.drop(&mut admin).await;
}

#[tokio::test]
async fn check_says_when_the_schema_is_there_but_not_usable_by_the_role() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut admin = db.connect().await;
    let login = LoginRole::with_password(&db, &mut admin, "nousage", PASSWORD, "").await;
    // PostgreSQL 15 lets PUBLIC use schema public; this database does not.
    sqlx::raw_sql("REVOKE USAGE ON SCHEMA public FROM PUBLIC")
        .execute(&mut admin)
        .await
        .unwrap();
    let url = login.url.clone();

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();

    let l = line(&report, "table lock_entry");
    assert!(!l.ok, "{text}");
    assert!(
        l.detail.starts_with(
            "not visible to this role, but found in schema public; GRANT USAGE ON SCHEMA public"
        ),
        "{text}"
    );
    let f = line(&report, "function fn_job_reap_stale_leases_apply");
    assert!(f.detail.contains("found in schema public"), "{text}");
    login.drop(&mut admin).await;
}

#[tokio::test]
async fn check_gives_up_on_a_silent_server_within_its_timeout_and_names_every_failure() {
    // Accepts TCP, never answers: the worst case for a preflight.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://sweeper:{PASSWORD}@127.0.0.1:{}/locks",
        silent.local_addr().unwrap().port()
    );
    let statsd = StatsdTarget {
        host: "statsd.invalid".into(),
        port: 8125,
    };

    let started = Instant::now();
    let report = preflight(&url, &statsd).await;
    let took = started.elapsed();
    let text = report.to_string();

    assert!(took >= check::CONNECT_TIMEOUT, "{took:?}");
    assert!(
        took < check::CONNECT_TIMEOUT + check::RESOLVE_TIMEOUT + Duration::from_secs(1),
        "{took:?}"
    );
    assert!(!text.contains(PASSWORD), "{text}");
    assert_eq!(report.lines.len(), 3, "{text}");
    assert!(!report.lines[0].ok);
    assert!(
        report.lines[0]
            .what
            .starts_with("connect postgres://sweeper@127.0.0.1:"),
        "{text}"
    );
    assert!(
        report.lines[0].detail.starts_with("no answer within 3 s"),
        "{text}"
    );
    assert_eq!(report.lines[1].what, "schema and privileges");
    assert!(!report.lines[1].ok, "{text}");
    assert_eq!(report.lines[2].what, "statsd statsd.invalid:8125");
    assert!(!report.lines[2].ok, "{text}");
    drop(silent);
}

#[tokio::test]
async fn the_check_command_exits_0_or_1_prints_its_list_on_stdout_and_no_password() {
    let migrated = TestDb::new().await;
    let empty = TestDb::empty().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    for (db, expected) in [(&migrated, 0), (&empty, 1)] {
        let (url, secret) = with_credentials(&db.url, PASSWORD);
        let started = Instant::now();
        let out = tokio::process::Command::new(binary())
            .arg("check")
            .env_clear()
            .env("LOCKDB_URL", &url)
            .env("STATSD_PORT", &port)
            .output()
            .await
            .expect("running lease-sweeper check");
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(expected), "{stdout}{stderr}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert!(!stdout.contains(&secret) && !stderr.contains(&secret));
        let verdict = if expected == 0 {
            "check passed"
        } else {
            "check FAILED"
        };
        assert!(
            stdout
                .trim_end()
                .lines()
                .last()
                .unwrap_or("")
                .starts_with(verdict),
            "{stdout}"
        );
        assert!(
            stdout.lines().count() > EXPECTED.len() + GRANTS.len(),
            "one line per check: {stdout}"
        );
        assert!(
            stderr.trim().is_empty(),
            "diagnostics only on trouble: {stderr}"
        );
    }
    // A configuration error stays exit 2, as for every command.
    let mut d = Daemon::spawn_args(
        &["check"],
        &[("LOCKDB_URL", "postgres://u:hunter2@host:notaport/db")],
    );
    let (code, _) = d.wait_exit(Duration::from_secs(10)).await;
    let all = d.lines().join("\n");
    assert_eq!(code, Some(2), "{all}");
    assert!(!all.contains("hunter2"), "{all}");
}
