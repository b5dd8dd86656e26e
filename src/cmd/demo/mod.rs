//! `lease-sweeper demo`: the real daemon (this binary's `run`) sweeping a
//! throwaway PostgreSQL, with no configuration, then (`etcd`) following a
//! throwaway etcd where one is installed. Owns the script only, in
//! `run`'s stages: stand-ins for the lock server, a job worker, the operator
//! opening the gates and a StatsD agent that prints each datagram, then
//! SIGTERM. Everything it starts is stopped and removed before it returns.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::{Connection as _, PgConnection};
use tokio::net::UdpSocket;
use tracing::info;

use crate::model::{ACTION_RESET, DryRunReport, WOULD_DEAD_LETTER};
use crate::throwaway::ThrowawayPg;

mod etcd;

// The demo's statements: the lock server's and the worker's calls of the
// shipped functions, and the counts the demo waits on.
const ACQUIRE: &str = "SELECT lock_acquire($1, $2, $3)";
const RENEW: &str = "SELECT lock_renew($1, $2, $3)";
const RELEASE: &str = "SELECT lock_release($1, $2)";
const ENQUEUE: &str = "SELECT fn_job_enqueue($1, '{}'::jsonb, $2)::text";
const CLAIM: &str = "SELECT job_id::text FROM fn_job_claim($1, NULL, $2)";
/// Leases other than the kept one, and takeovers not yet drained.
const UNSWEPT: &str = "SELECT (SELECT count(*) FROM lock_entry WHERE lock_key <> $1) AS leases, \
                              (SELECT count(*) FROM lock_expiry_outbox) AS takeovers";
const LEASED_JOBS: &str = "SELECT count(*) FROM job_queue WHERE state = 'leased'";
const JOB_AFTER_REAP: &str = "SELECT job_kind, state, attempts,
        greatest(0, round(extract(epoch FROM scheduled_at - now())))::bigint AS retry_in_sec
   FROM job_queue WHERE job_id = $1::uuid";
const HELD: &str = "SELECT count(*) FROM lock_entry";
const REAPED_JOBS: &str = "SELECT (SELECT count(*) FROM job_queue WHERE state = 'retry_waiting') AS reset, \
                                  (SELECT count(*) FROM job_dead_letter) AS dead_lettered";

/// `UNSWEPT`'s row.
#[derive(sqlx::FromRow)]
struct Unswept {
    leases: i64,
    takeovers: i64,
}

/// `JOB_AFTER_REAP`'s row.
#[derive(sqlx::FromRow)]
struct JobAfterReap {
    job_kind: String,
    state: String,
    attempts: i32,
    retry_in_sec: i64,
}

/// `REAPED_JOBS`'s row.
#[derive(sqlx::FromRow)]
struct ReapedJobs {
    reset: i64,
    dead_lettered: i64,
}

/// The key held by a healthy lock server all through the demo.
const KEPT_KEY: &str = "report:daily";

/// Lease time of the demo's abandoned leases: short, so the demo is quick.
const DEMO_TTL_MILLIS: i64 = 1_500;
/// How often the demo looks at the tables while it waits for the daemon.
const POLL: Duration = Duration::from_millis(250);
/// The demo gives up waiting for the sweeper after this long.
const DEMO_DEADLINE: Duration = Duration::from_secs(30);
/// Lease of the demo's claimed jobs, in seconds (the setter's minimum), so
/// they go stale while the lock leases are being swept.
const DEMO_JOB_LEASE_SEC: &str = "1";
/// Who the demo's operator is in the gate audit trail.
const DEMO_OPERATOR: &str = "demo-operator";

/// The lock server's abandoned keys; the third holds a quote, `=` and a
/// newline on purpose, to show the escaping.
const ABANDONED: [&str; 3] = [
    "payout:acct-1",
    "payout:acct-2",
    "tenant \"acme\" key=1\nforged level=error",
];

/// The two jobs the dead worker held: one with attempts left, one on its
/// last.
struct Planted {
    retried: String,
    buried: String,
}

/// The daemon the demo started, and where its scrape endpoint listens.
struct Daemon {
    child: tokio::process::Child,
    pid: i32,
    scrape_addr: std::net::SocketAddr,
}

/// The demonstration, stage by stage; everything it starts is stopped and
/// removed on the way out.
pub async fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let (pg, mut conn) = start_postgres().await?;
    let (statsd_port, printer) = start_statsd().await?;
    let kept = plant_leases(&mut conn).await?;
    let jobs = plant_jobs(&mut conn).await?;
    let mut daemon = start_daemon(&pg.url("postgres"), statsd_port).await?;
    let deadline = Instant::now() + DEMO_DEADLINE;
    wait_for_sweep(&mut conn, kept, deadline).await?;
    open_reaper_and_wait(&mut conn, kept, deadline).await?;
    show_jobs(&mut conn, &jobs).await?;
    // One more sweep so the gauge and a quiet sweep (no WARN) show.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    show_scrape(daemon.scrape_addr).await?;
    let status = stop_daemon(&mut daemon).await?;
    let etcd_stage = etcd::run(statsd_port).await;
    // The last datagrams are printed before the agent goes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    printer.abort();
    tear_down(conn, pg, status, started).await?;
    etcd_stage
}

