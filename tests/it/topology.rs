//! Deployment topologies with the real components: PgBouncer 1.18 in
//! transaction mode, a primary with a streaming hot standby (failover by
//! promotion), a standby alone, verify-full TLS with a CA made here,
//! libpq's defaults as a non-root OS user, and `hostaddr`.
//!
//! Each prints its measured figures (`FIGURES …`, shown with `--nocapture`)
//! for docs/topologies.md.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease_sweeper::testing::throwaway::{StopMode, ThrowawayPg};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection};

use crate::support::{
    Daemon, StatsdCapture, TempDir, TestDb, acquire, blocking, count, daemon_env, events, fields,
    insert_expired, insert_stale_jobs, wait_until,
};
use crate::topology_support::{Bouncer, Certs, free_port, sbin, unprivileged};

/// `lockKey` of every `lease_expired` line.
fn lease_keys(lines: &[String]) -> Vec<String> {
    events(lines, "lease_expired")
        .into_iter()
        .map(|f| f["lockKey"].clone())
        .collect()
}

/// How many `lease_expired` lines `daemon` wrote so far for keys `{prefix}…`.
fn reported_with_prefix(daemon: &Daemon, prefix: &str) -> usize {
    lease_keys(&daemon.lines())
        .iter()
        .filter(|k| k.starts_with(prefix))
        .count()
}

/// Asserts each key appears exactly once over all daemons' lines.
fn assert_each_once(all: &[String], expected: usize, prefix: &str) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for k in all.iter().filter(|k| k.starts_with(prefix)) {
        *seen.entry(k.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "reported more than once: {twice:?}");
    assert_eq!(seen.len(), expected, "distinct {prefix}* reported");
}

/// The socket directory (or host), port and user of a test database URL.
fn server_of(url: &str) -> (String, u16, String) {
    let u = url::Url::parse(url).unwrap();
    let host = u
        .query_pairs()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.into_owned())
        .or_else(|| u.host_str().map(str::to_owned))
        .unwrap();
    (host, u.port().unwrap_or(5432), u.username().to_owned())
}

