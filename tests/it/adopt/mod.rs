//! The sidecar beside a lock server that already runs: its schema made by
//! its own migration as its own owner role (`lock_server.sql`), its own
//! statements (`LockServer`) at a fixed rate while `migrate` adopts it, then
//! the daemon, as a login role in `lease_sweeper`, reporting what the lock
//! server's own statements did; a table that does not fit, a role that does
//! not own it, another schema; and `remove`, after which the lock server's
//! tables, rows and history are as they were.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::{Connection as _, PgConnection};

use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, count, daemon_env, events, exec, poll, run_binary,
};

mod remove;
mod unit;

/// The lock server's own migration.
const LOCK_SERVER: &str = include_str!("lock_server.sql");

mod phase1_queue;
mod release_0_1_0;
mod renewal;
mod same_sidecar;
mod tokens;
mod upgrade;

/// The lock server's own statements, as it sends them.
mod statements {
    /// tryInsert: a new lease, or an expired one taken over; the new token,
    /// or no row while a live lease holds the key.
    pub const TRY_INSERT: &str = "
        INSERT INTO lock_entry AS e (lock_key, owner_id, token, session_id, acquired_at, expires_at, lease_version)
        VALUES ($1, $2, nextval('ls_fencing_seq'), NULL, now(), now() + $3 * interval '1 millisecond', 1)
        ON CONFLICT (lock_key) DO UPDATE
           SET owner_id = EXCLUDED.owner_id, token = EXCLUDED.token, session_id = EXCLUDED.session_id,
               acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
               lease_version = e.lease_version + 1
         WHERE e.expires_at <= now()
        RETURNING token";
    /// extend: a live lease's new deadline.
    pub const EXTEND: &str = "
        UPDATE lock_entry SET expires_at = now() + $3 * interval '1 millisecond',
                              lease_version = lease_version + 1
         WHERE lock_key = $1 AND token = $2 AND expires_at > now()";
    /// deleteIfOwner: no deadline check, as a lock server's may have none.
    pub const DELETE_IF_OWNER: &str = "DELETE FROM lock_entry WHERE lock_key = $1 AND token = $2";
    /// read.
    pub const READ: &str = "SELECT owner_id, token FROM lock_entry WHERE lock_key = $1";
}

/// A connection that speaks the lock server's statements.
struct LockServer(PgConnection);

impl LockServer {
    async fn try_insert(&mut self, key: &str, owner: &str, ttl_ms: i64) -> Option<i64> {
        sqlx::query_scalar(statements::TRY_INSERT)
            .bind(key)
            .bind(owner)
            .bind(ttl_ms)
            .fetch_optional(&mut self.0)
            .await
            .unwrap_or_else(|e| panic!("tryInsert {key}: {e}"))
    }

    async fn extend(&mut self, key: &str, token: i64, ttl_ms: i64) -> bool {
        sqlx::query(statements::EXTEND)
            .bind(key)
            .bind(token)
            .bind(ttl_ms)
            .execute(&mut self.0)
            .await
            .unwrap_or_else(|e| panic!("extend {key}: {e}"))
            .rows_affected()
            == 1
    }

    async fn delete_if_owner(&mut self, key: &str, token: i64) -> bool {
        sqlx::query(statements::DELETE_IF_OWNER)
            .bind(key)
            .bind(token)
            .execute(&mut self.0)
            .await
            .unwrap_or_else(|e| panic!("deleteIfOwner {key}: {e}"))
            .rows_affected()
            == 1
    }
}

/// The lock server's steady work on keys of its own (acquire, extend,
/// release, read, every `every`), until stopped: how many calls, how many
/// failed, and each call's latency.
struct Steady {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<Duration>>,
}