/// A throwaway PostgreSQL, connected to and migrated.
async fn start_postgres() -> anyhow::Result<(ThrowawayPg, PgConnection)> {
    info!("demo_starting_postgres");
    let pg = tokio::task::spawn_blocking(ThrowawayPg::start)
        .await?
        .context("starting a throwaway PostgreSQL")?;
    info!(
        socketDir = %pg.socket_dir().display(),
        note = "a local PostgreSQL on a Unix socket in this directory (no TCP port); removed at the end",
        "demo_postgres_ready"
    );
    let mut conn = PgConnection::connect(&pg.url("postgres"))
        .await
        .context("connecting to the throwaway PostgreSQL")?;
    let installed = crate::pg::migrate::migrate(&mut conn)
        .await
        .context("migrating the throwaway database")?;
    info!(
        migrations = installed.migrations_applied,
        functions = installed.functions_applied,
        "demo_migrated"
    );
    Ok((pg, conn))
}

/// A stand-in StatsD agent that prints every datagram the daemon sends: its
/// port, and the task to abort at the end.
async fn start_statsd() -> anyhow::Result<(u16, tokio::task::JoinHandle<u64>)> {
    let statsd = UdpSocket::bind("127.0.0.1:0")
        .await
        .context("binding the demo StatsD socket")?;
    let port = statsd.local_addr()?.port();
    let printer = tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let mut datagrams = 0u64;
        while let Ok(n) = statsd.recv(&mut buf).await {
            datagrams += 1;
            info!(payload = %String::from_utf8_lossy(&buf[..n]), "demo_statsd_datagram");
        }
        datagrams
    });
    Ok((port, printer))
}

/// The lock server: two holders die, one keeps renewing, one key's lease
/// expires and is taken over before any sweeper runs, and one key carries
/// hostile characters. Returns the kept lease's token.
async fn plant_leases(conn: &mut PgConnection) -> anyhow::Result<i64> {
    note(
        "the third abandoned key holds a quote, '=' and a newline on purpose: its lease_expired \
         line shows them escaped, so no key can forge a log line",
    );
    for (i, key) in ABANDONED.iter().enumerate() {
        let token = acquire(conn, key, &format!("worker-{i}"), DEMO_TTL_MILLIS).await?;
        info!(
            lockKey = key,
            token,
            ttlMillis = DEMO_TTL_MILLIS,
            "demo_lease_acquired_then_abandoned"
        );
    }
    let kept = acquire(conn, KEPT_KEY, "worker-alive", DEMO_TTL_MILLIS).await?;
    info!(
        lockKey = KEPT_KEY,
        token = kept,
        "demo_lease_acquired_and_kept_alive"
    );
    let stolen = acquire(conn, "invoice:42", "worker-paused", 100).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let thief = acquire(conn, "invoice:42", "worker-new", 60_000).await?;
    info!(
        lockKey = "invoice:42",
        oldToken = stolen,
        newToken = thief,
        "demo_expired_lease_taken_over"
    );
    release(conn, "invoice:42", thief).await?;
    note(
        "the new holder of invoice:42 released it at once: the old holder's expiry is still \
         reported (reapedBy=takeover), and lock.held.current soon counts only report:daily",
    );
    Ok(kept)
}

/// The job queue: the operator opens the substrate and enables the reaper
/// but leaves it dry-run-only (staged); a worker claims two jobs on a short
/// lease and dies.
async fn plant_jobs(conn: &mut PgConnection) -> anyhow::Result<Planted> {
    set_gate(conn, "queue.job_substrate.enabled", "true").await?;
    set_gate(conn, "queue.lease.reaper_enabled", "true").await?;
    set_gate(conn, "queue.lease.duration_sec", DEMO_JOB_LEASE_SEC).await?;
    let retried = enqueue(conn, "email.send", 5).await?;
    let buried = enqueue(conn, "invoice.render", 1).await?;
    let claimed: Vec<String> = sqlx::query_scalar(CLAIM)
        .bind("worker-7")
        .bind(2)
        .fetch_all(&mut *conn)
        .await?;
    info!(
        jobs = claimed.len(),
        leaseOwner = "worker-7",
        leaseSec = DEMO_JOB_LEASE_SEC,
        "demo_jobs_claimed_then_abandoned"
    );
    note(
        "the job reaper is staged (enabled, but dry-run-only): the daemon will say job_reaper_gated \
         reason=queue.lease.reaper_dry_run_only=true; that is the safe default, not a failure",
    );
    Ok(Planted { retried, buried })
}

