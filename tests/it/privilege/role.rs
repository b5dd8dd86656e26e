//! Least privilege: the migration-created `lease_sweeper` role, granted to a
//! LOGIN role as an operator would, runs the real daemon and passes the
//! preflight, holds exactly its documented privileges, and can do nothing
//! else (create, renew, steal, forge, change gates, delete or lock a live
//! lease); its migration says when CREATEROLE is missing and survives many
//! databases migrating at once. That the SECURITY DEFINER functions cannot
//! be hijacked is `privilege::definer_hijack`.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::Connection as _;

use crate::privilege::support::{GRANTED, assert_denied, insert_live_job, job_state};
use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, count, daemon_env, events, insert_expired,
    insert_stale_jobs, open_gates, own_cluster, run_binary,
};

#[tokio::test]
async fn granted_login_role_sweeps_everything() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let login = LoginRole::create(&db, &mut admin, "sweeper", GRANTED).await;
    insert_expired(&mut admin, "expired-", 5, 1_000).await;
    insert_expired(&mut admin, "stolen", 1, 1_000).await;
    let thief: Option<i64> = sqlx::query_scalar("SELECT lock_acquire('stolen1', 'thief', 60000)")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(thief.is_some(), "the expired lease was taken over");
    for i in 0..3 {
        sqlx::query("SELECT lock_acquire($1, 'holder', 60000)")
            .bind(format!("live-{i}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    open_gates(&mut admin).await;
    let reset = insert_stale_jobs(&mut admin, "retryable", 2, 0, 5, 60_000).await;
    let dead = insert_stale_jobs(&mut admin, "last-try", 1, 4, 5, 60_000).await;
    let live_job = insert_live_job(&mut admin).await;

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&daemon_env(&login.url, &port));
    crate::support::wait_until(
        Duration::from_secs(15),
        "leases and jobs reaped",
        || async {
            let lines = daemon.lines();
            events(&lines, "lease_expired").len() == 6
                && events(&lines, "job_lease_expired").len() == 3
        },
    )
    .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    let errors: Vec<&String> = lines.iter().filter(|l| l.contains("level=error")).collect();
    assert!(errors.is_empty(), "no permission is missing: {errors:#?}");
    assert!(lines.iter().all(|l| !l.contains("permission denied")));
    let by: Vec<String> = events(&lines, "lease_expired")
        .iter()
        .map(|f| f["reapedBy"].clone())
        .collect();
    assert_eq!(by.iter().filter(|b| *b == "takeover").count(), 1, "{by:?}");
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_entry").await,
        4,
        "3 live leases and the thief's"
    );
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM lock_expiry_outbox").await,
        0
    );
    for id in &reset {
        assert_eq!(job_state(&mut admin, id).await, "retry_waiting");
    }
    assert_eq!(job_state(&mut admin, &dead[0]).await, "dead_letter");
    assert_eq!(job_state(&mut admin, &live_job).await, "leased");
    eprintln!(
        "FIGURES least_privilege_run: role={} leases_reported=6 (1 takeover) jobs_reaped=3 errors=0",
        login.role
    );
    login.drop(&mut admin).await;
}

#[tokio::test]
async fn granted_login_role_passes_preflight() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let login = LoginRole::create(&db, &mut admin, "preflight", GRANTED).await;
    let statsd = StatsdCapture::start().await;
    let target =
        lease_sweeper::testing::config::DbTarget::from_url("LOCKDB_URL", &login.url).unwrap();

    let report = lease_sweeper::testing::check::preflight(&target, &statsd.target()).await;

    let failed: Vec<String> = report
        .lines
        .iter()
        .filter(|l| l.failed())
        .map(|l| format!("{}: {}", l.what, l.detail))
        .collect();
    assert!(
        report.passed(),
        "the role has what check expects: {failed:#?}"
    );
    login.drop(&mut admin).await;
}

