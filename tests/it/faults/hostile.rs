//! Hostile input against the real binary: lock keys, owners, job kinds and
//! job owners built to forge, split or hide log lines; passwords that must
//! never reach any output; and inputs that must be refused clearly.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use lease_sweeper::testing::throwaway::ThrowawayPg;
use sqlx::PgConnection;

use crate::support::{
    Daemon, StatsdCapture, TempDir, TestDb, count, daemon_env, events, fields, open_gates,
    own_cluster, wait_until,
};

/// Values built to break a line-oriented log: line breaks of every kind,
/// quoting and escaping characters, `=`, controls, non-ASCII, forged pairs,
/// and 2 KB lengths (under the 2,704-byte b-tree limit of the primary key).
fn hostile_values() -> Vec<String> {
    let mut v: Vec<String> = [
        "line\nbreak",
        "carriage\rreturn",
        "crlf\r\nts=2026-01-01T00:00:00.000Z level=warn message=lease_expired lockKey=forged token=1",
        "forged\" level=error message=lease_expired lockKey=\"forged",
        "say \"hi\"",
        "\"",
        "back\\slash",
        "\\",
        "trailing\\",
        "a=b",
        "=",
        "lockKey=forged",
        "tab\there",
        " leading and trailing ",
        " ",
        "\u{1}start of heading",
        "esc\u{1b}[31mred\u{1b}[0m",
        "del\u{7f}",
        "bell\u{7} backspace\u{8} ff\u{c} vt\u{b}",
        "ünïcødé ✓ 鍵 🔒",
        "line\u{2028}separator\u{2029}paragraph",
        "next\u{85}line",
        "\u{feff}bom and zero\u{200b}width",
        "${jndi:ldap://x/a} %s%n <script>",
        "Robert'); DROP TABLE lock_entry;--",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.push("k".repeat(2048));
    v.push("k\n\"=\\\t".repeat(400));
    v.push("鍵".repeat(700));
    v.push("\u{2028}\u{1b}".repeat(400));
    v
}

/// The value as seen from any logfmt consumer: the line holds no raw byte a
/// line-oriented tool, a terminal or a JavaScript parser would act on.
fn assert_one_safe_line(line: &str) {
    for c in line.chars() {
        assert!(
            !(c < ' ' || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}'),
            "raw {c:?} in {line:?}"
        );
    }
}

#[tokio::test]
async fn hostile_values_decode_back_unchanged() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let values = hostile_values();
    // Swept leases: the key is hostile, the owner is another hostile value.
    let mut expected: HashMap<String, (String, &'static str)> = HashMap::new();
    for (i, key) in values.iter().enumerate() {
        let owner = values[(i + 1) % values.len()].clone();
        sqlx::query(
            "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
             VALUES ($1, $2, nextval('lock_fencing_token_seq'), now() - interval '1 s')",
        )
        .bind(key)
        .bind(&owner)
        .execute(&mut conn)
        .await
        .unwrap();
        expected.insert(key.clone(), (owner, "sweep"));
    }
    // Taken-over leases: stolen by acquire before any sweep, reported from
    // the outbox.
    for (i, value) in values.iter().enumerate().step_by(5) {
        let key = format!("takeover:{value}");
        let owner = values[(i + 2) % values.len()].clone();
        sqlx::query(
            "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
             VALUES ($1, $2, nextval('lock_fencing_token_seq'), now() - interval '1 s')",
        )
        .bind(&key)
        .bind(&owner)
        .execute(&mut conn)
        .await
        .unwrap();
        let stolen: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, $2, 60000)")
            .bind(&key)
            .bind("thief\n\"level=error")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(stolen.is_some());
        expected.insert(key, (owner, "takeover"));
    }
    // Stale jobs: hostile kind and hostile owner.
    open_gates(&mut conn).await;
    let mut jobs: HashMap<String, (String, String)> = HashMap::new();
    for (i, kind) in values.iter().enumerate() {
        let owner = values[(i + 3) % values.len()].clone();
        let id: String = sqlx::query_scalar(
            "INSERT INTO job_queue (job_kind, state, attempts, max_attempts, lease_owner, lease_until)
             VALUES ($1, 'leased', 0, 5, $2, now() - interval '1 minute') RETURNING job_id::text",
        )
        .bind(kind)
        .bind(&owner)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        jobs.insert(id, (kind.clone(), owner));
    }

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&db.url, &port));
    wait_until(Duration::from_secs(15), "every line", || async {
        let lines = daemon.lines();
        events(&lines, "lease_expired").len() >= expected.len()
            && events(&lines, "job_lease_expired").len() >= jobs.len()
    })
    .await;
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0));

    let lines = daemon.lines();
    for line in &lines {
        assert_one_safe_line(line);
        fields(line); // every line decodes
    }
    let mut seen = HashSet::new();
    let leases = events(&lines, "lease_expired");
    assert_eq!(
        leases.len(),
        expected.len(),
        "one line per lease, none forged"
    );
    for f in &leases {
        let key = &f["lockKey"];
        let (owner, by) = expected
            .get(key)
            .unwrap_or_else(|| panic!("reported a key never inserted: {key:?}"));
        assert!(seen.insert(key.clone()), "{key:?} reported twice");
        assert_eq!(&f["ownerId"], owner, "{key:?}");
        assert_eq!(f["reapedBy"], *by, "{key:?}");
        assert_eq!(f["level"], "warn");
    }
    let reaped = events(&lines, "job_lease_expired");
    assert_eq!(reaped.len(), jobs.len(), "one line per job, none forged");
    let mut seen = HashSet::new();
    for f in &reaped {
        let (kind, owner) = jobs
            .get(&f["jobId"])
            .unwrap_or_else(|| panic!("reported a job never inserted: {f:?}"));
        assert!(seen.insert(f["jobId"].clone()));
        assert_eq!(&f["jobKind"], kind);
        assert_eq!(&f["leaseOwner"], owner);
        assert_eq!(f["level"], "warn");
    }
    // Nothing a lease or job carries reaches a metric name or tag.
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", expected.len() as u64)
        .await;
    for datagram_line in statsd.lines() {
        let (name, rest) = datagram_line.split_once(':').expect("name:value");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_'),
            "{datagram_line:?}"
        );
        // `value|type`, then an optional `@rate`, then the `#tags`.
        let tags = rest.split('|').find(|p| p.starts_with('#')).unwrap_or("");
        assert!(
            tags.is_empty()
                || tags.trim_start_matches('#').split(',').all(
                    |t| matches!(t.split_once(':'), Some(("backend" | "action" | "reaped_by" | "table", v))
                        if v.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                ),
            "{datagram_line:?}"
        );
    }
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        expected.len() as u64
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM lock_entry WHERE owner_id <> 'thief\n\"level=error'"
        )
        .await,
        0
    );
    eprintln!(
        "FIGURES hostile: values={} lease_lines={} (takeovers={}) job_lines={} forged=0 undecodable=0 \
         longest_key_bytes={}",
        values.len(),
        leases.len(),
        expected.values().filter(|(_, b)| *b == "takeover").count(),
        reaped.len(),
        values.iter().map(String::len).max().unwrap()
    );
}