/// The daemon itself, exactly as an operator runs it, with its scrape
/// endpoint on a free loopback port.
async fn start_daemon(url: &str, statsd_port: u16) -> anyhow::Result<Daemon> {
    // Asked of the kernel, then handed to the daemon, which binds it at start.
    let scrape_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free loopback port for the scrape endpoint")?;
    let exe = std::env::current_exe().context("locating this binary")?;
    let child = tokio::process::Command::new(exe)
        .arg("run")
        .env("LOCKDB_URL", url)
        .env("STATSD_HOST", "127.0.0.1")
        .env("STATSD_PORT", statsd_port.to_string())
        .env(crate::output::scrape::ADDR_VAR, scrape_addr.to_string())
        .env_remove("DATABASE_URL")
        .kill_on_drop(true)
        .spawn()
        .context("starting `lease-sweeper run`")?;
    let pid = child.id().context("daemon pid")? as i32;
    info!(pid, "demo_daemon_started");
    note(&format!(
        "while the demo runs, the daemon's Prometheus endpoint answers: curl http://{scrape_addr}{}",
        crate::output::scrape::PATH
    ));
    Ok(Daemon {
        child,
        pid,
        scrape_addr,
    })
}

/// Keeps one lease alive while the daemon sweeps the abandoned ones.
async fn wait_for_sweep(
    conn: &mut PgConnection,
    kept: i64,
    deadline: Instant,
) -> anyhow::Result<()> {
    while !swept(conn, kept).await? {
        give_up_after(deadline, "sweep the abandoned leases")?;
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// The dry run shows what the reaper would do (the daemon has said
/// job_reaper_gated, dry-run-only); the operator flips the last gate and
/// the next pass reaps: one retry with backoff, one dead letter. The lock
/// server keeps renewing its live lease all the while.
async fn open_reaper_and_wait(
    conn: &mut PgConnection,
    kept: i64,
    deadline: Instant,
) -> anyhow::Result<()> {
    renew(conn, KEPT_KEY, kept, DEMO_TTL_MILLIS).await?;
    let preview = crate::pg::job_queue::dry_run(conn, 10).await?;
    show_dry_run(&preview)?;
    set_gate(conn, "queue.lease.reaper_dry_run_only", "false").await?;
    while !reaped(conn, kept).await? {
        give_up_after(deadline, "reap the abandoned jobs")?;
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Where each planted job ended up.
async fn show_jobs(conn: &mut PgConnection, jobs: &Planted) -> anyhow::Result<()> {
    for job in [&jobs.retried, &jobs.buried] {
        let after: JobAfterReap = sqlx::query_as(JOB_AFTER_REAP)
            .bind(job)
            .fetch_one(&mut *conn)
            .await?;
        info!(
            jobId = %job,
            jobKind = %after.job_kind,
            state = %after.state,
            attempts = after.attempts,
            retryInSec = after.retry_in_sec,
            "demo_job_after_reap"
        );
    }
    Ok(())
}

/// SIGTERM, and the daemon's exit within 10 s.
async fn stop_daemon(daemon: &mut Daemon) -> anyhow::Result<std::process::ExitStatus> {
    info!(pid = daemon.pid, "demo_sending_sigterm");
    // std and tokio only send SIGKILL; the daemon's drain is what is shown.
    kill(Pid::from_raw(daemon.pid), Signal::SIGTERM).context("sending SIGTERM to the daemon")?;
    let status = tokio::time::timeout(Duration::from_secs(10), daemon.child.wait())
        .await
        .context("the daemon did not stop within 10 s of SIGTERM")??;
    Ok(status)
}

/// What is left, the summary line, and the PostgreSQL removed; fails unless
/// the daemon exited cleanly and reaped one job each way.
async fn tear_down(
    mut conn: PgConnection,
    pg: ThrowawayPg,
    status: std::process::ExitStatus,
    started: Instant,
) -> anyhow::Result<()> {
    let still_held: i64 = sqlx::query_scalar(HELD).fetch_one(&mut conn).await?;
    let jobs: ReapedJobs = sqlx::query_as(REAPED_JOBS).fetch_one(&mut conn).await?;
    conn.close().await.ok();
    drop(pg);
    info!(
        daemonExit = status.code().unwrap_or(-1),
        leasesAbandoned = ABANDONED.len(),
        leasesTakenOver = 1,
        leasesStillHeld = still_held,
        jobsReset = jobs.reset,
        jobsDeadLettered = jobs.dead_lettered,
        elapsedMillis = started.elapsed().as_millis() as u64,
        "demo_finished"
    );
    if !status.success() {
        bail!("the daemon exited with {status}");
    }
    if (jobs.reset, jobs.dead_lettered) != (1, 1) {
        bail!(
            "expected one job reset and one dead-lettered, got {} and {}",
            jobs.reset,
            jobs.dead_lettered
        );
    }
    Ok(())
}

/// Changes a queue setting the way an operator does: through the audited setter.
async fn set_gate(conn: &mut PgConnection, key: &str, value: &str) -> anyhow::Result<()> {
    crate::pg::job_queue::set_gate(conn, key, value, DEMO_OPERATOR)
        .await
        .with_context(|| format!("setting {key}={value}"))?;
    info!(key, value, actor = DEMO_OPERATOR, "demo_gate_set");
    Ok(())
}

async fn enqueue(conn: &mut PgConnection, kind: &str, max_attempts: i32) -> anyhow::Result<String> {
    let id: String = sqlx::query_scalar(ENQUEUE)
        .bind(kind)
        .bind(max_attempts)
        .fetch_one(&mut *conn)
        .await?;
    info!(jobId = %id, jobKind = kind, maxAttempts = max_attempts, "demo_job_enqueued");
    Ok(id)
}

async fn acquire(conn: &mut PgConnection, key: &str, owner: &str, ttl: i64) -> anyhow::Result<i64> {
    let token: Option<i64> = sqlx::query_scalar(ACQUIRE)
        .bind(key)
        .bind(owner)
        .bind(ttl)
        .fetch_one(&mut *conn)
        .await?;
    token.with_context(|| format!("lock {key:?} was unexpectedly held"))
}

async fn renew(conn: &mut PgConnection, key: &str, token: i64, ttl: i64) -> anyhow::Result<()> {
    let ok: bool = sqlx::query_scalar(RENEW)
        .bind(key)
        .bind(token)
        .bind(ttl)
        .fetch_one(&mut *conn)
        .await?;
    if !ok {
        bail!("renewing {key:?} failed");
    }
    Ok(())
}

async fn release(conn: &mut PgConnection, key: &str, token: i64) -> anyhow::Result<()> {
    let _: bool = sqlx::query_scalar(RELEASE)
        .bind(key)
        .bind(token)
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}

/// Renews the kept lease (the lock server stays healthy), then says whether
/// every abandoned lease and takeover has been swept.
async fn swept(conn: &mut PgConnection, kept: i64) -> anyhow::Result<bool> {
    renew(conn, KEPT_KEY, kept, DEMO_TTL_MILLIS).await?;
    let left: Unswept = sqlx::query_as(UNSWEPT)
        .bind(KEPT_KEY)
        .fetch_one(conn)
        .await?;
    Ok(left.leases == 0 && left.takeovers == 0)
}

/// Renews the kept lease, then says whether no job is leased any more.
async fn reaped(conn: &mut PgConnection, kept: i64) -> anyhow::Result<bool> {
    renew(conn, KEPT_KEY, kept, DEMO_TTL_MILLIS).await?;
    let leased: i64 = sqlx::query_scalar(LEASED_JOBS).fetch_one(conn).await?;
    Ok(leased == 0)
}

fn give_up_after(deadline: Instant, what: &str) -> anyhow::Result<()> {
    if Instant::now() > deadline {
        bail!(
            "the daemon did not {what} within {} s",
            DEMO_DEADLINE.as_secs()
        );
    }
    Ok(())
}

/// One line that says why the next thing is deliberate.
fn note(text: &str) {
    info!(note = text, "demo_note");
}

/// What a scrape of the daemon shows now: the signal series, one line each.
async fn show_scrape(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // HTTP/1.0 with no keep-alive: the response ends where the stream does.
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the daemon's endpoint at {addr}"))?;
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {addr}\r\n\r\n",
        crate::output::scrape::PATH
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    for series in response
        .lines()
        .filter(|l| l.starts_with("lock_") || l.starts_with("queue_"))
    {
        info!(series, "demo_scraped");
    }
    Ok(())
}

/// The dry run, as a person reads it: a summary line, then one line per job.
fn show_dry_run(json: &str) -> anyhow::Result<()> {
    let report: DryRunReport = serde_json::from_str(json).context("reading the dry run")?;
    let would = |action: &str| {
        report
            .jobs
            .iter()
            .filter(|j| j.would_action == action)
            .count()
    };
    info!(
        staleLeases = report.stale_lease_count,
        wouldReset = would(ACTION_RESET),
        wouldDeadLetter = would(WOULD_DEAD_LETTER),
        note = "read-only: `lease-sweeper jobs dry-run` shows the same as a table",
        "demo_job_dry_run"
    );
    for job in &report.jobs {
        info!(
            jobId = job.job_id.as_str(),
            jobKind = job.job_kind.as_str(),
            attempts = job.attempts,
            maxAttempts = job.max_attempts,
            wouldAction = job.would_action.as_str(),
            "demo_job_would"
        );
    }
    Ok(())
}
