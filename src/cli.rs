//! The command line: subcommands, flags and their help text.
//!
//! Owns parsing only; `cmd` runs what was asked. Configuration comes from the
//! environment (see `config`), never from flags: there is deliberately no
//! flag for the sweep interval, the batch size or metric tags.
//!
//! The help pages are man-style (DESCRIPTION, OUTPUT, EXAMPLES, ENVIRONMENT,
//! EXIT STATUS, SEE ALSO) because operators read them on hosts without the
//! docs; the long forms live in docs/operations.md and docs/metrics-and-logs.md.
//! The manual pages in man/ are generated from these definitions (the test
//! `man::the_committed_man_pages_match_the_command_line` keeps them equal).

use clap::{Args, Parser, Subcommand};

/// The environment every database command reads (a macro so the pages below
/// can `concat!` it).
macro_rules! environment {
    () => {
        "\
ENVIRONMENT:
  LOCKDB_URL     PostgreSQL URL of the lock database (postgres://USER:PASSWORD@HOST:PORT/DB)
  DATABASE_URL   used when LOCKDB_URL is unset
  PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE
                 libpq defaults, used when neither URL is set
  STATSD_HOST    StatsD agent host (default 127.0.0.1), resolved again after failures
  STATSD_PORT    StatsD agent UDP port (default 8125)
  RUST_LOG       extra diagnostic detail, e.g. lease_sweeper=debug (cannot silence lease_expired)
  Passwords are never printed: databases are named postgres://USER@HOST:PORT/DB.
"
    };
}

const ENVIRONMENT: &str = concat!(
    environment!(),
    "
EXIT STATUS:
  0 success, 1 runtime failure (or a refused job apply), 2 usage or configuration error

SEE ALSO:
  docs/operations.md, docs/metrics-and-logs.md, docs/container.md, systemd/lease-sweeper.service
  (the docs/ pages are also installed by the Debian package, in /usr/share/doc/lease-sweeper/)"
);

const RUN_HELP: &str = concat!(
    "\
OUTPUT:
  logfmt on stdout, one event per line: ts=<RFC 3339 UTC> level=<level> message=<event> ...
  Exactly one line per expired lock lease, written before its deletion commits (a
  log-based metric filter is `level=warn message=lease_expired`):
    ts=... level=warn message=lease_expired lockKey=K token=N expiredAtMillis=MS
        overdueMillis=MS backend=pg reapedBy=sweep|takeover ownerId=O
  One line per stale job lease acted on: level=warn message=job_lease_expired jobId=...
  One line per holder of the xmin horizon keeping dead rows of lock_entry/job_queue,
  every 60 s while it holds (level=warn message=xmin_horizon_held holder=... pid=...
  applicationName=... slotName=... gid=...), and xmin_horizon_released when it ends.
  Diagnostics (docs/metrics-and-logs.md), from two independent loops, each on its own
  connection: the lock sweeper (sweep_*) and the job reaper (job_reap_*):
    starting, systemd_notify_enabled, sweeper_started, job_reaper_started
    sweep_failed / sweep_recovered, job_reap_failed / job_reap_recovered (database
      trouble: logged when it starts or changes, then once a minute, then on recovery)
    job_reaper_gated / job_reaper_armed (the gates' answer, once per change)
    statsd_unavailable / statsd_recovered, systemd_notify_failed
    shutdown_requested, shutdown_forced (a second signal)
    sweep_abandoned_at_shutdown, job_reap_abandoned_at_shutdown (a batch still running
      2 s after the signal rolls back)
    sweeper_stopped, job_reaper_stopped
  A third loop, the horizon check (horizon_check_*, every 10 s, its own connection,
  never part of a sweep): horizon_check_started, horizon_check_failed /
  horizon_check_recovered, xmin_horizon_partial_view (no pg_read_all_stats, once),
  horizon_check_abandoned_at_shutdown, horizon_check_stopped

METRICS (StatsD over UDP, DogStatsD tags, no prefix, flushed per batch and per sweep):
  lock.lease.expired:N|c|#backend:pg            lock.held.current:N|g|#backend:pg
  queue.lease.reaped:N|c|#backend:pg,action:A   queue.lease.stale.current:N|g|#backend:pg
  pg.xmin_horizon.age_seconds:S|g               pg.dead_rows.current:N|g|#table:lock_entry

SIGNALS:
  SIGTERM, SIGINT   no new sweep; the batch in flight commits (or after 2 s rolls back);
                    StatsD is flushed; exit 0
  a second signal   exit at once with 128+signal

SYSTEMD:
  With NOTIFY_SOCKET set (Type=notify): READY=1 after the first lock sweep, WATCHDOG=1
  each time both loops have finished a pass (failed or not), so a wedged loop of either
  service stops the pings; STOPPING=1 on the first signal.

EXAMPLES:
  LOCKDB_URL=postgres://sweeper:secret@db.internal:5432/locks lease-sweeper run
  LOCKDB_URL='postgres://sweeper@localhost/locks?host=/run/postgresql' STATSD_HOST=statsd.internal lease-sweeper run

",
    environment!(),
    "  NOTIFY_SOCKET, WATCHDOG_USEC
                 set by systemd for Type=notify and WatchdogSec

EXIT STATUS:
  0 stopped by a signal after a clean drain; 1 could not start (signal handlers);
  2 configuration error (a restart cannot fix it); 128+N forced by a second signal N.
  A database that is down or not migrated is not an exit: the daemon logs it and retries
  every second.

SEE ALSO:
  lease-sweeper check, docs/operations.md, docs/metrics-and-logs.md,
  systemd/lease-sweeper.service, docs/container.md"
);

const MIGRATE_HELP: &str = concat!(
    "\
DESCRIPTION:
  Applies the migrations built into this binary: the lock and job-queue tables, indexes
  and SQL functions, and the NOLOGIN role lease_sweeper holding exactly what `run` and
  `check` need. Applied migrations are skipped; sqlx takes an advisory lock, so several
  hosts may run it at once. Use a role that may create objects (and, the first time per
  cluster, roles). During an upgrade, migrate before starting the new binaries.

OUTPUT:
  One `migrated` line on stderr.

EXAMPLES:
  LOCKDB_URL=postgres://locks_owner@db.internal:5432/locks lease-sweeper migrate

",
    environment!(),
    "
EXIT STATUS:
  0 applied (or nothing to do), 1 the database refused or could not be reached,
  2 configuration error

SEE ALSO:
  lease-sweeper check, docs/operations.md (Upgrade)"
);

const CHECK_HELP: &str = concat!(
    "\
DESCRIPTION:
  With the same environment as `run`, checks and prints one line per item:
    connect      the database answers, each host within its connect_timeout (5 s unless
                 set); where the target came from, the role and server version
    migrations   every migration of this binary is applied, none failed or changed
                 (newer ones are a warning, fine while an upgrade rolls out)
    table, index, function
                 every object the daemon uses is visible to this role; indexes are valid
    grant        this role may do what `run` does: EXECUTE on the sweep's definer functions
                 (lock_reap_expired, lock_reap_expired_walk, lock_drain_takeovers,
                 lock_sweep_probe, lock_held_count_get) and the job reaper's, SELECT on
                 queue_setting and on the reaper's columns of job_queue; no privilege on
                 lock_entry itself, no DELETE anywhere
    definer functions' owner, overloads of built-ins
                 a superuser owning the definer functions is a warning; a built-in's
                 overload planted on the search path by another role is a FAIL
    horizon check's view of sessions
                 whether the role reads all statistics (pg_read_all_stats); without it a
                 warning: the horizon check names holders with less about other roles'
                 sessions
    statsd       STATSD_HOST resolves (UDP delivery itself cannot be confirmed)
  Each line is ok, warn (works, but worth acting on: a superuser role, a superuser owning
  the definer functions, no target set at all, a newer schema, no pg_read_all_stats) or
  FAIL; every FAIL line says what to do. Nothing is changed; the password is never printed.

OUTPUT (stdout):
  ok    migrations: all 11 applied (latest 20261201000400)
  FAIL  grant EXECUTE on function lock_reap_expired: this role lacks EXECUTE, needed because
        ...; GRANT EXECUTE ON FUNCTION lock_reap_expired TO <this role>
  check FAILED: 1 of 45 checks failed (see the FAIL lines above); the migrated role
        lease_sweeper holds every privilege listed: GRANT lease_sweeper TO <this role>
  A database that passes ends with: check passed: all 45 checks ok

SYSTEMD:
  The shipped unit runs `ExecStartPre=-lease-sweeper check`: the list lands in the journal
  before every start, and a failure does not block it (the daemon itself waits out a
  database that is down; a blocking preflight would turn a brief outage into a failed unit).

EXAMPLES:
  LOCKDB_URL=postgres://sweeper_host_a:secret@db.internal:5432/locks lease-sweeper check

",
    environment!(),
    "
EXIT STATUS:
  0 no FAIL line (warn lines allowed), 1 at least one FAIL line, 2 configuration error

SEE ALSO:
  lease-sweeper migrate, docs/operations.md (Install, Troubleshooting)"
);

const JOBS_HELP: &str = concat!(
    "\
DESCRIPTION:
  The job queue's stale-lease reaper, by hand. `dry-run` is read-only and always allowed;
  `apply` acts only while the three gates allow it (see `lease-sweeper gates`). The daemon
  runs the same apply on every sweep; these commands are for operators.

OUTPUT:
  A table on stdout: one row per job with what the reaper would do (dry-run) or did
  (apply), then a summary line. dry-run's LEASE column is the lease duration the job's
  latest claim or heartbeat gave it and where that came from (`30s kind`: its kind's
  duration; `override`: its metadata.lease_override_sec; `default`:
  queue.lease.duration_sec; `-`: not leased through fn_job_claim or fn_job_heartbeat).
  A refused apply prints `refused: <reason>` (e.g. refused:
  queue.lease.reaper_dry_run_only=true) and exits 1.
  --json prints the SQL function's JSON unchanged instead (for scripts and jq), the
  refusal included. Diagnostics go to stderr. No colour, terminal or not.

EXAMPLES:
  lease-sweeper jobs dry-run --limit 20
  lease-sweeper jobs dry-run --json | jq .stale_lease_count
  lease-sweeper jobs apply --actor alice@ops --limit 100

",
    environment!(),
    "
EXIT STATUS:
  0 success, 1 failure or a refused apply (stdout says why), 2 usage or configuration error

SEE ALSO:
  lease-sweeper gates, lease-sweeper leases, docs/jobs-operator-guide.md, docs/sql-api.md"
);

const GATES_HELP: &str = concat!(
    "\
DESCRIPTION:
  Without a subcommand: prints every queue setting (its value, who changed it and when)
  and what an apply would do now, as a table (--json: the JSON). `gates set` changes
  one setting through the audited setter (who, when, the old and new value are
  recorded) and prints the change as a table (SETTING OLD NEW BY); an unknown key or
  an invalid value prints `refused: <reason>`, exits 1 and changes nothing (--json:
  the JSON of either).
  The reaper applies only when queue.job_substrate.enabled=true,
  queue.lease.reaper_enabled=true and queue.lease.reaper_dry_run_only=false.

SETTINGS (defaults):
  queue.job_substrate.enabled=false      queue.lease.reaper_enabled=false
  queue.lease.reaper_dry_run_only=true   queue.retry.backoff_base_sec=10
  queue.lease.duration_sec=300

EXAMPLES:
  lease-sweeper gates
  lease-sweeper gates --json
  lease-sweeper gates set queue.lease.reaper_enabled true --actor alice@ops

",
    environment!(),
    "
EXIT STATUS:
  0 success, 1 a rejected setting or failure, 2 usage or configuration error

SEE ALSO:
  lease-sweeper jobs, lease-sweeper leases, docs/jobs-operator-guide.md"
);

const LEASES_HELP: &str = concat!(
    "\
DESCRIPTION:
  How long a claim or a heartbeat leases each job, in this order: the job's
  metadata.lease_override_sec, else its kind's duration (set here), else
  queue.lease.duration_sec (see `lease-sweeper gates`). Without a subcommand: prints
  every kind that has its own duration, who set it and when, and the default, as a table
  (--json: the JSON). `leases set` gives a kind its own duration, `leases clear` returns
  it to the default; both go through the audited setter (who, when, the old and new
  value are recorded in job_kind_lease_audit). A change applies from the next claim or
  heartbeat: a lease in flight keeps its deadline until then, and the reaper only
  compares lease_until with the database's clock.

EXAMPLES:
  lease-sweeper leases
  lease-sweeper leases set report.render 3600 --actor alice@ops
  lease-sweeper leases clear report.render --actor alice@ops
  lease-sweeper jobs dry-run     # the LEASE column: what each stale job was given, and why

",
    environment!(),
    "
EXIT STATUS:
  0 success, 1 a rejected change (an empty kind or actor, seconds outside 1-86400) or
  failure, 2 usage or configuration error (e.g. SECONDS not a number)

SEE ALSO:
  lease-sweeper gates, lease-sweeper jobs, docs/jobs-operator-guide.md, docs/sql-api.md"
);

const ALIVE_HELP: &str = "\
ENVIRONMENT:
  LEASE_SWEEPER_HEARTBEAT_FILE  the file `run` refreshes and this command reads (same path
                                for both; under --read-only put it on a small writable
                                volume, e.g. an emptyDir at /run/lease-sweeper)

EXAMPLES:
  LEASE_SWEEPER_HEARTBEAT_FILE=/run/lease-sweeper/heartbeat lease-sweeper alive --max-age 120

EXIT STATUS:
  0 alive, 1 heartbeat stale or missing (a loop is wedged, or none has run yet),
  2 LEASE_SWEEPER_HEARTBEAT_FILE not set

SEE ALSO:
  docs/container.md (the Kubernetes manifest's livenessProbe)";

const DEMO_HELP: &str = "\
NEEDS:
  PostgreSQL's server binaries (initdb, postgres) under /usr/lib/postgresql/*/bin, on PATH
  or in PG_BINDIR; as root, a `postgres` (or `nobody`) user to run them as. No server needs
  to be running, no configuration is read, and nothing outside a temporary directory is
  touched.

OUTPUT:
  The demonstration's own events (demo_*) and the daemon's lines and StatsD datagrams,
  logfmt on stdout.

EXIT STATUS:
  0 the demonstration ran and cleaned up, 1 it could not (the error says why)

SEE ALSO:
  lease-sweeper run, README.md";

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
    ///
    /// Configuration is the environment only: there is deliberately no flag
    /// for the interval (a fixed 1 s delay, so sweeps never overlap), the batch
    /// size or metric tags. Several replicas may sweep one database at once:
    /// they split the work (FOR UPDATE SKIP LOCKED) and never count a lease
    /// twice. The database's clock decides what has expired.
    #[command(after_help = RUN_HELP)]
    Run,

    /// Apply the bundled schema migrations (idempotent; safe from several hosts).
    #[command(after_help = MIGRATE_HELP)]
    Migrate,

    /// Preflight: check connection, schema, functions, privileges and StatsD.
    ///
    /// Prints one `ok`/`warn`/`FAIL` line per check on stdout, then a verdict,
    /// and exits 0 unless a line is FAIL, 1 otherwise. For operators and for
    /// systemd's ExecStartPre. Never prints secrets.
    #[command(after_help = CHECK_HELP)]
    Check,

    /// Inspect or reap stale job leases (a table, or the SQL functions' JSON).
    #[command(after_help = JOBS_HELP)]
    Jobs(JobsArgs),

    /// Show the queue gates, or change one (audited).
    #[command(after_help = GATES_HELP)]
    Gates(GatesArgs),

    /// Show the job lease durations per kind, or set or clear one (audited).
    #[command(after_help = LEASES_HELP)]
    Leases(LeasesArgs),

    /// Liveness probe: exit 0 while every service loop keeps making progress.
    ///
    /// Reads the heartbeat file that `run` writes to LEASE_SWEEPER_HEARTBEAT_FILE
    /// each time both loops (lock sweeper, job reaper) have finished a pass,
    /// failed or not. For a Kubernetes exec livenessProbe: it connects to
    /// nothing, so a database outage never fails it; a wedged loop does.
    #[command(after_help = ALIVE_HELP)]
    Alive {
        /// Oldest heartbeat accepted, in seconds (the unit's WatchdogSec).
        #[arg(long, value_name = "SECONDS", default_value_t = crate::heartbeat::DEFAULT_MAX_AGE.as_secs(),
              value_parser = clap::value_parser!(u64).range(1..=86_400))]
        max_age: u64,
    },

    /// The embedded default: a self-contained demonstration on a throwaway
    /// local PostgreSQL. Needs no configuration; finishes in under a minute.
    ///
    /// Starts PostgreSQL (as the `postgres` user when run as root), migrates,
    /// acts as a lock server that acquires leases and abandons some, opens the
    /// queue gates and abandons leased jobs, runs the real daemon so its lines
    /// and StatsD datagrams show, stops it with SIGTERM and removes the cluster.
    #[command(after_help = DEMO_HELP)]
    Demo,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Show what the reaper would do now (read-only, always allowed).
    ///
    /// Prints `stale_lease_count` (every stale lease) and, for the `--limit`
    /// oldest, each job's `would_action` (`reset_to_retry_waiting` or
    /// `move_to_dead_letter`) and the lease duration it was given, with where
    /// that came from. Mutates nothing, whatever the gates say.
    DryRun(LimitArg),
    /// Reap stale job leases now; refused unless the three gates allow it.
    ///
    /// Refused, in this order, for an empty actor, then while
    /// queue.job_substrate.enabled is false, queue.lease.reaper_enabled is
    /// false or queue.lease.reaper_dry_run_only is true (exit 1, the reason
    /// on stdout as `refused: <reason>`, or the JSON with --json).
    /// Otherwise each stale job returns to retry_waiting with exponential
    /// backoff, or moves to the dead-letter table at its last attempt; a job
    /// completed or re-leased meanwhile is never touched. Prints one row per
    /// job acted on, then a summary.
    Apply {
        /// Who is acting (recorded on dead letters and in the output).
        #[arg(long, value_name = "NAME")]
        actor: String,
        #[command(flatten)]
        limit: LimitArg,
    },
}

