//! PgBouncer 1.18 in front of the lock database: transaction pooling with
//! fewer server connections than clients (three daemons, churning clients,
//! control clients that show the hazard is real) and session pooling
//! (`migrate`, `check` and two daemons). Each proves every expiry is reported
//! exactly once and nothing fails.
//!
//! It owns the control clients and running one-shot commands; PgBouncer
//! itself is started by `topology::support`. Each test prints its `FIGURES`
//! line (`--nocapture`) for docs/topologies.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection};

use crate::support::{
    Daemon, StatsdCapture, TestDb, count, daemon_env, events, insert_expired, insert_stale_jobs,
    wait_until,
};
use crate::topology::support::{Bouncer, assert_each_once, lease_keys, server_of};

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
async fn transaction_mode_reports_each_expiry_once() {
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
    for bad in ["sweep_failed", "job_reap_failed", "horizon_check_failed"] {
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
async fn session_mode_runs_migrate_check_daemons() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    let (server, server_port, user) = server_of(&db.url);
    // Session pooling pins each client connection to a server connection for
    // its life: every daemon holds two (the lock sweep's; the job reaper's
    // and horizon check's), so two daemons fit a pool of four.
    let bouncer = Bouncer::start(&server, server_port, &db.name, &user, "session", 4).await;
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
    for bad in ["sweep_failed", "job_reap_failed", "horizon_check_failed"] {
        assert_eq!(events(&lines, bad), vec![], "no {bad}");
    }
    assert_each_once(&all_keys(&daemons), 20, "session-");
    assert_eq!(count(&mut conn, "SELECT count(*) FROM lock_entry").await, 0);
}