/// A cluster of the test's own whose `pg_hba.conf` trusts only the
/// superuser on the socket and makes every other role authenticate with
/// SCRAM: the shared test cluster trusts everyone, so a wrong password would
/// never be refused there.
async fn cluster_requiring_passwords() -> (ThrowawayPg, PgConnection, TempDir) {
    // Removed even if the test fails; 0755 so that `postgres` reads it.
    let dir = TempDir::shared("hba", None);
    let hba = dir.join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all postgres trust\nlocal all all scram-sha-256\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&hba, std::fs::Permissions::from_mode(0o644)).unwrap();
    let setting = hba.to_string_lossy().into_owned();
    let (pg, admin) = own_cluster(&[("hba_file", setting.as_str())], &[]).await;
    (pg, admin, dir)
}

/// Every piece of the two passwords used below; none may appear anywhere.
const SECRETS: &[&str] = &["Wr0ng", "S3cret", "xyzzy", "plugh", "Qu3ry"];

fn assert_no_secret(what: &str, output: &str) {
    for s in SECRETS {
        assert!(
            !output.contains(s),
            "{what}: the password leaked ({s}):\n{output}"
        );
    }
}

#[tokio::test]
async fn password_never_in_any_output() {
    let (pg, mut admin, _hba_dir) = cluster_requiring_passwords().await;
    lease_sweeper::testing::migrate::migrate(&mut admin)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE ROLE sweeper LOGIN PASSWORD 'Right-S3cret-plugh' IN ROLE lease_sweeper;
         INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         VALUES ('expired-1', 'o', 1, now() - interval '1 s');",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    let dir = pg.socket_dir().display().to_string();
    let url = |password: &str| {
        format!("postgres://sweeper:{password}@localhost:5432/postgres?host={dir}")
    };
    let wrong = url("Wr0ng%21S3cret-xyzzy"); // decodes to Wr0ng!S3cret-xyzzy
    let wrong_query = format!(
        "postgres://sweeper@localhost:5432/postgres?host={dir}&password=Qu3ry-S3cret-xyzzy"
    );
    let right = url("Right-S3cret-plugh");
    let libpq = |password: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("PGHOST", dir.clone()),
            ("PGPORT", "5432".into()),
            ("PGUSER", "sweeper".into()),
            ("PGDATABASE", "postgres".into()),
            ("PGPASSWORD", password.into()),
        ]
    };
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let with = |pairs: Vec<(&'static str, String)>| -> Vec<(&'static str, String)> {
        let mut env = pairs;
        env.push(("STATSD_HOST", "127.0.0.1".into()));
        env.push(("STATSD_PORT", port.clone()));
        env
    };
    let wrong_envs: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("LOCKDB_URL", with(vec![("LOCKDB_URL", wrong.clone())])),
        ("DATABASE_URL", with(vec![("DATABASE_URL", wrong.clone())])),
        ("URL ?password=", with(vec![("LOCKDB_URL", wrong_query)])),
        ("PGPASSWORD", with(libpq("Wr0ng-PG-S3cret-xyzzy"))),
    ];

    // The daemon refused at login: the cause at ERROR, never the password.
    let mut daemons = Vec::new();
    for (name, env) in &wrong_envs {
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        daemons.push((*name, Daemon::spawn(&pairs)));
    }
    for (name, d) in &daemons {
        d.wait_for_event("sweep_failed", Duration::from_secs(10))
            .await;
        let failed = &events(&d.lines(), "sweep_failed")[0];
        assert!(
            failed["error"].contains("password authentication failed for user \"sweeper\""),
            "{name}: names the cause: {failed:?}"
        );
        assert!(
            failed["error"].contains("(check the password: the URL's, PGPASSWORD or ~/.pgpass")
                && !failed["error"].contains("is the server up"),
            "{name}: says what to check: {failed:?}"
        );
    }
    for (name, mut d) in daemons {
        let (code, _) = d.stop().await;
        assert_eq!(code, Some(0), "{name}");
        assert_no_secret(
            &format!("run with a wrong password in {name}"),
            &d.lines().join("\n"),
        );
    }

    // One-shot commands, on the wrong password: exit 1, no password.
    let commands: &[&[&str]] = &[
        &["migrate"],
        &["check"],
        &["jobs", "dry-run"],
        &["jobs", "apply", "--actor", "ops"],
        &["gates"],
        &[
            "gates",
            "set",
            "queue.lease.reaper_enabled",
            "false",
            "--actor",
            "ops",
        ],
    ];
    let mut one_shots = 0;
    for (name, env) in &wrong_envs {
        for args in commands {
            let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let mut d = Daemon::spawn_args(args, &pairs);
            let (code, _) = d.wait_exit(Duration::from_secs(15)).await;
            let all = d.lines().join("\n");
            assert_eq!(code, Some(1), "{args:?} with {name}: {all}");
            assert_no_secret(&format!("{args:?} with a wrong password in {name}"), &all);
            if args == &["migrate"] {
                assert!(all.contains("password authentication failed"), "{all}");
            }
            one_shots += 1;
        }
    }

    // The right password: the daemon sweeps, and says where without it.
    let mut d = Daemon::spawn(&[
        ("LOCKDB_URL", right.as_str()),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
    ]);
    wait_until(Duration::from_secs(10), "the sweep", || async {
        events(&d.lines(), "lease_expired").len() == 1
    })
    .await;
    assert_eq!(d.stop().await.0, Some(0));
    let lines = d.lines();
    assert!(
        events(&lines, "starting")[0]["database"]
            .starts_with("postgres://sweeper@/postgres?host=/"),
        "{lines:#?}"
    );
    assert_no_secret("run with the right password", &lines.join("\n"));
    for args in commands {
        let mut d = Daemon::spawn_args(args, &[("LOCKDB_URL", right.as_str())]);
        d.wait_exit(Duration::from_secs(15)).await;
        assert_no_secret(
            &format!("{args:?} with the right password"),
            &d.lines().join("\n"),
        );
    }
    assert_no_secret("StatsD datagrams", &statsd.lines().join("\n"));
    // The server did refuse those logins (the test is not vacuous).
    let log = pg.log_tail();
    assert!(log.contains("password authentication failed"), "{log}");
    eprintln!(
        "FIGURES passwords: paths_checked={} (run x4 sources, {} one-shot runs, right-password run and \
         one-shots) leaked=0",
        4 + one_shots + 1 + commands.len(),
        one_shots
    );
    drop(admin);
    drop(pg);
}

