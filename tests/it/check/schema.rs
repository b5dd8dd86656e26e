//! `lease-sweeper check` against what the database holds: passes on a
//! migrated database, fails with a clear list on an empty one, names the
//! exact grants a least-privilege role lacks (and those grants are enough for
//! the daemon), passes for a role granted the shipped one, warns without
//! failing on newer migrations, and says when the schema is there but not
//! usable; never printing a password. How check reaches its target is
//! `check::connection`; the command's exit status and help are `check::command`.

use std::time::Duration;

use lease_sweeper::testing::check::{self, EXPECTED, GRANTS, Report, Status};
use sqlx::{Connection as _, PgConnection};

use crate::check::support::{PASSWORD, line, preflight, with_credentials};
use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, count, daemon_env, events, insert_expired,
    wait_job_passes, wait_sweeps, wait_until,
};

fn grant_line(grant: &check::Grant) -> String {
    format!("grant {} on {}", grant.privileges.join(", "), grant.on)
}

/// The test cluster's superuser connects: the two warnings every check
/// against it carries, and nothing else may warn.
const SUPERUSER_WARNINGS: [&str; 2] = ["connect ", "definer functions' owner"];

fn warned_lines(report: &Report) -> Vec<&str> {
    report
        .lines
        .iter()
        .filter(|l| l.status == Status::Warn)
        .map(|l| l.what.as_str())
        .collect()
}

#[tokio::test]
async fn passes_when_migrated_without_password() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let (url, secret) = with_credentials(&db.url, PASSWORD);

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();
    println!("{text}");

    assert!(report.passed(), "{text}");
    assert!(!text.contains(&secret), "{text}");
    let connect = &report.lines[0];
    assert!(
        connect.what.ends_with(" (from LOCKDB_URL)"),
        "says where the target came from: {text}"
    );
    assert!(
        connect
            .detail
            .contains("; superuser: every privilege check passes"),
        "{text}"
    );
    assert_eq!(line(&report, "migrations").status, Status::Ok, "{text}");
    assert!(
        line(&report, "migrations")
            .detail
            .starts_with("1 of 1 versioned migrations applied"),
        "{text}"
    );
    for object in EXPECTED {
        assert_eq!(
            line(&report, &object.to_string()).status,
            Status::Ok,
            "{text}"
        );
    }
    for grant in GRANTS {
        assert_eq!(
            line(&report, &grant_line(grant)).status,
            Status::Ok,
            "{text}"
        );
    }
    let statsd_line = format!("statsd 127.0.0.1:{}", statsd.port);
    assert_eq!(line(&report, &statsd_line).status, Status::Ok, "{text}");
    // The superuser is flagged, not failed: two warn lines, aligned like
    // the others, and a verdict that passes and counts them.
    let warned = warned_lines(&report);
    assert_eq!(warned.len(), 2, "{text}");
    assert!(warned[0].starts_with(SUPERUSER_WARNINGS[0]), "{text}");
    assert_eq!(warned[1], SUPERUSER_WARNINGS[1], "{text}");
    assert!(
        text.lines().all(|l| l.starts_with("ok    ")
            || l.starts_with("warn  ")
            || l.starts_with("check passed")),
        "{text}"
    );
    assert_eq!(text.lines().filter(|l| l.starts_with("warn  ")).count(), 2);
    assert!(
        text.ends_with(&format!(
            "check passed: {} of {} checks ok, 2 warnings (see the warn lines above)\n",
            report.lines.len() - 2,
            report.lines.len()
        )),
        "{text}"
    );
}

#[tokio::test]
async fn unmigrated_fails_once_saying_migrate() {
    let db = TestDb::empty().await;
    let statsd = StatsdCapture::start().await;
    let (url, secret) = with_credentials(&db.url, PASSWORD);

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();
    println!("{text}");

    assert!(!report.passed(), "{text}");
    assert!(!text.contains(&secret), "{text}");
    // The connect and statsd lines name their target after the check.
    let statuses: Vec<(&str, Status)> = report
        .lines
        .iter()
        .map(|l| (l.what.split(' ').next().unwrap(), l.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("connect", Status::Warn), // as a superuser
            ("schema", Status::Fail),
            ("definer", Status::Ok),
            ("overloads", Status::Ok),
            ("horizon", Status::Ok), // a superuser sees every session
            ("statsd", Status::Ok),
        ],
        "{text}"
    );
    assert_eq!(
        line(&report, "schema").detail,
        format!(
            "not migrated (no migration applied, none of the {} tables, indexes and functions \
             the daemon uses exists); run `lease-sweeper migrate` with a role that may create objects",
            EXPECTED.len()
        ),
        "{text}"
    );
    assert!(
        text.ends_with(
            "check FAILED: 1 of 6 checks failed, 1 warning (see the FAIL and warn lines above)\n"
        ),
        "{text}"
    );
}

