//! The liveness heartbeat file: the container's counterpart of systemd's
//! watchdog.
//!
//! Owns writing, each time every service loop has finished a pass (the rule
//! in `progress`), the current time into the file named by
//! `LEASE_SWEEPER_HEARTBEAT_FILE`, and reading it back for `lease-sweeper
//! alive`, the exec liveness probe. Like the watchdog it measures loop
//! progress, not database health: during a database outage the passes fail
//! fast and still count, so Kubernetes never restarts the sidecar for what a
//! restart cannot fix, while a wedged loop of either service goes stale and
//! is restarted. It does not decide what a pass is (`sweep`).
//!
//! The file is replaced atomically (write beside it, then rename), so the
//! probe never reads half a line; under `--read-only` it needs a small
//! writable volume (an `emptyDir`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::progress::Watcher;

/// The environment variable naming the heartbeat file; unset, none is written.
pub const HEARTBEAT_FILE: &str = "LEASE_SWEEPER_HEARTBEAT_FILE";

/// How stale a heartbeat `alive` accepts by default: the unit's
/// `WatchdogSec`, so both supervisors judge a wedge alike. A pass that drains
/// a backlog (a million leases take seconds, never minutes) stays well inside.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(120);

/// The heartbeat file from the environment, if one is asked for.
pub fn path_from_env() -> Option<PathBuf> {
    std::env::var_os(HEARTBEAT_FILE)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// Writes the heartbeat each time every loop has moved, until `shutdown`.
pub fn follow(path: PathBuf, mut progress: Watcher, shutdown: CancellationToken) {
    info!(file = %path.display(), "heartbeat_enabled");
    tokio::spawn(async move {
        let mut failing = false;
        while progress.next(&shutdown).await {
            if !progress.all_moved() {
                continue;
            }
            match write(&path, now_millis()) {
                Ok(()) if failing => {
                    failing = false;
                    info!(file = %path.display(), "heartbeat_recovered");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    warn!(
                        file = %path.display(),
                        error = %e,
                        hint = "the liveness probe will fail; mount a writable volume there",
                        "heartbeat_failed"
                    );
                }
                Err(_) => {}
            }
        }
    });
}

/// Replaces the file's content with `millis` (Unix epoch milliseconds).
fn write(path: &Path, millis: u64) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{millis}")?;
    std::fs::rename(&tmp, path)
}

/// How long ago the heartbeat in `path` was written.
pub fn age(path: &Path) -> Result<Duration, AgeError> {
    let text = std::fs::read_to_string(path).map_err(|e| AgeError::Unreadable(e.to_string()))?;
    let millis: u64 = text
        .trim()
        .parse()
        .map_err(|_| AgeError::Garbled(text.trim().chars().take(40).collect()))?;
    Ok(Duration::from_millis(now_millis().saturating_sub(millis)))
}

/// Why no age could be read.
#[derive(Debug, thiserror::Error)]
pub enum AgeError {
    #[error("cannot read it ({0}); no loop has completed yet, or the daemon cannot write there")]
    Unreadable(String),
    #[error("it does not hold a timestamp ({0:?}); is another program writing it?")]
    Garbled(String),
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_heartbeat_reads_back_as_its_age() {
        let dir = std::env::temp_dir().join(format!("hb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("heartbeat");
        write(&path, now_millis() - 5_000).unwrap();
        let age = age(&path).unwrap();
        assert!(
            (5_000..6_000).contains(&(age.as_millis() as u64)),
            "{age:?}"
        );
        std::fs::write(&path, "soon").unwrap();
        assert!(matches!(super::age(&path), Err(AgeError::Garbled(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