#[tokio::test]
async fn holds_exactly_documented_privileges() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;

    let attrs: (bool, bool, bool, bool, bool, bool) = sqlx::query_as(
        "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls
           FROM pg_roles WHERE rolname = 'lease_sweeper'",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        attrs,
        (false, false, false, false, false, false),
        "NOLOGIN, no attributes"
    );

    // The documented table, row by row, against the grants the migrations
    // really made to the role (its entries in the ACLs of the schema, its
    // relations, their columns and its functions).
    let documented = documented_grants();
    let granted: BTreeSet<(String, String)> = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, a.privilege_type
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          CROSS JOIN LATERAL aclexplode(p.proacl) a
          WHERE n.nspname = current_schema() AND a.grantee = 'lease_sweeper'::regrole
         UNION ALL
         SELECT c.relname::text, a.privilege_type
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN LATERAL aclexplode(c.relacl) a
          WHERE n.nspname = current_schema() AND a.grantee = 'lease_sweeper'::regrole
         UNION ALL
         SELECT c.relname::text || '.' || att.attname::text, a.privilege_type
           FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN LATERAL aclexplode(att.attacl) a
          WHERE n.nspname = current_schema() AND a.grantee = 'lease_sweeper'::regrole
         UNION ALL
         SELECT 'the schema', a.privilege_type
           FROM pg_namespace n CROSS JOIN LATERAL aclexplode(n.nspacl) a
          WHERE n.nspname = current_schema() AND a.grantee = 'lease_sweeper'::regrole",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap()
    .into_iter()
    .map(|(object, privilege): (String, String)| (signature(&object), privilege))
    .collect();
    assert_eq!(
        granted, documented,
        "the grants in the database (left) and docs/least-privilege.md's table (right)"
    );

    // Nothing reaches the role another way (PUBLIC's grants included):
    // table-level privileges on every relation of the schema ...
    let tables: BTreeSet<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, p
           FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) AS p
          WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
            AND has_table_privilege('lease_sweeper', c.oid, p)",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let whole_tables: BTreeSet<(String, String)> = documented
        .iter()
        .filter(|(object, _)| !object.contains(['(', '.', ' ']))
        .cloned()
        .collect();
    assert_eq!(tables, whole_tables);

    // ... columns readable (on job_queue only the dry run's, never a payload
    // or metadata) ...
    let readable: BTreeSet<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text || '.' || a.attname::text, 'SELECT'
           FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
            AND has_column_privilege('lease_sweeper', c.oid, a.attnum, 'SELECT')
            AND NOT has_table_privilege('lease_sweeper', c.oid, 'SELECT')",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let columns_documented: BTreeSet<(String, String)> = documented
        .iter()
        .filter(|(object, _)| object.contains('.'))
        .cloned()
        .collect();
    assert_eq!(readable, columns_documented);

    // ... no column-level write (a column UPDATE would let it lock rows
    // with SELECT … FOR UPDATE) ...
    let columns: BTreeSet<(String, String, String)> = sqlx::query_as(
        "SELECT c.relname::text, a.attname::text, p
           FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          CROSS JOIN unnest(ARRAY['INSERT','UPDATE','REFERENCES']) AS p
          WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
            AND has_column_privilege('lease_sweeper', c.oid, a.attnum, p)",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(columns, BTreeSet::new());

    let sequences: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN unnest(ARRAY['USAGE','SELECT','UPDATE']) AS p
          WHERE n.nspname = current_schema() AND c.relkind = 'S'
            AND has_sequence_privilege('lease_sweeper', c.oid, p)",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(sequences, 0, "no sequence: it never mints a fencing token");

    // ... and no function running with its owner's rights beyond the
    // documented ones.
    let definers: BTreeSet<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = current_schema() AND p.prosecdef
            AND has_function_privilege('lease_sweeper', p.oid, 'EXECUTE')",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap()
    .into_iter()
    .map(|f: String| signature(&f))
    .collect();
    let undocumented: Vec<&String> = definers
        .iter()
        .filter(|f| !documented.contains(&((*f).clone(), "EXECUTE".to_owned())))
        .collect();
    assert!(
        undocumented.is_empty(),
        "definer functions the role may run that docs/least-privilege.md does not list: {undocumented:?}"
    );

    let (usage, create, db_create): (bool, bool, bool) = sqlx::query_as(
        "SELECT has_schema_privilege('lease_sweeper', current_schema(), 'USAGE'),
                has_schema_privilege('lease_sweeper', current_schema(), 'CREATE'),
                has_database_privilege('lease_sweeper', current_database(), 'CREATE')",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!((usage, create, db_create), (true, false, false));
}

#[tokio::test]
async fn cannot_create_renew_steal_or_gate() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let login = LoginRole::create(&db, &mut admin, "limited", GRANTED).await;
    sqlx::query("SELECT lock_acquire('live', 'holder', 60000)")
        .execute(&mut admin)
        .await
        .unwrap();
    insert_expired(&mut admin, "expired-", 1, 1_000).await;
    open_gates(&mut admin).await; // so claim gets past its gate check to the write
    insert_stale_jobs(&mut admin, "stale", 1, 0, 5, 60_000).await;
    let snapshot = "SELECT (SELECT string_agg(format('%s/%s/%s/%s', lock_key, owner_id, token, expires_at), ',' ORDER BY lock_key) FROM lock_entry)
                || (SELECT string_agg(format('%s=%s', key, value), ',' ORDER BY key) FROM queue_setting)
                || (SELECT string_agg(format('%s/%s/%s', job_kind, state, lease_until), ',' ORDER BY job_kind) FROM job_queue)
                || (SELECT count(*) FROM lock_expiry_outbox)::text
                || (SELECT count(*) FROM job_dead_letter)::text";
    let before: String = sqlx::query_scalar(snapshot)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let mut low = login.connect().await;

    // Leases: no new lease, no renewal, no steal, no rewrite, no forged expiry.
    for sql in [
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at) VALUES ('mine', 'me', 1, now() + interval '1 h')",
        "SELECT lock_acquire('mine', 'me', 60000)",
        "SELECT lock_acquire('expired-1', 'me', 60000)",
        "UPDATE lock_entry SET expires_at = now() + interval '1 day'",
        "UPDATE lock_entry SET token = token + 1000",
        "UPDATE lock_entry SET owner_id = 'me'",
        "SELECT lock_renew('live', (SELECT token FROM lock_entry WHERE lock_key = 'live'), 60000)",
        "TRUNCATE lock_entry",
        "INSERT INTO lock_expiry_outbox (lock_key, owner_id, token, expires_at, new_token) VALUES ('forged', 'x', 1, now(), 2)",
        "UPDATE lock_expiry_outbox SET expires_at = now()",
        "SELECT nextval('lock_fencing_token_seq')",
        "DELETE FROM lock_session",
    ] {
        assert_denied(&mut low, sql).await;
    }
    // Gates and jobs: only through the reaper's apply.
    for sql in [
        "SELECT fn_queue_setting_set('queue.lease.reaper_enabled', 'false', 'mallory')",
        "UPDATE queue_setting SET value = 'true'",
        "INSERT INTO queue_setting_audit (key, new_value, actor) VALUES ('k', 'v', 'mallory')",
        "SELECT fn_job_enqueue('evil')",
        "SELECT * FROM fn_job_claim('mallory')",
        "SELECT fn_job_move_to_dead_letter((SELECT job_id FROM job_queue LIMIT 1), 'x', 'mallory')",
        "UPDATE job_queue SET lease_until = now() - interval '1 h'",
        "DELETE FROM job_queue",
        "INSERT INTO job_dead_letter (job_id, job_kind, payload, attempts, final_error, moved_by) VALUES (gen_random_uuid(), 'k', '{}', 1, 'e', 'm')",
    ] {
        assert_denied(&mut low, sql).await;
    }
    // No new objects, no other identity.
    for sql in [
        "CREATE TABLE public.mine (x int)",
        "CREATE SCHEMA mine",
        "SET ROLE postgres",
    ] {
        assert_denied(&mut low, sql).await;
    }

    let after: String = sqlx::query_scalar(snapshot)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(after, before, "nothing changed");
    low.close().await.unwrap();
    login.drop(&mut admin).await;
}

