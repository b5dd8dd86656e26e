//! Shared test plumbing: a real PostgreSQL, a database per test, a real UDP
//! StatsD listener and the real binary.
//!
//! When `DATABASE_URL` is set, every test creates its own database on that
//! server (and drops it afterwards). Otherwise this test binary starts one
//! throwaway cluster (as the `postgres` user when run as root), shared by all
//! its tests and removed at exit.

#![allow(dead_code)]

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lease_sweeper::testing::config::DbTarget;
use lease_sweeper::testing::throwaway::ThrowawayPg;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::{Connection as _, PgConnection};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::UdpSocket;

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

/// A LOGIN role for one test's database, and the URL that logs in as it.
/// Roles are cluster-wide: the name carries the database's.
pub struct LoginRole {
    pub role: String,
    pub url: String,
}

impl LoginRole {
    /// `CREATE ROLE <db>_<suffix> LOGIN <options>`. The throwaway cluster
    /// trusts local connections, so the URL carries no password (see the
    /// password test in `hostile` for real authentication).
    pub async fn create(
        db: &TestDb,
        admin: &mut PgConnection,
        suffix: &str,
        options: &str,
    ) -> Self {
        Self::create_with(db, admin, suffix, None, options).await
    }

    /// The same with `PASSWORD '<password>'`, which the URL carries too.
    pub async fn with_password(
        db: &TestDb,
        admin: &mut PgConnection,
        suffix: &str,
        password: &str,
        options: &str,
    ) -> Self {
        Self::create_with(db, admin, suffix, Some(password), options).await
    }

    async fn create_with(
        db: &TestDb,
        admin: &mut PgConnection,
        suffix: &str,
        password: Option<&str>,
        options: &str,
    ) -> Self {
        let role = format!("{}_{suffix}", db.name);
        let pass = password.map_or(String::new(), |p| format!("PASSWORD '{p}'"));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {role} LOGIN {pass} {options}"
        )))
        .execute(admin)
        .await
        .unwrap_or_else(|e| panic!("creating role {role}: {e}"));
        let mut url = url::Url::parse(&db.url).expect("test URL parses");
        url.set_username(&role).unwrap();
        url.set_password(password).unwrap();
        Self {
            role,
            url: url.to_string(),
        }
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connecting as {}: {e}", self.role))
    }

    /// Removes the role (and anything it owns or was granted) from this database.
    pub async fn drop(self, admin: &mut PgConnection) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP OWNED BY {0} CASCADE; DROP ROLE {0}",
            self.role
        )))
        .execute(admin)
        .await
        .unwrap_or_else(|e| panic!("dropping role {}: {e}", self.role));
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

/// Polls `check` every 20 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A real UDP socket standing in for a StatsD agent.
#[derive(Clone)]
pub struct StatsdCapture {
    pub port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl StatsdCapture {
    pub async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind UDP");
        let port = socket.local_addr().unwrap().port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok(n) = socket.recv(&mut buf).await {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock().unwrap().extend(text.lines().map(str::to_owned));
            }
        });
        Self { port, lines }
    }

    pub fn target(&self) -> lease_sweeper::testing::config::StatsdTarget {
        lease_sweeper::testing::config::StatsdTarget {
            host: "127.0.0.1".into(),
            port: self.port,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Sum of every `name:N|c|#tags` line with exactly these tags.
    pub fn counter(&self, name: &str, tags: &str) -> u64 {
        self.lines()
            .iter()
            .filter_map(|l| {
                let (metric, rest) = l.split_once(':')?;
                let mut parts = rest.split('|');
                let value = parts.next()?;
                let kind = parts.next()?;
                let line_tags = parts.next().unwrap_or("");
                (metric == name && kind == "c" && line_tags == tags)
                    .then(|| value.parse::<u64>().ok())?
            })
            .sum()
    }

    /// The last value of a gauge with exactly these tags.
    pub fn gauge(&self, name: &str, tags: &str) -> Option<u64> {
        self.lines().iter().rev().find_map(|l| {
            let (metric, rest) = l.split_once(':')?;
            let parts: Vec<&str> = rest.split('|').collect();
            (metric == name
                && parts.get(1) == Some(&"g")
                && parts.get(2).copied().unwrap_or("") == tags)
                .then(|| parts[0].parse().ok())?
        })
    }

    pub async fn wait_counter(&self, name: &str, tags: &str, expected: u64) {
        let what = format!("{name} {tags} to reach {expected}");
        wait_until(Duration::from_secs(10), &what, || async {
            self.counter(name, tags) >= expected
        })
        .await;
    }
}

/// Decodes a logfmt line into a map (asserting it decodes at all).
pub fn fields(line: &str) -> HashMap<String, String> {
    lease_sweeper::testing::logfmt::decode_line(line)
        .unwrap_or_else(|| panic!("not a logfmt line: {line:?}"))
        .into_iter()
        .collect()
}

/// Lines whose `message` is `name`.
pub fn events(lines: &[String], name: &str) -> Vec<HashMap<String, String>> {
    lines
        .iter()
        .map(|l| fields(l))
        .filter(|f| f.get("message").map(String::as_str) == Some(name))
        .collect()
}

/// The real binary, built by cargo for this test run.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lease-sweeper"))
}

