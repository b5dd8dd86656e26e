//! `lease-sweeper check` reaching its target: warns about a password file it
//! ignores, gives up on a silent server within the target's own timeout and
//! walks on to the next host, says which variable named its target (and
//! plainly when nothing did), and never prints a password. What it finds in
//! the database is `check::schema`; the command's exit status and help are
//! `check::command`.

use std::time::{Duration, Instant};

use lease_sweeper::testing::check::Status;
use lease_sweeper::testing::config::StatsdTarget;

use crate::check::support::{PASSWORD, line, preflight};
use crate::support::{StatsdCapture, TestDb, binary};

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

/// What resolving the target ignored is a warning of its own, as `run` logs
/// it: here a password file others may read.
#[tokio::test]
async fn warns_about_ignored_password_file() {
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
async fn silent_server_gives_up_within_timeout() {
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
async fn walks_past_silent_first_host() {
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
async fn names_the_variable_of_its_target() {
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
async fn says_when_nothing_names_target() {
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
