//! The subcommands, one module each, and what they share: dispatch, where
//! they log, this host's name, and the exit status.
//!
//! Errors leave as `anyhow` with context for `main` to report once; a
//! `ConfigError` (or a web configuration file `run` cannot use) anywhere in
//! the chain means exit 2.

mod alive;
pub(crate) mod check;
mod demo;
pub(crate) mod jobs;
mod migrate;
mod run;

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{Cli, Command};

/// Runs one parsed command line to completion.
pub async fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run => run::run().await.map(|()| ExitCode::SUCCESS),
        Command::Migrate => migrate::run().await.map(|()| ExitCode::SUCCESS),
        Command::Remove => migrate::remove().await.map(|()| ExitCode::SUCCESS),
        Command::Demo => demo::run().await.map(|()| ExitCode::SUCCESS),
        Command::Check => check::run().await,
        Command::Alive { max_age } => alive::run(Duration::from_secs(max_age)),
        Command::Jobs(cmd) => jobs::jobs(cmd).await,
        Command::Gates(args) => jobs::gates(args).await,
        Command::Leases(args) => jobs::leases(args).await,
    }
}

/// The subcommand's name, as typed: the `command` field of the `failed`
/// line, so a failure says which command failed.
pub fn name(command: &Command) -> &'static str {
    match command {
        Command::Run => "run",
        Command::Migrate => "migrate",
        Command::Remove => "remove",
        Command::Demo => "demo",
        Command::Check => "check",
        Command::Alive { .. } => "alive",
        Command::Jobs(_) => "jobs",
        Command::Gates(_) => "gates",
        Command::Leases(_) => "leases",
    }
}

/// The daemon and the demo log to stdout; one-shot commands keep stdout for
/// their result and log to stderr.
pub fn log_output(command: &Command) -> crate::output::telemetry::Output {
    match command {
        Command::Run | Command::Demo => crate::output::telemetry::Output::Stdout,
        _ => crate::output::telemetry::Output::Stderr,
    }
}

/// This host's name, for the job reaper's actor (`lease-sweeper@<host>`).
///
/// gethostname(2) rather than /proc: systemd's `ProcSubset=pid` hides
/// /proc/sys, and a container may not mount it at all.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// This sidecar's name among the others watching the same etcd: `$HOSTNAME`
/// when set (as containers and pods set it, and as several sidecars on one
/// host must set it apart), else the kernel's host name.
pub(crate) fn sidecar_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(hostname)
}

/// Exit status for an error that reached `main`: 2 for configuration, else 1.
pub fn exit_code_for(err: &anyhow::Error) -> ExitCode {
    let config = err.chain().any(|cause| {
        cause.is::<crate::config::ConfigError>()
            || cause.is::<crate::output::telemetry::FilterError>()
            || cause.is::<crate::output::web_config::WebConfigError>()
    });
    if config {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
