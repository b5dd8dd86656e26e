//! Shared test plumbing: a real PostgreSQL, a database per test, a real UDP
//! StatsD listener and the real binary.
//!
//! When `DATABASE_URL` is set, every test creates its own database on that
//! server (and drops it afterwards), copied from a template migrated once and
//! kept there for the next run. Otherwise this test binary starts one
//! throwaway cluster (as the `postgres` user when run as root), shared by all
//! its tests and removed at exit.

//!
//! One module per thing supported: `cluster` (the database), `roles`,
//! `statsd`, `daemon` (the real binary), `queue` (the gates) and `bad_rows`
//! (what both bad-row suites plant); this file keeps what they all use: the
//! one poll-until loop, temp dirs and tools. Everything but `bad_rows` is
//! re-exported here, so tests name `crate::support::X`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod cluster;
mod daemon;
mod queue;
mod roles;
mod statsd;

pub mod bad_rows;

pub use cluster::*;
pub use daemon::*;
pub use queue::*;
pub use roles::*;
pub use statsd::*;

/// How often a wait looks again.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// The one poll-until loop: runs `probe` every `POLL_EVERY` until it returns
/// `Ok`, and returns that value; once `timeout` has passed, fails the test
/// with `what` and what the last `Err` said (the value seen, the daemon's
/// output: whatever explains the wait).
pub async fn poll<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(last) => assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}{}{last}",
                if last.is_empty() { "" } else { "; " }
            ),
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// `poll` for a condition with nothing more to say than yes or no.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll(timeout, what, || {
        let checked = check();
        async move {
            if checked.await {
                Ok(())
            } else {
                Err(String::new())
            }
        }
    })
    .await
}

/// A loopback TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binding an ephemeral port")
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts TCP connections on loopback `port`.
pub async fn wait_listening(port: u16, what: &str) {
    wait_until(
        Duration::from_secs(20),
        &format!("{what} listening on {port}"),
        || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        },
    )
    .await
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