#[tokio::test]
async fn reaps_only_expired_leases() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let login = LoginRole::create(&db, &mut admin, "nodelete", GRANTED).await;
    let live: i64 = sqlx::query_scalar("SELECT lock_acquire('live', 'holder', 60000)")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    insert_expired(&mut admin, "expired-", 3, 1_000).await;
    let mut low = login.connect().await;

    assert_denied(&mut low, "DELETE FROM lock_entry WHERE lock_key = 'live'").await;
    assert_denied(&mut low, "DELETE FROM lock_entry").await;
    assert_denied(&mut low, "DELETE FROM lock_expiry_outbox").await;
    assert_denied(
        &mut low,
        "SELECT lock_release('live', (SELECT token FROM lock_entry WHERE lock_key = 'live'))",
    )
    .await;
    // Row locks on a live lease would stall the lock server's renewals.
    assert_denied(
        &mut low,
        "SELECT 1 FROM lock_entry WHERE lock_key = 'live' FOR UPDATE",
    )
    .await;
    assert_denied(&mut low, "SELECT 1 FROM lock_entry FOR KEY SHARE").await;
    // What it can do: reap what expired, through the definer function.
    let reaped: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_batch(100)")
            .fetch_all(&mut low)
            .await
            .unwrap();
    assert_eq!(reaped.len(), 3, "{reaped:?}");
    assert!(reaped.iter().all(|k| k.starts_with("expired-")));
    let left: Vec<(String, i64)> = sqlx::query_as("SELECT lock_key, token FROM lock_entry")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        left,
        vec![("live".to_owned(), live)],
        "the live lease survives"
    );
    low.close().await.unwrap();
    login.drop(&mut admin).await;
}