/// The SQLSTATE and message of a statement that must fail.
async fn refused(conn: &mut PgConnection, sql: &'static str) -> (String, String) {
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .expect_err(sql);
    let db = err
        .as_database_error()
        .unwrap_or_else(|| panic!("{sql}: {err}"));
    (
        db.code().map(|c| c.into_owned()).unwrap_or_default(),
        db.message().to_owned(),
    )
}

#[tokio::test]
async fn bad_ttls_and_empty_keys_refused_with_22023() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    sqlx::query("SELECT lock_acquire('held', 'o', 60000)")
        .execute(&mut conn)
        .await
        .unwrap();
    for (sql, needles) in [
        (
            "SELECT lock_acquire('k', 'o', -1)",
            &["lock_acquire: ttl must be", "got -1"][..],
        ),
        (
            "SELECT lock_acquire('k', 'o', 0)",
            &["lock_acquire: ttl must be", "got 0"],
        ),
        (
            "SELECT lock_acquire('k', 'o', NULL)",
            &["lock_acquire: ttl must be"],
        ),
        (
            "SELECT lock_acquire('k', 'o', -9223372036854775808)",
            &["lock_acquire: ttl must be", "got -9223372036854775808"],
        ),
        (
            "SELECT lock_renew('held', 1, -5)",
            &["lock_renew: ttl must be", "got -5"],
        ),
        (
            "SELECT lock_acquire('', 'o', 1000)",
            &["lock key must be a non-empty string"],
        ),
        (
            "SELECT lock_acquire(NULL, 'o', 1000)",
            &["lock key must be a non-empty string"],
        ),
        (
            "SELECT lock_acquire('k', NULL, 1000)",
            &["owner id must not be NULL"],
        ),
    ] {
        let (code, message) = refused(&mut conn, sql).await;
        assert_eq!(code, "22023", "{sql}: {message}");
        for needle in needles {
            assert!(message.contains(needle), "{sql}: {message}");
        }
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        1,
        "nothing was written"
    );
}