/// A database that was migrated and then lost an object is not "not
/// migrated": each missing object keeps its own line.
#[tokio::test]
async fn names_each_missing_object() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    sqlx::query("DROP FUNCTION lock_sweep_probe(bigint)")
        .execute(&mut conn)
        .await
        .unwrap();
    let statsd = StatsdCapture::start().await;

    let report = preflight(&db.url, &statsd.target()).await;
    let text = report.to_string();

    let failed: Vec<String> = report
        .lines
        .iter()
        .filter(|l| l.failed())
        .map(|l| l.to_string())
        .collect();
    assert_eq!(
        failed,
        [
            "FAIL  functions: lock_sweep_probe missing from the database (a daemon's call of it fails); run `lease-sweeper migrate` with this binary",
            "FAIL  function lock_sweep_probe: missing; run `lease-sweeper migrate` with a role that may create objects",
            "FAIL  grant EXECUTE on function lock_sweep_probe: function lock_sweep_probe is missing; run `lease-sweeper migrate` with a role that may create objects",
        ],
        "{text}"
    );
    assert_eq!(line(&report, "migrations").status, Status::Ok, "{text}");
}

/// Every `GRANT … TO <this role>` the report asks for, for `role`.
fn requested_grants(report: &Report, role: &str) -> Vec<String> {
    report
        .lines
        .iter()
        .filter(|l| l.failed())
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
async fn names_missing_grants_enough_to_sweep() {
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
        assert_eq!(
            line(&bare, &object.to_string()).status,
            Status::Ok,
            "visible to any role: {text}"
        );
    }
    // Every missing privilege is a FAIL line that ends in the GRANT to run.
    for grant in GRANTS {
        let l = line(&bare, &grant_line(grant));
        if l.failed() {
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
    assert_eq!(granted.lines[0].status, Status::Ok, "{granted}");
    assert!(!granted.lines[0].detail.contains("superuser"), "{granted}");
    // The cluster's superuser migrated: its definers' owner is one warning;
    // the other, that the horizon check sees less without pg_read_all_stats,
    // which is the operator's to grant, not a privilege the sweep needs.
    assert_eq!(
        warned_lines(&granted),
        [SUPERUSER_WARNINGS[1], "horizon check's view of sessions"],
        "{granted}"
    );

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
    let err = lease_sweeper::testing::lock_entry::reap_batch(&mut as_role, 10, None)
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
async fn passes_for_login_role_granted_lease_sweeper() {
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

/// A database migrated by a newer binary (a rolling upgrade migrates first):
/// this binary still works, so the line warns and the check passes.
#[tokio::test]
async fn newer_migrations_warn_but_pass() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut admin = db.connect().await;
    sqlx::raw_sql(
        "INSERT INTO lease_sweeper_migrations (version, description, success, checksum, execution_time)
         VALUES (99991231000000, 'from a newer binary', true, '\\x00', 1)",
    )
    .execute(&mut admin)
    .await
    .unwrap();

    let report = preflight(&db.url, &statsd.target()).await;
    let text = report.to_string();

    let l = line(&report, "migrations");
    assert_eq!(l.status, Status::Warn, "{text}");
    assert!(
        l.detail.ends_with(
            "; the database also has 1 newer (99991231000000): fine while an upgrade rolls out, \
             else deploy the binary that shipped them"
        ),
        "{text}"
    );
    assert!(report.passed(), "{text}");
    assert_eq!(report.warned(), 3, "with the superuser's two: {text}");
}

#[tokio::test]
async fn says_when_schema_unusable_by_role() {
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
    assert!(l.failed(), "{text}");
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