/// The real daemon running `run`, its stdout collected line by line.
pub struct Daemon {
    pub child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The stdout and stderr readers; each ends at its pipe's end of file.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Daemon {
    /// Starts `lease-sweeper run` with exactly these environment variables
    /// (plus PATH), so nothing from the developer's shell leaks in.
    pub fn spawn(env: &[(&str, &str)]) -> Self {
        Self::spawn_args(&["run"], env)
    }

    pub fn spawn_args(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_program(&binary(), args, env)
    }

    /// Like `spawn_args` with another program in front (e.g. `runuser`).
    pub fn spawn_program(program: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning lease-sweeper");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let sink = lines.clone();
            readers.push(tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    sink.lock().unwrap().push(line);
                }
            }));
        }
        Self {
            child,
            lines,
            readers,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("daemon still running") as i32
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Lines so far for which `pred` holds, counted in place: polling a
    /// drain of 100,000s of lines must not copy them all every 20 ms (that
    /// took CPU from the daemon under test on a 2-core machine).
    pub fn count_lines(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| pred(l))
            .count()
    }

    pub fn signal(&self, signal: i32) {
        let signal = Signal::try_from(signal).expect("a signal number");
        let _ = kill(Pid::from_raw(self.pid()), signal);
    }

    pub async fn wait_for_event(&self, name: &str, timeout: Duration) {
        wait_until(timeout, &format!("daemon event {name}"), || async {
            !events(&self.lines(), name).is_empty()
        })
        .await;
    }

    /// Waits until the daemon has written at least `n` lines of event `name`.
    pub async fn wait_for_events(&self, name: &str, n: usize, timeout: Duration) {
        wait_until(timeout, &format!("{n} {name} lines"), || async {
            events(&self.lines(), name).len() >= n
        })
        .await;
    }

    /// Stops it as systemd or Docker would (SIGTERM), waits up to 10 s for
    /// its exit and returns the exit code and every line it wrote.
    pub async fn stop(&mut self) -> (Option<i32>, Vec<String>) {
        self.signal(libc::SIGTERM);
        let (code, _) = self.wait_exit(Duration::from_secs(10)).await;
        (code, self.lines())
    }

    /// Waits for exit; returns the code and how long it took.
    pub async fn wait_exit(&mut self, timeout: Duration) -> (Option<i32>, Duration) {
        let start = Instant::now();
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "daemon did not exit within {timeout:?}; output:\n{}",
                    self.lines().join("\n")
                )
            })
            .expect("waiting for the daemon");
        let took = start.elapsed();
        // Its pipes are closed now: the readers end once they hold every line.
        for reader in std::mem::take(&mut self.readers) {
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("the daemon's output ends after its exit")
                .expect("reading the daemon's output");
        }
        (status.code(), took)
    }
}

/// The environment of a daemon sweeping `url` and sending StatsD to the
/// capture on `statsd_port`.
pub fn daemon_env<'a>(url: &'a str, statsd_port: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("LOCKDB_URL", url),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", statsd_port),
    ]
}

/// The three job-reaper gates.
pub const SUBSTRATE: &str = "queue.job_substrate.enabled";
pub const REAPER: &str = "queue.lease.reaper_enabled";
pub const DRY_ONLY: &str = "queue.lease.reaper_dry_run_only";

/// Changes one queue setting through the audited setter, as an operator
/// would (actor `test-operator`); returns the setter's JSON.
pub async fn set_setting(conn: &mut PgConnection, key: &str, value: &str) -> serde_json::Value {
    let text: String =
        sqlx::query_scalar("SELECT fn_queue_setting_set($1, $2, 'test-operator')::text")
            .bind(key)
            .bind(value)
            .fetch_one(conn)
            .await
            .unwrap_or_else(|e| panic!("setting {key}={value}: {e}"));
    serde_json::from_str(&text).expect("the setter returns JSON")
}

/// Puts the three job-reaper gates in these positions, in gate order.
pub async fn set_gates(conn: &mut PgConnection, substrate: bool, reaper: bool, dry_only: bool) {
    for (key, on) in [
        (SUBSTRATE, substrate),
        (REAPER, reaper),
        (DRY_ONLY, dry_only),
    ] {
        set_setting(conn, key, if on { "true" } else { "false" }).await;
    }
}

/// All three gates in the "reap" position.
pub async fn open_gates(conn: &mut PgConnection) {
    set_gates(conn, true, true, false).await;
}

/// Runs the job reaper's apply as `conn`'s role; returns its JSON (the
/// report, or the refusal).
pub async fn apply_stale_leases(
    conn: &mut PgConnection,
    actor: &str,
    limit: Option<i32>,
) -> serde_json::Value {
    let text: String = sqlx::query_scalar("SELECT fn_job_reap_stale_leases_apply($1, $2)::text")
        .bind(actor)
        .bind(limit)
        .fetch_one(conn)
        .await
        .expect("apply runs");
    serde_json::from_str(&text).expect("apply returns JSON")
}