impl Steady {
    fn start(url: String, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, failed) = (stop.clone(), failed.clone());
            async move {
                let mut conn = PgConnection::connect(&url)
                    .await
                    .expect("the lock server connects");
                let mut latencies = Vec::new();
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    i += 1;
                    let key = format!("steady-{}", i % 50);
                    let started = Instant::now();
                    let call = async {
                        let token: Option<i64> = sqlx::query_scalar(statements::TRY_INSERT)
                            .bind(&key)
                            .bind("steady")
                            .bind(60_000i64)
                            .fetch_optional(&mut conn)
                            .await?;
                        if let Some(token) = token {
                            sqlx::query(statements::EXTEND)
                                .bind(&key)
                                .bind(token)
                                .bind(60_000i64)
                                .execute(&mut conn)
                                .await?;
                            sqlx::query(statements::READ)
                                .bind(&key)
                                .fetch_optional(&mut conn)
                                .await?;
                            sqlx::query(statements::DELETE_IF_OWNER)
                                .bind(&key)
                                .bind(token)
                                .execute(&mut conn)
                                .await?;
                        }
                        Ok::<(), sqlx::Error>(())
                    };
                    if let Err(e) = call.await {
                        eprintln!("lock server call failed: {e}");
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                    latencies.push(started.elapsed());
                }
                latencies
            }
        });
        Self { stop, failed, task }
    }

    /// Stops; the calls' latencies and how many failed.
    async fn stop(self) -> (Vec<Duration>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let latencies = self.task.await.expect("the lock server's task");
        (latencies, self.failed.load(Ordering::SeqCst))
    }
}

/// A database whose lock server was made by its own migration as its own
/// owner role, the role, and a connection as it.
async fn lock_server_database(schema: Option<&str>) -> (TestDb, LoginRole, PgConnection) {
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    let owner = LoginRole::create(&db, &mut admin, "lockserver", "").await;
    match schema {
        None => {
            exec(
                &mut admin,
                &format!("GRANT CREATE ON SCHEMA public TO {}", owner.role),
            )
            .await
        }
        Some(schema) => {
            exec(
                &mut admin,
                &format!("CREATE SCHEMA {schema} AUTHORIZATION {}", owner.role),
            )
            .await;
            exec(
                &mut admin,
                &format!(
                    "ALTER DATABASE {} SET search_path = {schema}, public",
                    db.name
                ),
            )
            .await;
        }
    }
    let mut conn = owner.connect().await;
    sqlx::raw_sql(LOCK_SERVER)
        .execute(&mut conn)
        .await
        .expect("the lock server's migration");
    (db, owner, conn)
}

/// What a table holds, as one checksum of its rows in a fixed order.
async fn rows_checksum(conn: &mut PgConnection, table: &str) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {table} AS t"
    )))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Each of the lock server's tables: its file, its ACL, its rows.
