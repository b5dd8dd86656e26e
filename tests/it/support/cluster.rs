//! The PostgreSQL the tests run against: one throwaway cluster per test
//! binary (or the server `DATABASE_URL` names), a database per test, and the
//! statements tests plant rows and read counts with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use lease_sweeper::testing::config::DbTarget;
use lease_sweeper::testing::throwaway::ThrowawayPg;
use sqlx::{Connection as _, PgConnection};

static CLUSTER: OnceLock<Mutex<ThrowawayPg>> = OnceLock::new();
static ADMIN_URL: OnceLock<String> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

extern "C" fn destroy_cluster() {
    if let Some(cluster) = CLUSTER.get()
        && let Ok(mut pg) = cluster.lock()
    {
        pg.destroy();
    }
}

/// URL of a database this process may create databases from.
fn admin_url() -> &'static str {
    ADMIN_URL.get_or_init(|| {
        if let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
            return url;
        }
        let pg = ThrowawayPg::start().expect("starting a throwaway PostgreSQL for the tests");
        let url = pg.url("postgres");
        CLUSTER.set(Mutex::new(pg)).ok().expect("cluster set once");
        // A static is never dropped, and neither std nor any crate offers a
        // safe way to run code at exit.
        // SAFETY: registering a plain extern "C" fn with no captured state.
        unsafe {
            libc::atexit(destroy_cluster);
        }
        url
    })
}

/// A fresh, migrated database for one test.
pub struct TestDb {
    pub url: String,
    pub name: String,
}

impl TestDb {
    /// Creates an empty database and applies the bundled migrations.
    pub async fn new() -> Self {
        let db = Self::empty().await;
        let mut conn = db.connect().await;
        lease_sweeper::testing::migrate::migrate(&mut conn)
            .await
            .expect("migrations apply");
        db
    }

    /// Creates an empty database (no schema).
    pub async fn empty() -> Self {
        let admin = admin_url().to_owned();
        let name = format!(
            "lst_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::SeqCst)
        );
        let mut conn = PgConnection::connect(&admin)
            .await
            .expect("connecting to the admin database");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE");
        let mut url = url::Url::parse(&admin).expect("admin URL parses");
        url.set_path(&format!("/{name}"));
        Self {
            url: url.to_string(),
            name,
        }
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .expect("connecting to the test database")
    }

    pub fn target(&self) -> DbTarget {
        DbTarget::from_url("LOCKDB_URL", &self.url).expect("test URL parses")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // The throwaway cluster goes away whole; an operator's server is kept tidy.
        if CLUSTER.get().is_some() {
            return;
        }
        let admin = admin_url().to_owned();
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&admin).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// Inserts `n` leases named `{prefix}{i}` whose deadline passed `ago_ms` ago;
/// returns each key with its token, as inserted (a running sweeper may have
/// reaped them already by the time a test could read the table).
pub async fn insert_expired(
    conn: &mut PgConnection,
    prefix: &str,
    n: i64,
    ago_ms: i64,
) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "INSERT INTO lock_entry (lock_key, owner_id, token, acquired_at, expires_at)
         SELECT $1 || i, 'owner-' || i, nextval('lock_fencing_token_seq'),
                now() - interval '1 hour', now() - $3 * interval '1 millisecond'
           FROM generate_series(1, $2) AS i
         RETURNING lock_key, token",
    )
    .bind(prefix)
    .bind(n)
    .bind(ago_ms)
    .fetch_all(conn)
    .await
    .expect("inserting expired leases")
    .into_iter()
    .collect()
}

/// Inserts `n` leased jobs whose lease ran out `overdue_ms` ago; returns their ids.
pub async fn insert_stale_jobs(
    conn: &mut PgConnection,
    kind: &str,
    n: i64,
    attempts: i32,
    max_attempts: i32,
    overdue_ms: i64,
) -> Vec<String> {
    sqlx::query_scalar(
        "INSERT INTO job_queue (job_kind, payload, state, attempts, max_attempts, lease_owner, lease_until)
         SELECT $1, jsonb_build_object('n', i), 'leased', $2, $3, 'worker-' || i,
                now() - $5 * interval '1 millisecond'
           FROM generate_series(1, $4) AS i
         RETURNING job_id::text",
    )
    .bind(kind)
    .bind(attempts)
    .bind(max_attempts)
    .bind(n)
    .bind(overdue_ms)
    .fetch_all(conn)
    .await
    .expect("inserting stale jobs")
}

/// Acquires `n` leases `{prefix}{i}` through the lock server's function
/// (owner `holder`), each of which must have been free; returns key → token.
pub async fn acquire(
    conn: &mut PgConnection,
    prefix: &str,
    n: usize,
    ttl_ms: i64,
) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    for i in 0..n {
        let key = format!("{prefix}{i}");
        let token: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, 'holder', $2)")
            .bind(&key)
            .bind(ttl_ms)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        out.insert(key, token.expect("the key was free"));
    }
    out
}

/// Runs `sql` (one or more statements, no parameters), failing the test
/// with the statement and the error.
pub async fn exec(conn: &mut PgConnection, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Runs blocking cluster control (start, stop) off the runtime thread, so
/// the daemons' output keeps being read meanwhile.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// A throwaway cluster of the test's own (for what the shared one cannot
/// show: roles that must not exist yet, its own pg_hba.conf, ...), started
/// with these extra settings, and a superuser connection to `postgres` on
/// which `setup` has run, statement by statement.
pub async fn own_cluster(settings: &[(&str, &str)], setup: &[&str]) -> (ThrowawayPg, PgConnection) {
    let owned: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let pg = blocking(move || {
        let settings: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        ThrowawayPg::start_with(&settings)
    })
    .await
    .expect("a throwaway PostgreSQL");
    let mut admin = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    for sql in setup {
        exec(&mut admin, sql).await;
    }
    (pg, admin)
}

pub async fn count(conn: &mut PgConnection, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(conn)
        .await
        .expect("count query")
}

/// A test transaction holding `job_queue` in ACCESS EXCLUSIVE mode: every
/// apply and dry run waits on it, so the job reaper's loop cannot finish a
/// pass until `release`. (The server's statement_timeout of the daemon ends a
/// wait after 30 s; tests release well before.)
pub struct JobQueueBlock(PgConnection);

impl JobQueueBlock {
    pub async fn hold(db: &TestDb) -> Self {
        let mut conn = db.connect().await;
        sqlx::raw_sql("BEGIN; LOCK TABLE job_queue IN ACCESS EXCLUSIVE MODE")
            .execute(&mut conn)
            .await
            .expect("locking job_queue");
        Self(conn)
    }

    /// Jobs still leased, seen from inside the blocking transaction.
    pub async fn leased_jobs(&mut self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM job_queue WHERE state = 'leased'")
            .fetch_one(&mut self.0)
            .await
            .unwrap()
    }

    pub async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .expect("releasing job_queue");
    }
}

/// Applies the bundled migrations up to and including `version` only, so a
/// test can plant rows an older schema admitted before migrating the rest.
pub async fn migrate_to(conn: &mut PgConnection, version: i64) {
    lease_sweeper::testing::migrate::MIGRATOR
        .run_to(version, conn)
        .await
        .expect("migrations up to the given version apply");
}

/// Runs `sql`, which must fail, and asserts its SQLSTATE is `code`.
pub async fn assert_fails_with(conn: &mut PgConnection, sql: &'static str, code: &str) {
    let err = sqlx::raw_sql(sql)
        .execute(conn)
        .await
        .expect_err(&format!("{sql} should fail with SQLSTATE {code}"));
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some(code),
        "{sql}: {err}"
    );
}