/// Lock sweeps seen so far: each one that finishes sends the held gauge.
pub fn lock_sweeps_seen(statsd: &StatsdCapture) -> usize {
    statsd
        .lines()
        .iter()
        .filter(|l| l.starts_with("lock.held.current:"))
        .count()
}

/// Job-reaper passes seen so far: each one that finishes sends the stale gauge.
pub fn job_passes_seen(statsd: &StatsdCapture) -> usize {
    statsd
        .lines()
        .iter()
        .filter(|l| l.starts_with("queue.lease.stale.current:"))
        .count()
}

/// Waits until `seen` has grown by `n` from its value now (20 s at most):
/// the one shape of "let N more passes happen" that every signal uses.
async fn wait_more(n: usize, what: &str, seen: impl Fn() -> usize) {
    let target = seen() + n;
    wait_until(
        Duration::from_secs(20),
        &format!("{n} more {what}"),
        || async { seen() >= target },
    )
    .await;
}

/// Waits until `n` more lock sweeps have finished (a deterministic "let a
/// few sweeps pass": no fixed sleep).
pub async fn wait_sweeps(statsd: &StatsdCapture, n: usize) {
    wait_more(n, "lock sweeps", || lock_sweeps_seen(statsd)).await;
}

/// Waits until `n` more job-reaper passes have finished.
pub async fn wait_job_passes(statsd: &StatsdCapture, n: usize) {
    wait_more(n, "job-reaper passes", || job_passes_seen(statsd)).await;
}

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the system temp dir, removed on drop (even when
/// the test fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ls-{what}-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a temp dir");
        Self(dir)
    }

    /// The same, mode 0755 whatever the umask, and owned by `owner`
    /// (uid, gid) when given: for files another user (`postgres`, PgBouncer
    /// run unprivileged) must read.
    pub fn shared(what: &str, owner: Option<(u32, u32)>) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = Self::new(what);
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir.0, Some(uid), Some(gid)).unwrap();
        }
        dir
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A stand-in for systemd's notify socket: every datagram, with its arrival.
pub struct NotifySocket {
    _dir: TempDir,
    pub path: PathBuf,
    messages: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    pub fn bind() -> Self {
        let dir = TempDir::new("notify");
        let path = dir.0.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("binding the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let messages = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, done) = (messages.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => {
                        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                        sink.lock().unwrap().push((Instant::now(), text));
                    }
                    // Asked to stop and the socket is empty: all is read.
                    Err(_) if done.load(Ordering::SeqCst) => break,
                    Err(_) => {}
                }
            }
        });
        Self {
            _dir: dir,
            path,
            messages,
            stop,
            reader: Some(reader),
        }
    }

    /// `daemon_env` plus `NOTIFY_SOCKET` pointing here: the environment
    /// systemd gives a `Type=notify` unit.
    pub fn daemon_env<'a>(&'a self, url: &'a str, statsd_port: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut env = daemon_env(url, statsd_port);
        env.push(("NOTIFY_SOCKET", self.path.to_str().unwrap()));
        env
    }

    /// Reads every datagram already sent (for example by a daemon that has
    /// exited) and stops listening: after this, `messages` is final.
    pub async fn finish(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            tokio::task::spawn_blocking(move || reader.join())
                .await
                .expect("joining the notify reader")
                .expect("the notify reader does not panic");
        }
    }

    /// The datagrams received so far, with the time each arrived.
    pub fn messages(&self) -> Vec<(Instant, String)> {
        self.messages.lock().unwrap().clone()
    }

    /// The arrival times of datagrams carrying the assignment `state`.
    pub fn arrivals(&self, state: &str) -> Vec<Instant> {
        self.messages()
            .into_iter()
            .filter(|(_, m)| m.lines().any(|l| l == state))
            .map(|(t, _)| t)
            .collect()
    }

    /// `WATCHDOG=1` pings so far. The daemon pings each time every service
    /// loop has finished a pass, failed or not (`progress`), so this counts
    /// passes where nothing else does: a failing pass sends no gauge.
    pub fn watchdogs(&self) -> usize {
        self.arrivals("WATCHDOG=1").len()
    }

    /// Waits until `n` more `WATCHDOG=1` pings arrived: every service loop
    /// has finished at least `n` more passes, whether they failed or not.
    pub async fn wait_watchdogs(&self, n: usize) {
        wait_more(n, "WATCHDOG=1 (passes of every loop)", || self.watchdogs()).await;
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
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

/// Runs the real binary with `args` against `url`; returns its exit code and
/// all its output (stdout and stderr).
pub async fn run_binary(args: &[&str], url: &str) -> (Option<i32>, String) {
    let mut d = Daemon::spawn_args(args, &[("LOCKDB_URL", url)]);
    let (code, _) = d.wait_exit(Duration::from_secs(60)).await;
    (code, d.lines().join("\n"))
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

/// The path of a command a test needs, from PATH or /usr/sbin; a missing
/// one fails the test with the Debian package that brings it.
pub fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is missing: install it (Debian: apt-get install {package})")
        })
}
