//! `lease-sweeper alive`: the exec liveness probe for containers.
//!
//! Owns the verdict: exit 0 when the heartbeat file (`heartbeat`) was
//! written within `--max-age`, 1 when it is stale or missing, 2 when no
//! heartbeat file is configured. It reads one small file and connects to
//! nothing, so the probe stays cheap and never fails because the database is
//! down.

use std::process::ExitCode;
use std::time::Duration;

use crate::config::ConfigError;
use crate::heartbeat::{self, HEARTBEAT_FILE};

/// Exit status of a stale or missing heartbeat.
const EXIT_NOT_ALIVE: u8 = 1;

pub fn run(max_age: Duration) -> anyhow::Result<ExitCode> {
    let path = heartbeat::path_from_env().ok_or(ConfigError::Missing {
        var: HEARTBEAT_FILE,
        why: "`alive` reads the heartbeat file the daemon writes there; set the same path for both",
    })?;
    match heartbeat::age(&path) {
        Ok(age) if age <= max_age => {
            println!(
                "alive: every service loop finished a pass {} ms ago (max {} s)",
                age.as_millis(),
                max_age.as_secs()
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(age) => {
            println!(
                "not alive: no pass of every service loop for {} s (max {} s); a loop is wedged, restart the daemon",
                age.as_secs(),
                max_age.as_secs()
            );
            Ok(ExitCode::from(EXIT_NOT_ALIVE))
        }
        Err(e) => {
            println!("not alive: heartbeat file {}: {e}", path.display());
            Ok(ExitCode::from(EXIT_NOT_ALIVE))
        }
    }
}