#[tokio::test]
/// A TTL of ~292 million years used to fail with 22008 "interval out of
/// range", naming neither the function nor the TTL.
async fn absurd_ttl_refused_with_22023() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let token: i64 = sqlx::query_scalar("SELECT lock_acquire('held', 'o', 60000)")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(token > 0);
    for sql in [
        "SELECT lock_acquire('k', 'o', 9223372036854775807)",
        "SELECT lock_renew('held', 1, 9223372036854775807)",
    ] {
        let (code, message) = refused(&mut conn, sql).await;
        assert_eq!(code, "22023", "{sql}: {message}");
        assert!(message.contains("ttl must be"), "{sql}: {message}");
        assert!(
            message.contains("got 9223372036854775807"),
            "{sql}: {message}"
        );
    }
}

#[tokio::test]
async fn absurd_job_limits_exit_2() {
    for (args, needle) in [
        (
            &["jobs", "dry-run", "--limit", "0"][..],
            "0 is not in 1..=10000",
        ),
        (
            &["jobs", "dry-run", "--limit", "10001"],
            "10001 is not in 1..=10000",
        ),
        (&["jobs", "dry-run", "--limit=-1"], "-1 is not in 1..=10000"),
        (
            &["jobs", "apply", "--actor", "ops", "--limit", "99999999999"],
            "99999999999 is not in 1..=10000",
        ),
        (
            &["jobs", "dry-run", "--limit", "1e3"],
            "invalid value '1e3' for '--limit <LIMIT>'",
        ),
        // A bare negative number is a value here, not a flag.
        (
            &["jobs", "dry-run", "--limit", "-1"],
            "-1 is not in 1..=10000",
        ),
    ] {
        let mut d = Daemon::spawn_args(args, &[("LOCKDB_URL", "postgres://u:hunter2@h/db")]);
        let (code, _) = d.wait_exit(Duration::from_secs(10)).await;
        let all = d.lines().join("\n");
        assert_eq!(code, Some(2), "{args:?}: {all}");
        assert!(all.contains(needle), "{args:?}: {all}");
        assert!(!all.contains("hunter2"));
    }
}