/// A client that does what many applications do behind PgBouncer: sqlx's
/// defaults outside transactions (named, cached statements when `named`,
/// unnamed ones otherwise). It counts what came back; a panic inside
/// sqlx-postgres ends the task and is counted too.
#[derive(Default)]
struct Control {
    ok: AtomicU64,
    errors: AtomicU64,
    wrong: AtomicU64,
    panics: AtomicU64,
    /// The distinct error texts seen.
    seen: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

async fn control_client(
    opts: PgConnectOptions,
    named: bool,
    reversed: bool,
    stop: Arc<AtomicBool>,
) -> Control {
    let out = Arc::new(Control::default());
    while !stop.load(Ordering::Relaxed) {
        let (o, s, opts) = (out.clone(), stop.clone(), opts.clone());
        let task = tokio::spawn(async move {
            let Ok(mut conn) = PgConnection::connect_with(&opts).await else {
                o.errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut i: i64 = 0;
            while !s.load(Ordering::Relaxed) {
                i += 1;
                // Two shapes, one column and three. A reversed client
                // prepares them in the other order, so its `sqlx_s_1` is the
                // other one's `sqlx_s_2`: on a shared server connection a
                // cached name then runs the other statement.
                let mut one = None;
                let mut three = None;
                for step in 0..2 {
                    if (step == 0) != reversed {
                        one = Some(
                            sqlx::query_scalar::<_, i64>("SELECT $1::int8 + 1")
                                .persistent(named)
                                .bind(i)
                                .fetch_one(&mut conn)
                                .await,
                        );
                    } else {
                        three = Some(
                            sqlx::query_as::<_, (i64, i64, i64)>(
                                "SELECT $1::int8, 2::int8, 3::int8",
                            )
                            .persistent(named)
                            .bind(i)
                            .fetch_one(&mut conn)
                            .await,
                        );
                    }
                }
                match (one.unwrap(), three.unwrap()) {
                    (Ok(a), Ok(b)) if a == i + 1 && b == (i, 2, 3) => {
                        o.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    (Ok(_), Ok(_)) => {
                        o.wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    (a, b) => {
                        o.errors.fetch_add(1, Ordering::Relaxed);
                        let text = a
                            .err()
                            .or(b.err())
                            .map(|e| e.to_string())
                            .unwrap_or_default();
                        o.seen.lock().unwrap().insert(text);
                        return; // reconnect, as a pool would
                    }
                }
            }
        });
        if let Err(e) = task.await {
            out.panics.fetch_add(1, Ordering::Relaxed);
            if let Ok(p) = e.try_into_panic() {
                let text = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                out.seen.lock().unwrap().insert(format!("PANIC: {text}"));
            }
        }
    }
    Arc::try_unwrap(out).unwrap_or_default()
}

#[tokio::test]
async fn pgbouncer_transaction_mode_with_fewer_server_connections_than_clients_reports_every_expiry_once()
 {
    const ROUNDS: usize = 5;
    const PER_ROUND: i64 = 40;
    const JOBS: i64 = 30;
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (server, server_port, user) = server_of(&db.url);
    // Two server connections for three daemons, four churning clients and
    // two control clients.
    let bouncer = Bouncer::start(&server, server_port, &db.name, &user, "transaction", 2).await;
    let url = format!("postgres://{user}@127.0.0.1:{}/{}", bouncer.port, db.name);
    let client_opts = url
        .parse::<PgConnectOptions>()
        .unwrap()
        .extra_float_digits(None);

    for (key, value) in [
        ("queue.job_substrate.enabled", "true"),
        ("queue.lease.reaper_enabled", "true"),
        ("queue.lease.reaper_dry_run_only", "false"),
    ] {
        sqlx::query("SELECT fn_queue_setting_set($1, $2, 'test')")
            .bind(key)
            .bind(value)
            .execute(&mut conn)
            .await
            .unwrap();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut churn = Vec::new();
    for _ in 0..4 {
        let (opts, stop) = (client_opts.clone(), stop.clone());
        churn.push(tokio::spawn(async move {
            let mut sessions = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut c) = PgConnection::connect_with(&opts).await {
                    let _ = sqlx::raw_sql("BEGIN; SELECT pg_sleep(0.003); COMMIT")
                        .execute(&mut c)
                        .await;
                    let _ = c.close().await;
                    sessions += 1;
                }
            }
            sessions
        }));
    }
    let named = tokio::spawn(control_client(
        client_opts.clone(),
        true,
        false,
        stop.clone(),
    ));
    let reversed = tokio::spawn(control_client(
        client_opts.clone(),
        true,
        true,
        stop.clone(),
    ));
    let unnamed = tokio::spawn(control_client(
        client_opts.clone(),
        false,
        false,
        stop.clone(),
    ));

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|_| Daemon::spawn(&daemon_env(&url, &port)))
        .collect();
    let all_keys = |daemons: &[Daemon]| -> Vec<String> {
        daemons
            .iter()
            .flat_map(|d| lease_keys(&d.lines()))
            .collect()
    };
    let started = Instant::now();
    for round in 0..ROUNDS {
        insert_expired(&mut conn, &format!("r{round}-"), PER_ROUND, 10).await;
        let want = (round + 1) * PER_ROUND as usize;
        wait_until(Duration::from_secs(20), "the round's expiries", || async {
            all_keys(&daemons).len() >= want
        })
        .await;
    }
    let jobs = insert_stale_jobs(&mut conn, "bounced", JOBS, 0, 5, 1_000).await;
    wait_until(Duration::from_secs(20), "the stale jobs", || async {
        daemons
            .iter()
            .map(|d| events(&d.lines(), "job_lease_expired").len())
            .sum::<usize>()
            >= JOBS as usize
    })
    .await;
    let took = started.elapsed();
    // The one-shot commands through the same pool, churn still running.
    for args in [&["check"][..], &["jobs", "dry-run"], &["gates"]] {
        let (code, out) = run_cli(args, &url, &port).await;
        assert_eq!(code, Some(0), "{args:?} through PgBouncer:\n{out}");
    }
    stop.store(true, Ordering::Relaxed);
    let mut sessions = 0;
    for c in churn {
        sessions += c.await.unwrap();
    }
    let named = named.await.unwrap();
    let reversed = reversed.await.unwrap();
    let unnamed = unnamed.await.unwrap();

    for d in &mut daemons {
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "every daemon is alive"
        );
        let (code, _) = d.stop().await;
        assert_eq!(code, Some(0));
    }
    let lines: Vec<String> = daemons.iter().flat_map(|d| d.lines()).collect();
    for bad in ["sweep_failed", "job_reap_failed"] {
        assert_eq!(events(&lines, bad), vec![], "no {bad}");
    }
    assert!(
        !lines.iter().any(|l| l.contains("panicked")),
        "no panic in any daemon"
    );
    assert_each_once(&all_keys(&daemons), ROUNDS * PER_ROUND as usize, "r");
    let job_ids: Vec<String> = events(&lines, "job_lease_expired")
        .into_iter()
        .map(|f| f["jobId"].clone())
        .collect();
    assert_each_once(&job_ids, JOBS as usize, "");
    assert!(job_ids.iter().all(|j| jobs.contains(j)));
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
    let log = bouncer.log();
    assert!(
        !log.contains("unsupported startup parameter"),
        "no startup parameter PgBouncer refuses: {log}"
    );
    // The hazard is real in this set-up: sqlx's defaults fail here.
    let bad = |c: &Control| {
        c.errors.load(Ordering::Relaxed)
            + c.wrong.load(Ordering::Relaxed)
            + c.panics.load(Ordering::Relaxed)
    };
    let named_bad = bad(&named) + bad(&reversed);
    assert!(
        named_bad > 0,
        "the control client with named statements never tripped; the test shuffles nothing"
    );
    let show = |c: &Control| {
        format!(
            "ok={} errors={} wrong={} panics={}",
            c.ok.load(Ordering::Relaxed),
            c.errors.load(Ordering::Relaxed),
            c.wrong.load(Ordering::Relaxed),
            c.panics.load(Ordering::Relaxed)
        )
    };
    eprintln!(
        "FIGURES pgbouncer_transaction: daemons=3 server_connections=2 leases={} jobs={JOBS} \
         reported_once=all sweep_failed=0 job_reap_failed=0 panics=0 took={:.1}s \
         churn_sessions={sessions} control_named({}) control_named_reversed({}) \
         control_unnamed_outside_tx({})",
        ROUNDS * PER_ROUND as usize,
        took.as_secs_f64(),
        show(&named),
        show(&reversed),
        show(&unnamed),
    );
    for (what, c) in [
        ("named", &named),
        ("named_reversed", &reversed),
        ("unnamed_outside_tx", &unnamed),
    ] {
        for e in c.seen.lock().unwrap().iter() {
            eprintln!("  control_{what}: {e}");
        }
    }
}

/// Runs a one-shot subcommand against `url`; returns its exit code and output.
async fn run_cli(args: &[&str], url: &str, statsd_port: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(crate::support::binary())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(daemon_env(url, statsd_port))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("running lease-sweeper");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn pgbouncer_session_mode_runs_migrate_check_and_two_daemons() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    let (server, server_port, user) = server_of(&db.url);
    // Session pooling pins each client connection to a server connection for
    // its life: every daemon holds two (lock sweep, job reaper).
    let bouncer = Bouncer::start(&server, server_port, &db.name, &user, "session", 6).await;
    let url = format!("postgres://{user}@127.0.0.1:{}/{}", bouncer.port, db.name);
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    // sqlx's migrator holds a session advisory lock across its transactions:
    // fine in session mode.
    let (code, out) = run_cli(&["migrate"], &url, &port).await;
    assert_eq!(code, Some(0), "migrate through PgBouncer (session):\n{out}");
    let (code, out) = run_cli(&["check"], &url, &port).await;
    assert_eq!(code, Some(0), "check through PgBouncer (session):\n{out}");
    let mut daemons: Vec<Daemon> = (0..2)
        .map(|_| Daemon::spawn(&daemon_env(&url, &port)))
        .collect();
    insert_expired(&mut conn, "session-", 20, 10).await;
    let all_keys = |daemons: &[Daemon]| -> Vec<String> {
        daemons
            .iter()
            .flat_map(|d| lease_keys(&d.lines()))
            .collect()
    };
    wait_until(Duration::from_secs(10), "the expiries", || async {
        all_keys(&daemons).len() >= 20
    })
    .await;
    for d in &mut daemons {
        assert_eq!(d.stop().await.0, Some(0));
    }
    let lines: Vec<String> = daemons.iter().flat_map(|d| d.lines()).collect();
    for bad in ["sweep_failed", "job_reap_failed"] {
        assert_eq!(events(&lines, bad), vec![], "no {bad}");
    }
    assert_each_once(&all_keys(&daemons), 20, "session-");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}

async fn wait_count(conn: &mut PgConnection, sql: &'static str, want: i64, what: &str) {
    crate::support::poll(Duration::from_secs(20), what, async || {
        let n = count(&mut *conn, sql).await;
        if n == want {
            Ok(())
        } else {
            Err(format!("{n}, want {want}"))
        }
    })
    .await
}

#[tokio::test]
async fn a_multi_host_url_follows_a_promoted_standby_without_a_restart_and_a_standby_alone_deletes_nothing()
 {
    let (p1, p2) = (free_port(), free_port());
    let primary = blocking(move || {
        ThrowawayPg::start_tcp(
            p1,
            &[
                ("synchronous_commit", "on"),
                ("log_connections", "on"),
                // The standby inherits it: a standby whose primary is gone
                // retries WAL every 5 s by default, and notices a promotion
                // only then.
                ("wal_retrieve_retry_interval", "200ms"),
            ],
        )
    })
    .await
    .expect("primary");
    let mut conn = PgConnection::connect(&primary.url("postgres"))
        .await
        .unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    let (mut primary, standby) = blocking(move || {
        let standby = ThrowawayPg::standby_of(&primary, p2);
        (primary, standby)
    })
    .await;
    let standby = standby.expect("standby");
    let mut on_standby = PgConnection::connect(&standby.url("postgres"))
        .await
        .unwrap();
    insert_expired(&mut conn, "early-", 10, 10).await;
    wait_count(
        &mut on_standby,
        "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'early-%'",
        10,
        "replayed on the standby",
    )
    .await;

    // The standby alone: by default (read-write) the walk passes it over;
    // with target_session_attrs=any the DELETE fails with 25006. Either way
    // nothing is deleted and the hot-standby words are logged once.
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let standby_url = format!("postgres://postgres@127.0.0.1:{p2}/postgres");
    let standby_any = format!("{standby_url}?target_session_attrs=any");
    let mut alone = Daemon::spawn(&daemon_env(&standby_url, &port));
    let mut alone_any = Daemon::spawn(&daemon_env(&standby_any, &port));
    for d in [&alone, &alone_any] {
        d.wait_for_event("sweep_failed", Duration::from_secs(10))
            .await;
    }
    // Several sweeps each: every failed sweep reconnects (the standby logs
    // each connection).
    wait_until(
        Duration::from_secs(20),
        "six sweeps' connections",
        || async {
            standby
                .log_text()
                .matches("application_name=lease-sweeper")
                .count()
                >= 12
        },
    )
    .await;
    for d in [&mut alone, &mut alone_any] {
        assert_eq!(d.stop().await.0, Some(0));
    }
    for (d, extra) in [(&alone, ""), (&alone_any, "SQLSTATE 25006")] {
        let lines = d.lines();
        let failed = events(&lines, "sweep_failed");
        assert_eq!(failed.len(), 1, "once: {failed:#?}");
        assert!(
            failed[0]["error"].contains(lease_sweeper::testing::conn::HOT_STANDBY)
                && failed[0]["error"].contains(extra),
            "{:?}",
            failed[0]["error"]
        );
        assert!(lease_keys(&lines).is_empty());
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM lock_entry").await,
        10,
        "nothing deleted"
    );

    // Both hosts: the primary first.
    let url =
        format!("postgres://postgres@127.0.0.1:{p1},127.0.0.1:{p2}/postgres?connect_timeout=2");
    let mut daemon = Daemon::spawn(&daemon_env(&url, &port));
    let pid = daemon.pid();
    wait_until(Duration::from_secs(10), "the early leases", || async {
        lease_keys(&daemon.lines()).len() == 10
    })
    .await;
    let meanwhile = acquire(&mut conn, "meanwhile-", 20, 1_500).await;
    wait_count(
        &mut on_standby,
        "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'meanwhile-%'",
        20,
        "replayed on the standby",
    )
    .await;
    drop(conn);
    let stopped = Instant::now();
    // Kept until the end: dropping it would remove its directory.
    let _stopped_primary = blocking(move || {
        primary.stop(StopMode::Fast);
        primary
    })
    .await;
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote()")
        .fetch_one(&mut on_standby)
        .await
        .unwrap();
    assert!(promoted);
    let promote_took = stopped.elapsed();
    wait_until(
        Duration::from_secs(30),
        "the first sweep on the new primary",
        || async { !events(&daemon.lines(), "sweep_recovered").is_empty() },
    )
    .await;
    let gap = stopped.elapsed();
    wait_until(
        Duration::from_secs(20),
        "the leases that expired meanwhile",
        || async { reported_with_prefix(&daemon, "meanwhile-") >= meanwhile.len() },
    )
    .await;
    insert_expired(&mut on_standby, "after-", 5, 10).await;
    wait_until(
        Duration::from_secs(10),
        "leases on the new primary",
        || async { reported_with_prefix(&daemon, "after-") == 5 },
    )
    .await;
    assert!(daemon.child.try_wait().unwrap().is_none(), "no restart");
    assert_eq!(daemon.pid(), pid);
    assert_eq!(daemon.stop().await.0, Some(0));

    let lines = daemon.lines();
    let keys = lease_keys(&lines);
    assert_each_once(&keys, 10, "early-");
    assert_each_once(&keys, 20, "meanwhile-");
    assert_each_once(&keys, 5, "after-");
    let left = count(&mut on_standby, "SELECT count(*) FROM lock_entry").await;
    assert_eq!(left, 0, "no expiry lost");
    // Once per connection the daemon holds (lock sweep, job reaper).
    let changed = events(&lines, "database_host_changed");
    assert_eq!(changed.len(), 2, "{changed:#?}");
    assert!(
        changed
            .iter()
            .all(|c| c["to"] == format!("127.0.0.1:{p2}") && c["from"] == format!("127.0.0.1:{p1}"))
    );
    let failed: Vec<String> = events(&lines, "sweep_failed")
        .into_iter()
        .map(|f| f["error"].clone())
        .collect();
    eprintln!(
        "FIGURES failover: leases_expired_meanwhile={} reported={} lost={left} restarts=0 \
         failover_gap={:.2}s (stop to first successful sweep on the promoted standby; \
         pg_promote took {:.2}s of it) sweep_failed_lines={}",
        meanwhile.len(),
        keys.iter().filter(|k| k.starts_with("meanwhile-")).count(),
        gap.as_secs_f64(),
        promote_took.as_secs_f64(),
        failed.len()
    );
    for f in failed {
        eprintln!("  sweep_failed: {f}");
    }
    for f in events(&lines, "database_host_changed") {
        eprintln!("  database_host_changed: {} -> {}", f["from"], f["to"]);
    }
}

#[tokio::test]
async fn verify_full_tls_with_the_tests_ca_sweeps_and_a_wrong_ca_or_host_name_is_refused_without_the_password()
 {
    const PASSWORD: &str = "Tls-S3cret-pw";
    let certs = Certs::make(unprivileged());
    let port = free_port();
    let (cert, key, ca) = (
        certs.server_cert.display().to_string(),
        certs.server_key.display().to_string(),
        certs.ca.display().to_string(),
    );
    let pg = blocking(move || {
        ThrowawayPg::start_tcp(
            port,
            &[
                ("ssl", "on"),
                ("ssl_cert_file", &cert),
                ("ssl_key_file", &key),
                ("ssl_ca_file", &ca),
            ],
        )
    })
    .await
    .expect("a TLS-enabled PostgreSQL");
    let mut conn = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    insert_expired(&mut conn, "tls-", 5, 10).await;
    // Role `certuser` may log in over TCP only with a client certificate the
    // CA signed (pg_hba `cert`), read first, before the cluster's trust lines.
    sqlx::raw_sql("CREATE ROLE certuser LOGIN SUPERUSER")
        .execute(&mut conn)
        .await
        .unwrap();
    let hba = pg.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!(
            "hostssl all certuser 127.0.0.1/32 cert\nhost all certuser 127.0.0.1/32 reject\n{rules}"
        ),
    )
    .unwrap();
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut conn)
        .await
        .unwrap();

    let statsd = StatsdCapture::start().await;
    let sport = statsd.port.to_string();
    let url = |host: &str, ca: &Path| {
        format!(
            "postgres://postgres:{PASSWORD}@{host}:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            ca.display()
        )
    };
    let (good, wrong_ca, wrong_name) = (
        url("localhost", &certs.ca),
        url("localhost", &certs.wrong_ca),
        url("127.0.0.1", &certs.ca),
    );
    // Client certificate through libpq's variables (PGSSLCERT/PGSSLKEY),
    // and the same role without one.
    let cert_url = format!(
        "postgres://certuser@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        certs.ca.display()
    );
    let (client_cert, client_key) = (
        certs.client_cert.display().to_string(),
        certs.client_key.display().to_string(),
    );
    let mut with_cert = daemon_env(&cert_url, &sport);
    with_cert.extend([
        ("PGSSLCERT", client_cert.as_str()),
        ("PGSSLKEY", client_key.as_str()),
    ]);
    let mut daemons = [
        Daemon::spawn(&daemon_env(&good, &sport)),
        Daemon::spawn(&daemon_env(&wrong_ca, &sport)),
        Daemon::spawn(&daemon_env(&wrong_name, &sport)),
        Daemon::spawn(&with_cert),
        Daemon::spawn(&daemon_env(&cert_url, &sport)),
    ];
    // The two daemons that may connect split the leases between them.
    wait_until(Duration::from_secs(10), "the leases over TLS", || async {
        lease_keys(&daemons[0].lines()).len() + lease_keys(&daemons[3].lines()).len() == 5
    })
    .await;
    let ssl: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
          WHERE application_name = 'lease-sweeper' AND usename = 'postgres' AND ssl",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(ssl >= 1, "the sweeper's session is encrypted");
    for d in [&daemons[1], &daemons[2], &daemons[4]] {
        d.wait_for_event("sweep_failed", Duration::from_secs(10))
            .await;
    }
    // The client-certificate daemon is connected as certuser, over TLS.
    crate::support::poll(
        Duration::from_secs(10),
        "a certuser session over TLS",
        async || {
            let daemon = &daemons[3];
            {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
                  WHERE usename = 'certuser' AND ssl AND client_dn = '/CN=certuser'",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap();
                if n >= 1 {
                    Ok(())
                } else {
                    Err(format!("the daemon said:\n{}", daemon.lines().join("\n")))
                }
            }
        },
    )
    .await;
    for d in &mut daemons {
        assert_eq!(d.stop().await.0, Some(0));
    }
    assert_eq!(events(&daemons[3].lines(), "sweep_failed"), vec![]);
    assert_eq!(events(&daemons[0].lines(), "sweep_failed"), vec![]);
    let mut swept = lease_keys(&daemons[0].lines());
    swept.extend(lease_keys(&daemons[3].lines()));
    assert_each_once(&swept, 5, "tls-");
    for (d, word) in [
        (&daemons[1], "unknown CA"),
        (&daemons[2], "host name mismatch"),
        (&daemons[4], "certificate"),
    ] {
        let failed = events(&d.lines(), "sweep_failed");
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0]["error"].contains(word),
            "{:?}",
            failed[0]["error"]
        );
        assert!(lease_keys(&d.lines()).is_empty());
        eprintln!("FIGURES tls refused: {}", failed[0]["error"]);
    }
    for d in &daemons {
        assert!(
            !d.lines().iter().any(|l| l.contains(PASSWORD)),
            "the password never reaches a line"
        );
    }
}

