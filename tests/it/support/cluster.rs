//! The PostgreSQL the tests run against: one throwaway cluster per test
//! binary (or the server `DATABASE_URL` names), a database per test, and the
//! statements tests plant rows and read counts with.
//!
//! A migrated test database is a copy of a template migrated once per
//! server and set of migrations (`CREATE DATABASE … TEMPLATE`), not a fresh
//! run of every migration; a test that needs an empty or partly migrated
//! database asks for `TestDb::empty` and migrates it itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use lease_sweeper::testing::config::DbTarget;
use lease_sweeper::testing::throwaway::ThrowawayPg;
use sqlx::{Connection as _, PgConnection};

static CLUSTER: OnceLock<Mutex<ThrowawayPg>> = OnceLock::new();
static ADMIN_URL: OnceLock<String> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);
static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();

/// The start of the template database's name; the rest is
/// `migrations_hash`, so a changed or added migration gets a template of its
/// own, and test processes of different trees sharing one `DATABASE_URL`
/// server never use each other's. A template stays on such a server for the
/// next run (`DROP DATABASE` it once its migrations are gone).
const TEMPLATE_PREFIX: &str = "lease_sweeper_template_";

/// The session advisory lock (in the admin database) under which one test
/// process at a time checks for the template and builds it; an arbitrary
/// constant no other user of the lock space is expected to take, paired
/// with the template's hash.
const TEMPLATE_LOCK: i32 = 0x6c73_7470; // "lstp"

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

/// FNV-1a (64 bits) over every bundled migration's version and checksum
/// (itself a SHA-384 of its SQL) and every SQL file `migrate` runs, in hex:
/// the same for the same schema in every process and build, different as
/// soon as any of it changes.
fn migrations_hash() -> String {
    use lease_sweeper::testing::sql;
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0100_0000_01b3;
    let mut hash = FNV_OFFSET;
    let mut fold = |bytes: &[u8]| {
        for byte in bytes {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
    };
    for migration in lease_sweeper::testing::migrate::MIGRATOR.iter() {
        fold(&migration.version.to_le_bytes());
        fold(&migration.checksum);
    }
    for text in [
        sql::LOCK_SERVER,
        sql::JOB_SUBSTRATE,
        sql::LOCK_ENTRY_HOOKS,
        sql::SIDECAR_FUNCTIONS,
    ] {
        fold(text.as_bytes());
    }
    for (_, text) in sql::FUNCTIONS {
        fold(text.as_bytes());
    }
    format!("{hash:016x}")
}

/// The URL of database `name` on the admin database's server.
fn url_of(name: &str) -> String {
    let mut url = url::Url::parse(admin_url()).expect("admin URL parses");
    url.set_path(&format!("/{name}"));
    url.to_string()
}

/// The name of the migrated template, built on first use. Within this
/// process the once-cell runs one build; across processes sharing a server
/// the advisory lock does, and a template is finished only once it is
/// marked `IS_TEMPLATE` (a build a killed process left half done is dropped
/// and redone). Connections to it are then refused, so nothing can hold it
/// open while a test database is copied from it.
async fn template() -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let name = format!("{TEMPLATE_PREFIX}{}", migrations_hash());
            let mut admin = PgConnection::connect(admin_url())
                .await
                .expect("connecting to the admin database");
            sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
                .bind(TEMPLATE_LOCK)
                .bind(&name)
                .execute(&mut admin)
                .await
                .expect("taking the template's advisory lock");
            let finished: Option<bool> =
                sqlx::query_scalar("SELECT datistemplate FROM pg_database WHERE datname = $1")
                    .bind(&name)
                    .fetch_optional(&mut admin)
                    .await
                    .expect("looking for the template");
            if finished != Some(true) {
                if finished.is_some() {
                    exec(&mut admin, &format!("DROP DATABASE {name} WITH (FORCE)")).await;
                }
                exec(&mut admin, &format!("CREATE DATABASE {name}")).await;
                let mut conn = PgConnection::connect(&url_of(&name))
                    .await
                    .expect("connecting to the template");
                lease_sweeper::testing::migrate::migrate(&mut conn)
                    .await
                    .expect("migrations apply");
                conn.close()
                    .await
                    .expect("closing the template's connection");
                exec(
                    &mut admin,
                    &format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false IS_TEMPLATE true"),
                )
                .await;
            }
            sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
                .bind(TEMPLATE_LOCK)
                .bind(&name)
                .execute(&mut admin)
                .await
                .expect("releasing the template's advisory lock");
            name
        })
        .await
}

/// A fresh database for one test, dropped with it on a server of one's own.
pub struct TestDb {
    pub url: String,
    pub name: String,
}

impl TestDb {
    /// Creates a migrated database: a copy of the migrated template.
    pub async fn new() -> Self {
        let template = template().await;
        Self::create(&format!("TEMPLATE {template}")).await
    }

    /// Creates an empty database (no schema), for a test that migrates it
    /// itself, in part or in full.
    pub async fn empty() -> Self {
        Self::create("").await
    }

    /// `CREATE DATABASE` with a fresh name and `options`.
    async fn create(options: &str) -> Self {
        let name = format!(
            "lst_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::SeqCst)
        );
        let mut conn = PgConnection::connect(admin_url())
            .await
            .expect("connecting to the admin database");
        exec(&mut conn, &format!("CREATE DATABASE {name} {options}")).await;
        Self {
            url: url_of(&name),
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

/// Another session of a test database running one long statement: the
/// workload a sweeper looks for beside it (it holds a snapshot while the
/// statement runs). `stop` cancels the statement.
pub struct BusyNeighbour {
    pid: i32,
    task: tokio::task::JoinHandle<()>,
}

impl BusyNeighbour {
    /// Returns once the statement is seen running.
    pub async fn start(db: &TestDb) -> Self {
        Self::named(db, None).await
    }

    /// The same, its session's application_name set first (a sweeper's own
    /// name, say, which the sweeper does not count).
    pub async fn named(db: &TestDb, application_name: Option<&str>) -> Self {
        let mut neighbour = db.connect().await;
        if let Some(name) = application_name {
            sqlx::query("SELECT set_config('application_name', $1, false)")
                .bind(name)
                .execute(&mut neighbour)
                .await
                .unwrap();
        }
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut neighbour)
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            let _ = sqlx::query("SELECT pg_sleep(60)")
                .execute(&mut neighbour)
                .await;
        });
        crate::support::wait_until(
            std::time::Duration::from_secs(10),
            "the neighbour's statement to run",
            || async {
                let mut c = db.connect().await;
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                     WHERE pid = $1 AND state = 'active')",
                )
                .bind(pid)
                .fetch_one(&mut c)
                .await
                .unwrap()
            },
        )
        .await;
        Self { pid, task }
    }

    pub async fn stop(self, conn: &mut PgConnection) {
        sqlx::query("SELECT pg_cancel_backend($1)")
            .bind(self.pid)
            .execute(conn)
            .await
            .unwrap();
        self.task.await.unwrap();
    }
}