/// Migrates `database` of `pg` as `user` with the real binary.
async fn migrate_as(
    pg: &lease_sweeper::testing::throwaway::ThrowawayPg,
    user: &str,
    database: &str,
) -> (Option<i32>, String) {
    let mut url = url::Url::parse(&pg.url(database)).unwrap();
    url.set_username(user).unwrap();
    run_binary(&["migrate"], url.as_str()).await
}

#[tokio::test]
async fn migration_names_createrole_survives_concurrency() {
    // A cluster of its own, so `lease_sweeper` does not exist yet.
    let (pg, mut admin) = own_cluster(
        &[],
        &[
            "CREATE ROLE locks_owner LOGIN CREATEDB",
            "CREATE DATABASE owned OWNER locks_owner",
        ],
    )
    .await;

    let (code, out) = migrate_as(&pg, "locks_owner", "owned").await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "creating role lease_sweeper needs CREATEROLE, which locks_owner lacks; have an \
             administrator run CREATE ROLE lease_sweeper NOLOGIN once per cluster, then run \
             lease-sweeper migrate again"
        ),
        "says what to do: {out}"
    );

    // Eight databases migrated at the same moment, the role still missing:
    // each migration may try to create it; all must succeed, one role results.
    let names: Vec<String> = (0..8).map(|i| format!("parallel_{i}")).collect();
    for name in &names {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let runs = names.iter().map(|name| migrate_as(&pg, "postgres", name));
    for (code, out) in futures_util::future::join_all(runs).await {
        assert_eq!(code, Some(0), "{out}");
    }
    let roles = count(
        &mut admin,
        "SELECT count(*) FROM pg_roles WHERE rolname = 'lease_sweeper'",
    )
    .await;
    assert_eq!(roles, 1);
    // Now that it exists, the owner without CREATEROLE migrates fine.
    let (code, out) = migrate_as(&pg, "locks_owner", "owned").await;
    assert_eq!(code, Some(0), "{out}");
    drop(admin);
    drop(pg);
}

/// The grants docs/least-privilege.md's table says the role holds, as
/// (object, privilege): `lock_reap_batch(integer,bigint)` (spaces dropped,
/// as `regprocedure` prints it), `queue_setting`, `job_queue.job_id` for a
/// column, `the schema`.
fn documented_grants() -> BTreeSet<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/least-privilege.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("2. "))
        .expect("docs/least-privilege.md has its section 2, what the role holds");
    let mut out = BTreeSet::new();
    for row in section
        .lines()
        .filter(|l| l.starts_with("| `") || l.starts_with("| the schema"))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (object, privilege) = (cells[1].trim_matches('`'), cells[2]);
        if let Some(columns) = privilege.strip_prefix("SELECT on `") {
            let columns = columns.split('`').next().unwrap();
            for column in columns.split(',') {
                out.insert((format!("{object}.{}", column.trim()), "SELECT".to_owned()));
            }
        } else {
            out.insert((signature(object), privilege.to_owned()));
        }
    }
    assert!(
        out.len() > 10,
        "{path}: the table of section 2 was not found"
    );
    out
}

/// A function's signature as `regprocedure` prints it (no space after a
/// comma); any other object unchanged.
fn signature(object: &str) -> String {
    if object.contains('(') {
        object.replace(' ', "")
    } else {
        object.to_owned()
    }
}