#[tokio::test]
async fn without_a_url_the_daemon_connects_as_the_os_user_by_libpqs_defaults() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (server, server_port, _) = server_of(&db.url);
    let os_user = match unprivileged() {
        // As root, the test runs the daemon as `postgres` (runuser), a role
        // the throwaway cluster has.
        Some(_) => "postgres".to_owned(),
        None => {
            let me = pgconn::os_user_name().unwrap();
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                    .bind(&me)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
            if !exists {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "CREATE ROLE \"{me}\" LOGIN SUPERUSER"
                )))
                .execute(&mut conn)
                .await
                .unwrap();
            }
            me
        }
    };
    insert_expired(&mut conn, "os-user-", 3, 10).await;
    let statsd = StatsdCapture::start().await;
    let sport = statsd.port.to_string();
    let port = server_port.to_string();
    let vars = [
        ("PGHOST", server.as_str()),
        ("PGPORT", port.as_str()),
        ("PGDATABASE", db.name.as_str()),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", sport.as_str()),
    ];
    let bin = crate::support::binary();
    let mut daemon = match unprivileged() {
        Some(_) => {
            let mut args = vec!["-u", "postgres", "--"];
            args.push(bin.to_str().unwrap());
            args.push("run");
            Daemon::spawn_program(&sbin("runuser"), &args, &vars)
        }
        None => Daemon::spawn_program(&bin, &["run"], &vars),
    };
    wait_until(Duration::from_secs(10), "the leases", || async {
        lease_keys(&daemon.lines()).len() == 3
    })
    .await;
    let role: String = sqlx::query_scalar(
        "SELECT usename::text FROM pg_stat_activity WHERE application_name = 'lease-sweeper'
            AND datname = $1 LIMIT 1",
    )
    .bind(&db.name)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    // runuser passes SIGTERM on to the daemon, then ends itself with it.
    daemon.signal(libc::SIGTERM);
    daemon.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(role, os_user);
    let lines = daemon.lines();
    assert_eq!(
        events(&lines, "sweeper_stopped").len(),
        1,
        "a graceful stop"
    );
    let starting = lines
        .iter()
        .map(|l| fields(l))
        .find(|f| f.get("message").map(String::as_str) == Some("starting"))
        .expect("a starting line");
    assert_eq!(
        starting["databaseFrom"],
        "PG variables (PGHOST PGPORT PGDATABASE) + libpq defaults"
    );
    assert!(
        starting["database"].starts_with(&format!("postgres://{os_user}@")),
        "{starting:?}"
    );
}