async fn lock_server_state(conn: &mut PgConnection) -> Vec<(String, String)> {
    let mut state = Vec::new();
    for table in [
        "lock_entry",
        "lock_session",
        "flyway_schema_history",
        "lock_grant_audit",
    ] {
        let (filenode, acl): (String, Option<String>) = sqlx::query_as(
            "SELECT pg_relation_filenode(c.oid)::text, c.relacl::text FROM pg_class c WHERE c.oid = to_regclass($1)",
        )
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        let rows = rows_checksum(conn, table).await;
        state.push((
            table.to_owned(),
            format!("filenode {filenode} acl {acl:?} rows {rows}"),
        ));
    }
    let triggers: Vec<String> = sqlx::query_scalar(
        "SELECT tgname::text FROM pg_trigger WHERE tgrelid = to_regclass('lock_entry') AND NOT tgisinternal
            AND tgname NOT IN ('lock_entry_takeover', 'lock_entry_late_renewal', 'lock_entry_late_release') ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    state.push(("triggers".into(), triggers.join(",")));
    state
}

/// Waits, at most `within`, until nothing is left for a sweeper to report:
/// no expired lease, recorded expiry or hand-off.
async fn nothing_left_to_report(admin: &mut PgConnection, within: Duration) {
    poll(within, "nothing left to report", async || {
        let left = count(
            admin,
            "SELECT (SELECT count(*) FROM lock_entry WHERE expires_at <= now())
                  + (SELECT count(*) FROM lock_expiry_outbox) + (SELECT count(*) FROM lock_reap_handoff)",
        )
        .await;
        (left == 0).then_some(()).ok_or(format!("{left} left"))
    })
    .await;
}

/// Each `lease_expired` line as (lockKey, token, reapedBy).
fn reported(lines: &[String]) -> Vec<(String, String, String)> {
    events(lines, "lease_expired")
        .into_iter()
        .map(|f| {
            (
                f["lockKey"].clone(),
                f["token"].clone(),
                f["reapedBy"].clone(),
            )
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `migrate` adopts a lock server that runs, its statements going on at a
/// fixed rate throughout with none failing; then the daemon reports what the
/// lock server's own statements did, each once: leases whose holders died
/// (`sweep`), expired leases taken over by its tryInsert (`takeover`) and
/// released late by its deleteIfOwner (`release`); never a lease renewed or
/// released in time, nor a session's cascade.
#[tokio::test]
async fn adopted_lock_server_statements_each_expiry_once() {
    let (db, owner, mut ls) = lock_server_database(None).await;
    let history_before = rows_checksum(&mut ls, "flyway_schema_history").await;
    let steady = Steady::start(owner.url.clone(), Duration::from_millis(5));
    // The load runs before, through and after migrate.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (latencies, failed) = steady.stop().await;
    assert_eq!(code, Some(0), "{out}");
    let migrated = &events(
        &out.lines().map(str::to_owned).collect::<Vec<_>>(),
        "migrated",
    )[0];
    assert_eq!(migrated["lockServer"], "adopted", "{out}");
    assert_eq!(migrated["triggersApplied"], "true", "{out}");
    assert_eq!(
        migrated["indexBuilt"], "false",
        "its own index serves: {out}"
    );
    assert_eq!(failed, 0, "no lock server call failed during migrate");
    let mut sorted = latencies.clone();
    sorted.sort();
    eprintln!(
        "FIGURES adopt_under_load: calls={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        sorted.len(),
        percentile(&sorted, 0.5).as_secs_f64() * 1e3,
        percentile(&sorted, 0.99).as_secs_f64() * 1e3,
        sorted.last().unwrap().as_secs_f64() * 1e3
    );
    assert_eq!(
        rows_checksum(&mut ls, "flyway_schema_history").await,
        history_before,
        "its history untouched"
    );

    let mut server = LockServer(ls);
    let mut died = HashMap::new();
    for i in 0..20 {
        let key = format!("died-{i}");
        died.insert(
            key.clone(),
            server.try_insert(&key, "dead-holder", 1).await.unwrap(),
        );
    }
    for i in 0..10 {
        let key = format!("fine-{i}");
        let token = server
            .try_insert(&key, "good-holder", 60_000)
            .await
            .unwrap();
        assert!(server.extend(&key, token, 60_000).await);
        assert!(server.delete_if_owner(&key, token).await);
    }
    let mut taken = HashMap::new();
    let mut late = HashMap::new();
    for i in 0..5 {
        let key = format!("taken-{i}");
        taken.insert(
            key.clone(),
            server.try_insert(&key, "paused-holder", 1).await.unwrap(),
        );
        let key = format!("late-{i}");
        late.insert(
            key.clone(),
            server.try_insert(&key, "paused-holder", 1).await.unwrap(),
        );
    }
    // A session with three leases, expired, then ended: its cascade.
    exec(
        &mut server.0,
        "INSERT INTO lock_session (session_id, client_name) VALUES ('00000000-0000-0000-0000-0000000000aa', 'gone');
         INSERT INTO lock_entry (lock_key, owner_id, token, session_id, acquired_at, expires_at, lease_version)
         SELECT 'session-' || i, 'gone', nextval('ls_fencing_seq'), '00000000-0000-0000-0000-0000000000aa',
                now(), now() + interval '1 millisecond', 1 FROM generate_series(1, 3) AS i",
    )
    .await;
    // Not a wait for the daemon: let the 1 ms leases pass their deadline.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (key, token) in &taken {
        let new = server.try_insert(key, "next-holder", 60_000).await;
        assert!(new.is_some_and(|t| t > *token), "{key} taken over");
    }
    for (key, token) in &late {
        assert!(
            server.delete_if_owner(key, *token).await,
            "{key} released late"
        );
    }
    exec(
        &mut server.0,
        "DELETE FROM lock_session WHERE client_name = 'gone'",
    )
    .await;
    assert_eq!(
        count(
            &mut server.0,
            "SELECT count(*) FROM lock_entry WHERE lock_key LIKE 'session-%'"
        )
        .await,
        0
    );

    // The daemon, as a login role in lease_sweeper, beside the lock server.
    let mut admin = db.connect().await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let steady = Steady::start(owner.url.clone(), Duration::from_millis(5));
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, &port));
    daemon
        .wait_for_events("lease_expired", 30, Duration::from_secs(20))
        .await;
    // Quiet: nothing expired or recorded is left, and one more sweep ran.
    nothing_left_to_report(&mut admin, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (_, lines) = daemon.stop().await;
    let (_, failed) = steady.stop().await;
    assert_eq!(failed, 0, "no lock server call failed beside the daemon");

    let expired = events(&lines, "lease_expired");
    let reported: HashSet<(String, String, String)> = reported(&lines).into_iter().collect();
    let mut expected = HashSet::new();
    for (tokens, by) in [(&died, "sweep"), (&taken, "takeover"), (&late, "release")] {
        for (key, token) in tokens {
            expected.insert((key.clone(), token.to_string(), by.to_owned()));
        }
    }
    assert_eq!(expired.len(), 30, "one line each: {expired:#?}");
    assert_eq!(reported, expected);
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", 30)
        .await;
    assert!(
        count(
            &mut admin,
            "SELECT count(*) FROM lock_grant_audit WHERE lock_key LIKE 'taken-%'"
        )
        .await
            >= 10,
        "the lock server's own trigger still runs beside the sidecar's"
    );
    sweeper.drop(&mut admin).await;
}

/// `migrate` by a role that neither owns the lock server's table nor is a
/// superuser is refused, naming who can.
#[tokio::test]
async fn migrate_by_a_role_not_owning_lock_entry_refused() {
    let (db, owner, _ls) = lock_server_database(None).await;
    let mut admin = db.connect().await;
    let other = LoginRole::create(&db, &mut admin, "other", "CREATEROLE").await;
    exec(
        &mut admin,
        &format!("GRANT CREATE ON SCHEMA public TO {}", other.role),
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &other.url).await;

    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("public.lock_entry is owned by {}", owner.role))
            && out.contains(&format!("run lease-sweeper migrate as {}", owner.role)),
        "{out}"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname = 'lease_sweeper_sql'"
        )
        .await,
        0
    );
    // Its owner may.
    let (code, out) = run_binary(&["migrate"], &owner.url).await;
    assert_eq!(code, Some(0), "{out}");
    other.drop(&mut admin).await;
}

