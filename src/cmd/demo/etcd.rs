//! The demo's etcd stage: a throwaway one-member etcd on loopback, the real
//! daemon following it (`run` with only `ETCDCTL_ENDPOINTS`), and three
//! holders made with etcd's own lock service: one dies (its lease runs
//! out), one unlocks, one revokes its lease while it holds the lock. The
//! daemon reports the first as `reapedBy=expiry` and the third as
//! `reapedBy=revoke`, and says nothing of the release. Skipped, with a
//! note, where etcd is not installed. Everything it starts is stopped and
//! removed before it returns.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use etcd_client::{Client, GetOptions, LockOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::info;

use super::note;

/// The holders' lease time, in seconds: short, so the demo is quick.
const TTL_SECS: i64 = 2;
/// The demo gives up waiting for the daemon after this long.
const DEADLINE: Duration = Duration::from_secs(30);

/// A throwaway etcd: its process and data directory, both gone on drop.
struct ThrowawayEtcd {
    child: std::process::Child,
    dir: PathBuf,
    endpoint: String,
}

impl Drop for ThrowawayEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A holder's lease, kept alive until `die`.
struct Holder {
    key: Vec<u8>,
    lease: i64,
    keep_alive: tokio::task::JoinHandle<()>,
}

/// The etcd stage, after the PostgreSQL one; `statsd_port` is the demo's
/// printing agent.
pub async fn run(statsd_port: u16) -> anyhow::Result<()> {
    let Some(etcd) = find("etcd") else {
        note(
            "etcd is not installed, so the etcd stage is skipped (Debian: apt install etcd-server); \
             with it, the demo also shows a lock held in etcd expiring",
        );
        return Ok(());
    };
    let server = start(&etcd).await?;
    let mut client = Client::connect([server.endpoint.as_str()], None)
        .await
        .context("connecting to the throwaway etcd")?;
    let mut daemon = start_daemon(&server.endpoint, statsd_port)?;
    // The daemon follows etcd from its first pass: give it that pass.
    wait_for(&mut client, "lease-sweeper/alive/", 1, "start").await?;

    let died = hold(&mut client, "locks/payments").await?;
    let released = hold(&mut client, "locks/reports").await?;
    let revoked = hold(&mut client, "locks/inventory").await?;
    died.keep_alive.abort();
    info!(
        lockKey = %String::from_utf8_lossy(&died.key),
        ttlSecs = TTL_SECS,
        "demo_etcd_holder_died"
    );
    client
        .unlock(released.key.clone())
        .await
        .context("unlocking")?;
    info!(lockKey = %String::from_utf8_lossy(&released.key), "demo_etcd_holder_unlocked");
    client
        .lease_revoke(revoked.lease)
        .await
        .context("revoking a holder's lease")?;
    info!(lockKey = %String::from_utf8_lossy(&revoked.key), "demo_etcd_holder_revoked_its_lease");
    note(
        "etcd deletes the dead holder's key when its lease runs out and says nothing; the \
         daemon reports it (reapedBy=expiry), and the revoke (reapedBy=revoke); the unlock is \
         a normal release and is not reported",
    );
    wait_for(&mut client, "lease-sweeper/claims/", 2, "report both").await?;
    // One more pass, so a quiet one shows too.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    released.keep_alive.abort();
    revoked.keep_alive.abort();

    info!(pid = daemon.id(), "demo_sending_sigterm");
    kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).context("sending SIGTERM")?;
    let status = wait_exit(&mut daemon).await?;
    drop(server);
    info!(
        daemonExit = status.code().unwrap_or(-1),
        "demo_etcd_finished"
    );
    if !status.success() {
        bail!("the etcd daemon exited with {status}");
    }
    Ok(())
}

/// `name` on `PATH`, or in /usr/bin where Debian installs etcd.
fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A free loopback port, asked of the kernel.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start(etcd: &std::path::Path) -> anyhow::Result<ThrowawayEtcd> {
    let dir = std::env::temp_dir().join(format!("lease-sweeper-demo-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).context("creating the etcd data directory")?;
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let endpoint = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    info!("demo_starting_etcd");
    let child = std::process::Command::new(etcd)
        .arg("--name=demo")
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--listen-client-urls={endpoint}"))
        .arg(format!("--advertise-client-urls={endpoint}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=demo={peer}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", etcd.display()))?;
    let server = ThrowawayEtcd {
        child,
        dir,
        endpoint,
    };
    let started = Instant::now();
    loop {
        if let Ok(mut c) = Client::connect([server.endpoint.as_str()], None).await
            && c.status().await.is_ok()
        {
            break;
        }
        if started.elapsed() > DEADLINE {
            bail!("the throwaway etcd did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    info!(endpoint = %server.endpoint, note = "a one-member etcd on loopback; removed at the end", "demo_etcd_ready");
    Ok(server)
}

fn start_daemon(endpoint: &str, statsd_port: u16) -> anyhow::Result<std::process::Child> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("run")
        .env("ETCDCTL_ENDPOINTS", endpoint)
        .env("HOSTNAME", "demo-sidecar")
        .env("STATSD_HOST", "127.0.0.1")
        .env("STATSD_PORT", statsd_port.to_string());
    // Only etcd: no database named, so no job reaper beside it.
    for var in crate::config::PG_TARGET_VARS {
        command.env_remove(var);
    }
    for var in [
        "ETCDCTL_CACERT",
        "ETCDCTL_CERT",
        "ETCDCTL_KEY",
        "ETCDCTL_USER",
        "ETCDCTL_PASSWORD",
        crate::output::scrape::ADDR_VAR,
    ] {
        command.env_remove(var);
    }
    let child = command.spawn().context("starting `lease-sweeper run`")?;
    info!(
        pid = child.id(),
        locks = endpoint,
        "demo_etcd_daemon_started"
    );
    Ok(child)
}

/// A holder as etcd's lock service makes one: a lease kept alive, and the
/// `Lock` call with it.
async fn hold(client: &mut Client, name: &str) -> anyhow::Result<Holder> {
    let lease = client.lease_grant(TTL_SECS, None).await?.id();
    let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
    let keep_alive = tokio::spawn(async move {
        loop {
            if keeper.keep_alive().await.is_err() || answers.message().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let locked = client
        .lock(name, Some(LockOptions::new().with_lease(lease)))
        .await
        .with_context(|| format!("locking {name}"))?;
    let key = locked.key().to_vec();
    info!(lockKey = %String::from_utf8_lossy(&key), lease = %format!("{lease:x}"), "demo_etcd_lock_held");
    Ok(Holder {
        key,
        lease,
        keep_alive,
    })
}

/// Waits until at least `n` keys start with `prefix`.
async fn wait_for(client: &mut Client, prefix: &str, n: usize, what: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let got = client
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?;
        if got.count() as usize >= n {
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            bail!("the etcd daemon did not {what} within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_exit(daemon: &mut std::process::Child) -> anyhow::Result<std::process::ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = daemon.try_wait()? {
            return Ok(status);
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = daemon.kill();
            bail!("the etcd daemon did not stop within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