#[derive(Debug, Args)]
pub struct JobsArgs {
    #[command(subcommand)]
    pub command: JobsCommand,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How a one-shot command prints its result.
#[derive(Debug, Default, Clone, Copy, Args)]
pub struct OutputArgs {
    /// Print the SQL function's JSON, unchanged, for scripts (indented on a
    /// terminal, one line otherwise) instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LimitArg {
    /// Most jobs to consider (1-10000).
    // allow_negative_numbers: `--limit -1` should get the range message, not
    // be read as an unknown flag.
    #[arg(
        long,
        default_value_t = 100,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i32).range(1..=10_000)
    )]
    pub limit: i32,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct GatesArgs {
    #[command(subcommand)]
    pub command: Option<GatesCommand>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub enum GatesCommand {
    /// Change one queue setting through the audited setter.
    ///
    /// The setter validates the key and the value and records who changed
    /// what, and when. Prints the change as a table; a rejected change prints
    /// `refused: <reason>` and exits 1 (--json: the setter's JSON either way).
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

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LeasesArgs {
    #[command(subcommand)]
    pub command: Option<LeasesCommand>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub enum LeasesCommand {
    /// Give one job kind its own lease duration, through the audited setter.
    ///
    /// Claims and heartbeats of that kind then lease for SECONDS, unless a
    /// job's metadata.lease_override_sec says otherwise. A rejected change
    /// exits 1 with the reason; nothing is changed.
    Set {
        /// The job kind, exactly as enqueued (e.g. report.render).
        kind: String,
        /// Whole seconds, 1-86400; the database checks the range.
        // allow_negative_numbers: `set k -5` should get the database's range
        // refusal, not be read as an unknown flag.
        #[arg(allow_negative_numbers = true)]
        seconds: i32,
        /// Who is changing it (recorded in the audit table).
        #[arg(long, value_name = "NAME")]
        actor: String,
    },
    /// Return one job kind to the default, queue.lease.duration_sec (audited).
    Clear {
        /// The job kind, exactly as enqueued.
        kind: String,
        /// Who is changing it (recorded in the audit table).
        #[arg(long, value_name = "NAME")]
        actor: String,
    },
}