/// A lock server in a schema of its own on the search path: the sidecar
/// goes there, and sweeps it.
#[tokio::test]
async fn lock_entry_in_another_schema_swept() {
    let (db, owner, ls) = lock_server_database(Some("locks")).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("schema=locks"), "{out}");
    let mut admin = db.connect().await;
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'locks' AND c.relname = 'lock_expiry_outbox'").await,
        1
    );
    let mut server = LockServer(ls);
    let token = server
        .try_insert("elsewhere", "dead-holder", 1)
        .await
        .unwrap();
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&sweeper.url, &port));
    daemon
        .wait_for_events("lease_expired", 1, Duration::from_secs(20))
        .await;
    let (_, lines) = daemon.stop().await;
    let expired = events(&lines, "lease_expired");
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0]["token"], token.to_string());
    sweeper.drop(&mut admin).await;
    drop(owner);
}

/// `check` on a lock server's database not yet adopted says whose
/// lock_entry is and what `migrate` will add.
#[tokio::test]
async fn check_before_adoption_says_what_migrate_will_add() {
    let (db, owner, _ls) = lock_server_database(None).await;
    let statsd = StatsdCapture::start().await;
    let report = lease_sweeper::testing::check::preflight(&db.target(), &statsd.target()).await;
    let line = report
        .lines
        .iter()
        .find(|l| l.what == "lock server's table")
        .unwrap_or_else(|| panic!("{report}"));
    assert!(line.failed(), "{report}");
    assert!(
        line.detail.starts_with(&format!("public.lock_entry, owned by {}, fits; not adopted yet: `lease-sweeper migrate`, run as {} or a superuser, will add", owner.role, owner.role)),
        "{report}"
    );
    assert!(
        line.detail
            .contains("change none of the lock server's tables, rows or history"),
        "{report}"
    );
}

/// A job queue that lacks a column the reaper needs is refused by name,
/// nothing changed.
#[tokio::test]
async fn job_queue_missing_a_column_refused() {
    let (db, _owner, _ls) = lock_server_database(None).await;
    let mut admin = db.connect().await;
    exec(
        &mut admin,
        "CREATE TABLE job_queue (job_id uuid PRIMARY KEY, job_kind text, payload jsonb, state text,
                                 attempts integer, max_attempts integer, scheduled_at timestamptz,
                                 lease_owner text, last_error text)",
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &db.url).await;

    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("refusing to adopt public.job_queue, nothing was changed"),
        "{out}"
    );
    assert!(
        out.contains("no column lease_until (the lease's deadline)"),
        "{out}"
    );
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname = 'lease_sweeper_sql'"
        )
        .await,
        0
    );
}
