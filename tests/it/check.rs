//! `lease-sweeper check` on a real PostgreSQL: passes on a migrated database,
//! fails with a clear list on an empty one, names the exact grants a
//! least-privilege role lacks (and those grants are enough for the daemon),
//! warns without failing, gives up on a silent server within the target's
//! own timeout and walks on to the next host, says where its target came
//! from (and plainly when nothing named one), and never prints a password.

use std::time::{Duration, Instant};

use lease_sweeper::testing::check::{self, EXPECTED, GRANTS, Report, Status};
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

/// Runs the real `lease-sweeper check` with exactly `env` (nothing
/// inherited): its exit code, stdout and stderr.
async fn run_check(env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(binary())
        .arg("check")
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .await
        .expect("running lease-sweeper check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Where the test database is, as libpq's separate parameters: host (a
/// socket directory for the throwaway cluster), port, user, database.
fn parts(url: &str) -> (String, u16, String, String) {
    let url = url::Url::parse(url).expect("test URL parses");
    let host = url
        .query_pairs()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.into_owned())
        .or_else(|| url.host_str().map(str::to_owned))
        .expect("a host");
    let port = url.port().unwrap_or(5432);
    let db = url.path().trim_start_matches('/').to_owned();
    (host, port, url.username().to_owned(), db)
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
        line(&report, "migrations").detail.starts_with("all "),
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
async fn check_fails_with_a_clear_list_on_an_empty_database() {
    let db = TestDb::empty().await;
    let statsd = StatsdCapture::start().await;
    let (url, secret) = with_credentials(&db.url, PASSWORD);

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();
    println!("{text}");

    assert!(!report.passed(), "{text}");
    assert!(!text.contains(&secret), "{text}");
    assert_eq!(
        report.lines[0].status,
        Status::Warn,
        "the connection works, as a superuser: {text}"
    );
    let migrations = line(&report, "migrations");
    assert!(
        migrations.failed() && migrations.detail.contains("lease-sweeper migrate"),
        "{text}"
    );
    for object in EXPECTED {
        let l = line(&report, &object.to_string());
        assert!(l.failed(), "{text}");
        assert!(
            l.detail.starts_with("missing; run `lease-sweeper migrate`"),
            "{text}"
        );
    }
    for grant in GRANTS {
        assert!(line(&report, &grant_line(grant)).failed(), "{text}");
    }
    // No definer function exists yet, so only the superuser connection warns.
    assert_eq!(
        line(&report, "definer functions' owner").status,
        Status::Ok,
        "{text}"
    );
    // Every FAIL line says what to do; the summary counts them, and the
    // warning beside them.
    let expected_failures = 1 + EXPECTED.len() + GRANTS.len();
    assert_eq!(report.failed(), expected_failures, "{text}");
    assert_eq!(report.warned(), 1, "{text}");
    assert!(
        text.ends_with(&format!(
            "check FAILED: {expected_failures} of {} checks failed, 1 warning (see the FAIL and warn lines above)\n",
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
    // The cluster's superuser migrated: its definers' owner is the one warning.
    assert_eq!(warned_lines(&granted), [SUPERUSER_WARNINGS[1]], "{granted}");

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

/// A database migrated by a newer binary (a rolling upgrade migrates first):
/// this binary still works, so the line warns and the check passes.
#[tokio::test]
async fn check_warns_but_passes_when_the_database_has_newer_migrations() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let mut admin = db.connect().await;
    sqlx::raw_sql(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
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

/// What resolving the target ignored is a warning of its own, as `run` logs
/// it: here a password file others may read.
#[tokio::test]
async fn check_warns_about_a_password_file_it_ignores() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let passfile = std::env::temp_dir().join(format!("lst-check-pgpass-{}", db.name));
    std::fs::write(&passfile, format!("*:*:*:*:{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut url = url::Url::parse(&db.url).unwrap();
    url.query_pairs_mut()
        .append_pair("passfile", &passfile.display().to_string());
    let url = url.to_string();

    let report = preflight(&url, &statsd.target()).await;
    let text = report.to_string();
    std::fs::remove_file(&passfile).unwrap();

    let l = line(&report, "connection settings");
    assert_eq!(l.status, Status::Warn, "{text}");
    assert_eq!(
        l.detail,
        format!(
            "password file {:?} has group or world access; permissions should be u=rw (0600) \
             or less; it is ignored",
            passfile.display().to_string()
        ),
        "{text}"
    );
    assert!(report.passed(), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
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

#[tokio::test]
async fn check_gives_up_on_a_silent_server_within_the_targets_timeout_and_names_every_failure() {
    // Accepts TCP (the kernel completes the handshake), never answers: the
    // worst case for a preflight.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://sweeper:{PASSWORD}@127.0.0.1:{}/locks?connect_timeout=2",
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

    // Generous: it ends, on its own, and not before the host's timeout.
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(!text.contains(PASSWORD), "{text}");
    assert_eq!(report.lines.len(), 3, "{text}");
    assert!(report.lines[0].failed());
    assert!(
        report.lines[0]
            .what
            .starts_with("connect postgres://sweeper@127.0.0.1:"),
        "{text}"
    );
    assert!(
        report.lines[0].detail.starts_with(
            "no answer within 2 s; is the server up, and do the host and port name it?"
        ),
        "the target's own connect_timeout, and what to check: {text}"
    );
    assert_eq!(report.lines[1].what, "schema and privileges");
    assert!(report.lines[1].failed(), "{text}");
    assert_eq!(report.lines[2].what, "statsd statsd.invalid:8125");
    assert!(report.lines[2].failed(), "{text}");
    drop(silent);
}

/// A silent first host costs its whole `connect_timeout`, and check still
/// reaches the second: it gives the walk as long as the walk gives itself.
/// The timeout is 7 s, more than a preflight would pick for itself, so a
/// check with a shorter deadline of its own over the walk never gets past
/// the first host.
#[tokio::test]
async fn check_walks_past_a_silent_first_host_to_the_second_within_the_targets_timeout() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let (host, port, user, dbname) = parts(&db.url);
    let conninfo = format!(
        "host=127.0.0.1,{host} port={silent_port},{port} user={user} dbname={dbname} \
         connect_timeout=7"
    );

    let report = tokio::time::timeout(
        Duration::from_secs(60),
        preflight(&conninfo, &statsd.target()),
    )
    .await
    .expect("check ends on its own");
    let text = report.to_string();
    println!("{text}");

    let connect = &report.lines[0];
    assert!(!connect.failed(), "reached the second host: {text}");
    assert!(
        connect.detail.starts_with(&format!(
            "as role {user} on {host}:{port} (host 2 of 2), PostgreSQL "
        )),
        "names the host that answered: {text}"
    );
    assert!(report.passed(), "{text}");
    drop(silent);
}

#[tokio::test]
async fn check_says_which_variable_named_its_target() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let (host, pg_port, user, dbname) = parts(&db.url);
    let pg_port = pg_port.to_string();
    let cases: [(&[(&str, &str)], &str); 3] = [
        (&[("LOCKDB_URL", &db.url)], "(from LOCKDB_URL)"),
        (&[("DATABASE_URL", &db.url)], "(from DATABASE_URL)"),
        (
            &[
                ("PGHOST", &host),
                ("PGPORT", &pg_port),
                ("PGUSER", &user),
                ("PGDATABASE", &dbname),
            ],
            "(from PG variables (PGHOST PGPORT PGDATABASE PGUSER) + libpq defaults)",
        ),
    ];
    for (env, from) in cases {
        let mut env = env.to_vec();
        env.push(("STATSD_PORT", &port));
        let (code, stdout, stderr) = run_check(&env).await;
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let first = stdout.lines().next().unwrap_or("");
        assert!(
            first.starts_with("warn  connect postgres://")
                && first.contains(&format!(" {from}: as role {user}")),
            "{env:?}: {stdout}"
        );
        assert!(!stdout.contains("libpq's defaults"), "{stdout}");
    }
}

/// With no LOCKDB_URL, no DATABASE_URL and no PG* variable, check says so
/// before anything else, spells out what libpq's defaults then try, and how
/// to name the database instead.
#[tokio::test]
async fn check_says_plainly_when_nothing_names_its_target() {
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let me = pgconn::os_user_name().expect("the OS user name");

    let (code, stdout, stderr) = run_check(&[("STATSD_PORT", &port)]).await;

    let first = stdout.lines().next().unwrap_or("");
    let (status, rest) = first.split_once("  ").unwrap_or(("", ""));
    assert!(
        status == "FAIL" || status == "warn",
        "never a plain ok: {stdout}{stderr}"
    );
    assert_eq!(code, Some(if status == "FAIL" { 1 } else { 0 }), "{stdout}");
    let (what, detail) = rest.split_once(": ").unwrap_or(("", ""));
    assert!(
        what.starts_with(&format!("connect postgres://{me}@"))
            && what.ends_with(&format!("/{me} (libpq defaults)")),
        "{stdout}"
    );
    assert!(
        detail.starts_with(
            "neither LOCKDB_URL nor DATABASE_URL is set; using libpq's defaults \
             (no PG* variable is set either), so trying "
        ),
        "{stdout}"
    );
    assert!(
        detail.contains(&format!(" as role {me}, database {me}; ")),
        "what it tries: {stdout}"
    );
    assert!(
        detail.ends_with(
            "; set LOCKDB_URL=postgres://USER@HOST:PORT/DATABASE (or libpq's PGHOST, PGPORT, \
             PGUSER, PGDATABASE) to the database the daemon sweeps"
        ),
        "{stdout}"
    );
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
        // The superuser's warnings leave the exit status alone.
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("warn  ")).count(),
            if expected == 0 { 2 } else { 1 },
            "{stdout}"
        );
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

/// `check --help` shows a sample of the output; its numbers must be what
/// `check` prints on a freshly migrated database today, or a reader is told
/// of migrations and checks that do not exist. Both sides are the real
/// binary's output.
#[tokio::test]
async fn the_check_help_sample_counts_what_check_runs() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let run = |args: &'static [&'static str]| {
        let url = db.url.clone();
        let port = statsd.port.to_string();
        async move {
            let out = tokio::process::Command::new(binary())
                .args(args)
                .env_clear()
                .env("LOCKDB_URL", url)
                .env("STATSD_PORT", port)
                .output()
                .await
                .expect("running lease-sweeper");
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let help = run(&["check", "--help"]).await;
    let report = run(&["check"]).await;

    let migrations = report
        .lines()
        .find(|l| l.starts_with("ok    migrations: "))
        .unwrap_or_else(|| panic!("no migrations line in:\n{report}"));
    let migrations = migrations.trim_start_matches("ok    migrations: ");
    let verdict = report.trim_end().lines().last().unwrap();
    // Every check prints one status line; the tests migrate as a superuser,
    // so some are `warn` (the verdict then counts them apart).
    let checks = report
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("warn ") || l.starts_with("FAIL "))
        .count();
    let warned = report.lines().filter(|l| l.starts_with("warn ")).count();
    let expected = if warned == 0 {
        format!("check passed: all {checks} checks ok")
    } else {
        format!(
            "check passed: {} of {checks} checks ok, {warned} warning{}",
            checks - warned,
            if warned == 1 { "" } else { "s" }
        )
    };
    assert!(
        verdict.starts_with(&expected),
        "{verdict} vs {expected}:\n{report}"
    );
    let fix = "update the OUTPUT sample of CHECK_HELP in src/cli.rs (then refresh man/: \
               LEASE_SWEEPER_WRITE_MAN=1 cargo test --test it man::)";
    assert!(
        help.contains(&format!("migrations: {migrations}\n")),
        "check prints `migrations: {migrations}`, its help does not; {fix}:\n{help}"
    );
    assert!(
        help.contains(&format!("check passed: all {checks} checks ok"))
            && help.contains(&format!(" of {checks} checks failed")),
        "check runs {checks} checks (`{verdict}`), its help says otherwise; {fix}:\n{help}"
    );
}
