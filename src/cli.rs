//! The command line: subcommands, flags and their help text.
//!
//! Owns parsing only; `app` runs what was asked. Configuration comes from the
//! environment (see `config`), never from flags: there is deliberately no
//! flag for the sweep interval, the batch size or metric tags.

use clap::{Args, Parser, Subcommand};

const ENVIRONMENT: &str = "\
ENVIRONMENT:
  LOCKDB_URL     PostgreSQL URL of the lock database (postgres://USER:PASSWORD@HOST:PORT/DB)
  DATABASE_URL   used when LOCKDB_URL is unset
  PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE
                 libpq defaults, used when neither URL is set
  STATSD_HOST    StatsD agent host (default 127.0.0.1), resolved again after failures
  STATSD_PORT    StatsD agent UDP port (default 8125)
  RUST_LOG       extra diagnostic detail, e.g. lease_sweeper=debug (cannot silence lease_expired)

EXIT STATUS:
  0 success, 1 runtime failure (or a refused job apply), 2 usage or configuration error";

/// Sweeps expired lock leases and stale job leases out of PostgreSQL, turning
/// each lock-lease expiry into one WARN `lease_expired` line and one StatsD
/// count.
#[derive(Debug, Parser)]
#[command(name = "lease-sweeper", version, about, long_about = None, after_help = ENVIRONMENT)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: sweep every second until SIGTERM or SIGINT.
    ///
    /// Each sweep deletes every lock lease whose deadline has passed (by the
    /// database's clock) in batches, writes one logfmt WARN `lease_expired`
    /// line per lease to stdout before committing, adds to the StatsD counter
    /// `lock.lease.expired`, reports `lock.held.current`, and, when the three
    /// queue gates allow, reaps stale job leases. Database errors are logged
    /// at ERROR and the next sweep still runs. The first signal stops after
    /// the batch in flight and flushes StatsD; a second exits at once.
    #[command(after_help = ENVIRONMENT)]
    Run,

    /// Apply the bundled schema migrations (idempotent; safe from several hosts).
    #[command(after_help = ENVIRONMENT)]
    Migrate,

    /// Preflight: check connection, schema, functions, privileges and StatsD.
    ///
    /// Prints one line per check and exits 0 when all pass, 1 otherwise.
    /// Suitable for systemd's ExecStartPre. Never prints secrets.
    #[command(after_help = ENVIRONMENT)]
    Check,

    /// Inspect or reap stale job leases (prints the SQL functions' JSON).
    #[command(subcommand)]
    Jobs(JobsCommand),

    /// Show the queue gates, or change one (audited).
    Gates(GatesArgs),

    /// The embedded default: a self-contained demonstration on a throwaway
    /// local PostgreSQL. Needs no configuration; finishes in under a minute.
    ///
    /// Starts PostgreSQL (as the `postgres` user when run as root), migrates,
    /// acts as a lock server that acquires leases and abandons some, opens the
    /// queue gates and abandons leased jobs, runs the real daemon so its lines
    /// and StatsD datagrams show, stops it with SIGTERM and removes the cluster.
    Demo,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Show what the reaper would do now (read-only, always allowed).
    DryRun(LimitArg),
    /// Reap stale job leases now; refused unless the three gates allow it.
    Apply {
        /// Who is acting (recorded on dead letters and in the output).
        #[arg(long, value_name = "NAME")]
        actor: String,
        #[command(flatten)]
        limit: LimitArg,
    },
}

#[derive(Debug, Args)]
pub struct LimitArg {
    /// Most jobs to consider (1-10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub limit: i32,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct GatesArgs {
    #[command(subcommand)]
    pub command: Option<GatesCommand>,
}

#[derive(Debug, Subcommand)]
pub enum GatesCommand {
    /// Change one queue setting through the audited setter.
    Set {
        /// e.g. queue.lease.reaper_enabled
        key: String,
        /// e.g. true
        value: String,
        /// Who is changing it (recorded in the audit table).
        #[arg(long, value_name = "NAME")]
        actor: String,
    },
}