/// `hostaddr` is where the connection goes (the host name is never looked
/// up: a `.invalid` name cannot resolve), and the host name is what the
/// password file is matched with, as in libpq.
#[tokio::test]
async fn hostaddr_is_connected_to_and_the_password_file_is_matched_by_the_host_name() {
    use lease_sweeper::testing::config::DbTarget;
    use lease_sweeper::testing::conn::connect;
    const PASSWORD: &str = "Hostaddr-S3cret-pw";
    const NAME: &str = "lockdb.invalid";
    let port = free_port();
    let pg = blocking(move || ThrowawayPg::start_tcp(port, &[]))
        .await
        .expect("a PostgreSQL on loopback TCP");
    let mut conn = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE sweeper LOGIN PASSWORD '{PASSWORD}'"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    // The cluster trusts everyone; over TCP this role must give its password.
    let hba = pg.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all sweeper 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut conn)
        .await
        .unwrap();
    let dir = TempDir::new("hostaddr");
    let passfile = dir.join("pgpass");
    std::fs::write(
        &passfile,
        format!(
            "127.0.0.1:{port}:postgres:sweeper:Wrong-for-the-address\n\
             {NAME}:{port}:postgres:sweeper:{PASSWORD}\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = |host: &str, query: &str| {
        let target = format!(
            "postgres://sweeper@{host}:{port}/postgres?sslmode=disable&passfile={}{query}",
            passfile.display()
        );
        DbTarget::from_url("LOCKDB_URL", &target).unwrap()
    };

    let target = url(NAME, "&hostaddr=127.0.0.1");
    assert_eq!(
        target.target().hosts()[0].display(),
        format!("{NAME}:{port} (hostaddr 127.0.0.1)")
    );
    let mut session = connect(&target)
        .await
        .expect("connects to the hostaddr with the host name's password");
    let (user, addr): (String, String) =
        sqlx::query_as("SELECT current_user::text, host(inet_server_addr())")
            .fetch_one(&mut session)
            .await
            .unwrap();
    assert_eq!((user.as_str(), addr.as_str()), ("sweeper", "127.0.0.1"));

    // Without hostaddr the name is looked up, and it does not resolve.
    let err = connect(&url(NAME, "")).await.unwrap_err().to_string();
    assert!(err.contains(NAME), "{err}");
    // With the address alone, the address's line is used: the wrong password.
    let err = connect(&url("", "&hostaddr=127.0.0.1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(
        !err.contains("Wrong-for") && !err.contains("S3cret"),
        "{err}"
    );
}
