//! What each subcommand does, from configuration to result.
//!
//! Owns wiring: reading the environment, building the store, sweeper, metrics
//! and signal handling for `run`, and the one-shot commands. Errors leave as
//! `anyhow` with context for `main` to report once; a `ConfigError` anywhere
//! in the chain means exit 2.

use std::process::ExitCode;

use anyhow::Context as _;
use tracing::info;

use crate::cli::{Cli, Command};
use crate::config::{DbTarget, StatsdTarget};
use crate::events::EventLog;
use crate::jobs::JobReaper;
use crate::metrics::Metrics;
use crate::store::postgres::PgLockStore;
use crate::sweeper::Sweeper;

/// Runs one parsed command line to completion.
pub async fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run => run_daemon().await.map(|()| ExitCode::SUCCESS),
        Command::Migrate => migrate().await.map(|()| ExitCode::SUCCESS),
        Command::Demo => crate::demo::run().await.map(|()| ExitCode::SUCCESS),
        Command::Check => crate::check::run().await,
        Command::Jobs(cmd) => crate::jobs_cli::jobs(cmd).await,
        Command::Gates(args) => crate::jobs_cli::gates(args).await,
    }
}

/// The daemon and the demo log to stdout; one-shot commands keep stdout for
/// their result and log to stderr.
pub fn log_output(command: &Command) -> crate::telemetry::Output {
    match command {
        Command::Run | Command::Demo => crate::telemetry::Output::Stdout,
        _ => crate::telemetry::Output::Stderr,
    }
}

/// The daemon: sweep until SIGTERM/SIGINT.
pub async fn run_daemon() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let statsd = StatsdTarget::from_env()?;
    let shutdown =
        crate::shutdown::on_signals().context("installing the SIGTERM/SIGINT handlers")?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        database = db.display(),
        databaseFrom = %db.origin(),
        statsd = %statsd,
        "starting"
    );
    for note in db.notes() {
        tracing::warn!(note = %note, "database_config_warning");
    }
    let actor = format!("lease-sweeper@{}", hostname());
    // systemd: READY=1 and WATCHDOG=1 from the loop, STOPPING=1 on the signal.
    let notifier = crate::notify::Notifier::from_env();
    notifier.stop_on(shutdown.clone());
    let sweeper = Sweeper::new(
        PgLockStore::new(db.clone()),
        EventLog::stdout(),
        Metrics::new(statsd),
    )
    .with_jobs(JobReaper::new(db, actor))
    .on_sweep(notifier.sweep_hook());
    sweeper.run(shutdown).await;
    notifier.stopping();
    Ok(())
}

/// `migrate`: apply the bundled migrations once.
pub async fn migrate() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let mut conn = crate::db::connect(&db).await?;
    crate::db::migrate(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&e.to_string())))
        .with_context(|| format!("applying migrations to {}", db.display()))?;
    let applied = crate::db::MIGRATOR.iter().count();
    info!(database = db.display(), migrations = applied, "migrated");
    Ok(())
}

/// This host's name, for the job reaper's actor (`lease-sweeper@<host>`).
///
/// gethostname(2) rather than /proc: systemd's `ProcSubset=pid` hides
/// /proc/sys, and a container may not mount it at all.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    (rc == 0)
        .then(|| {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).trim().to_owned()
        })
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// Exit status for an error that reached `main`: 2 for configuration, else 1.
pub fn exit_code_for(err: &anyhow::Error) -> ExitCode {
    let config = err.chain().any(|cause| {
        cause.is::<crate::config::ConfigError>() || cause.is::<crate::telemetry::FilterError>()
    });
    if config {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
