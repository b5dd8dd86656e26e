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
//! `cli::man::committed_pages_match_the_cli` keeps them equal).

use clap::{Args, Parser, Subcommand};

mod pages;
use pages::*;

/// One row of the environment table, the same facts as README.md's table
/// (the test `cli::output::help_environment_is_readmes_table` compares
/// them: names, meaning with Markdown dropped, default), plus which commands
/// read it, so each page lists only its own.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// The variables this row is about, in README's order.
    pub names: &'static [&'static str],
    /// What they do (README's wording, without its Markdown).
    pub meaning: &'static str,
    /// What applies when they are unset (`—`: nothing).
    pub default: &'static str,
    /// The subcommands that read them.
    pub read_by: &'static [&'static str],
}

/// Every command that connects to the lock database.
const DB_COMMANDS: &[&str] = &["run", "migrate", "check", "jobs", "gates", "leases"];

/// The environment: there is no config file and no flag for the interval or
/// tags.
pub const ENVIRONMENT_TABLE: &[EnvVar] = &[
    EnvVar {
        names: &["LOCKDB_URL"],
        meaning: "the lock database: a libpq URL, multi-host included \
                  (postgres://u@db1:5432,db2:5432/locks?target_session_attrs=read-write&connect_timeout=3), \
                  or key=value pairs",
        default: "—",
        read_by: DB_COMMANDS,
    },
    EnvVar {
        names: &["DATABASE_URL"],
        meaning: "used when LOCKDB_URL is unset",
        default: "—",
        read_by: DB_COMMANDS,
    },
    EnvVar {
        names: &[
            "PGHOST",
            "PGHOSTADDR",
            "PGPORT",
            "PGDATABASE",
            "PGUSER",
            "PGPASSWORD",
            "PGPASSFILE",
            "PGSSLMODE",
            "PGSSLROOTCERT",
            "PGSSLCERT",
            "PGSSLKEY",
            "PGAPPNAME",
            "PGCONNECT_TIMEOUT",
            "PGTARGETSESSIONATTRS",
            "PGOPTIONS",
        ],
        meaning: "libpq's variables (PGHOST, PGHOSTADDR and PGPORT take comma lists): the \
                  whole target when neither URL is set, else what the URL leaves out",
        default: "libpq's: user = the OS user, password from ~/.pgpass (0600), certificates \
                  from ~/.postgresql/",
        read_by: DB_COMMANDS,
    },
    EnvVar {
        names: &["ETCDCTL_ENDPOINTS"],
        meaning: "etcd's client URLs, comma-separated (https://10.0.0.1:2379,https://10.0.0.2:2379), \
                  or host:port (https:// when a TLS file below is set): set, the locks are in etcd, \
                  not in PostgreSQL (docs/etcd.md); the job reaper then runs only when a database \
                  is named too",
        default: "unset: locks in PostgreSQL",
        read_by: &["run", "check"],
    },
    EnvVar {
        names: &["ETCDCTL_CACERT", "ETCDCTL_CERT", "ETCDCTL_KEY"],
        meaning: "PEM files, read at start: the CA that signed etcd's server certificates (needed \
                  for https://: no other CA is trusted for etcd), and a client certificate and its \
                  key (both or neither)",
        default: "—",
        read_by: &["run", "check"],
    },
    EnvVar {
        names: &["ETCDCTL_USER", "ETCDCTL_PASSWORD"],
        meaning: "etcd's authentication: user:password, or the user with ETCDCTL_PASSWORD; its role \
                  needs read on the locks' prefix and readwrite on lease-sweeper/ (docs/etcd.md)",
        default: "unset: no authentication",
        read_by: &["run", "check"],
    },
    EnvVar {
        names: &["STATSD_HOST"],
        meaning: "StatsD agent host; resolved by a background sender, never on the sweep's path, and again after failures",
        default: "127.0.0.1",
        read_by: &["run", "check"],
    },
    EnvVar {
        names: &["STATSD_PORT"],
        meaning: "StatsD agent UDP port",
        default: "8125",
        read_by: &["run", "check"],
    },
    EnvVar {
        names: &["LEASE_SWEEPER_METRICS_ADDR"],
        meaning: "IP:port where run serves GET /metrics for Prometheus (127.0.0.1:9464; \
                  0.0.0.0:9464 in a pod); the same numbers as StatsD plus the daemon's health \
                  (docs/metrics-and-logs.md)",
        default: "unset: nothing listens",
        read_by: &["run"],
    },
    EnvVar {
        names: &["LEASE_SWEEPER_WEB_CONFIG_FILE"],
        meaning: "Prometheus's web configuration file (what --web.config.file of node_exporter \
                  reads) for the metrics endpoint: TLS, client certificates, Basic auth users \
                  (bcrypt), security headers; re-read for each connection; needs \
                  LEASE_SWEEPER_METRICS_ADDR (docs/metrics-and-logs.md)",
        default: "unset: plain HTTP, no auth",
        read_by: &["run", "check"],
    },
    EnvVar {
        names: &["LEASE_SWEEPER_HEARTBEAT_FILE"],
        meaning: "where run writes its liveness heartbeat and alive reads it (containers; \
                  docs/container.md)",
        default: "unset: none",
        read_by: &["run", "alive"],
    },
    EnvVar {
        names: &["RUST_LOG"],
        meaning: "extra diagnostic detail (lease_sweeper=debug); cannot silence lease_expired",
        default: "info,sqlx=warn",
        read_by: &[
            "run", "migrate", "check", "jobs", "gates", "leases", "alive", "demo",
        ],
    },
    EnvVar {
        names: &["NOTIFY_SOCKET", "WATCHDOG_USEC"],
        meaning: "set by systemd for Type=notify and WatchdogSec=: run then sends READY, \
                  WATCHDOG and STOPPING (docs/operations.md); never set them yourself",
        default: "unset: no notifications",
        read_by: &["run"],
    },
    EnvVar {
        names: &["HOSTNAME"],
        meaning: "with etcd, this sidecar's name in its claims, resume point and liveness key, \
                  which must differ between sidecars (containers and the unit set it; unset, the \
                  kernel's host name); the job reaper's actor, lease-sweeper@<host>, takes it only \
                  when gethostname(2) fails",
        default: "unknown-host",
        read_by: &["run"],
    },
    EnvVar {
        names: &["PG_BINDIR", "PATH"],
        meaning: "where demo (and the tests) find PostgreSQL's initdb and postgres: PG_BINDIR, \
                  else the newest /usr/lib/postgresql/*/bin, else pg_config --bindir, else PATH",
        default: "—",
        read_by: &["demo"],
    },
];

/// Width the help's environment text is wrapped to (the other blocks of
/// the pages are written to it by hand).
const HELP_WIDTH: usize = 92;

/// The ENVIRONMENT block for `command` (every variable when `None`, for the
/// top-level page): each row's names, then its meaning and default, wrapped.
pub fn environment(command: Option<&str>) -> String {
    let mut out = String::from("ENVIRONMENT:\n");
    for var in ENVIRONMENT_TABLE {
        if command.is_some_and(|c| !var.read_by.contains(&c)) {
            continue;
        }
        wrap(&mut out, &var.names.join(", "), "  ");
        wrap(&mut out, var.meaning, "      ");
        match var.default {
            "—" => {}
            d if d.starts_with("unset") => wrap(&mut out, d, "      "),
            d => wrap(&mut out, &format!("default: {d}"), "      "),
        }
    }
    if command.is_none_or(|c| DB_COMMANDS.contains(&c)) {
        out.push_str(
            "  Passwords are never printed: databases are named postgres://USER@HOST:PORT/DB.\n",
        );
    }
    out
}

/// Appends `text` to `out`, filled to `HELP_WIDTH` with every line indented;
/// a word longer than a line gets a line of its own.
fn wrap(out: &mut String, text: &str, indent: &str) {
    let mut line = String::from(indent);
    for word in text.split_whitespace() {
        if line.len() > indent.len() && line.len() + 1 + word.len() > HELP_WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = String::from(indent);
        }
        if line.len() > indent.len() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// A subcommand's page: its own blocks, the environment it reads, then its
/// exit status and references.
fn page(head: &str, command: &str, tail: &str) -> String {
    format!("{head}{}{tail}", environment(Some(command)))
}

/// The top-level page's blocks after its environment.
const TOP_TAIL: &str = "
EXIT STATUS:
  0 success, 1 runtime failure (or a refused job apply), 2 usage or configuration error

SEE ALSO:
  docs/operations.md, docs/metrics-and-logs.md, docs/container.md, docs/etcd.md,
  systemd/lease-sweeper.service
  (the docs/ pages are also installed by the Debian package, in /usr/share/doc/lease-sweeper/)";

fn top_help() -> String {
    format!("{}{TOP_TAIL}", environment(None))
}

/// The pattern a log-based metric counts `lease_expired` lines with: anchored
/// on the line's start, because a lock key, owner or job kind may carry the
/// same text inside a quoted value later in its own line (an unanchored
/// filter lets a hostile key inflate the count). README.md shows the same
/// (`cli::output::help_log_filter_is_readmes`).
pub const LEASE_EXPIRED_FILTER: &str = r"^ts=\S+ level=warn message=lease_expired ";

/// Where `RUN_HEAD` shows `LEASE_EXPIRED_FILTER`.
const FILTER_SLOT: &str = "{LEASE_EXPIRED_FILTER}";

fn run_help() -> String {
    page(
        &RUN_HEAD.replace(FILTER_SLOT, LEASE_EXPIRED_FILTER),
        "run",
        RUN_TAIL,
    )
}

/// Sweeps expired lock leases and stale job leases out of PostgreSQL (or
/// follows the locks held in etcd), turning each lock-lease expiry into one
/// WARN `lease_expired` line and one StatsD count.
#[derive(Debug, Parser)]
#[command(name = "lease-sweeper", version, about, long_about = None, after_help = top_help())]
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
    /// line per lease to stdout (after the batch is released, before its
    /// record is gone), adds to the StatsD counter
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
    ///
    /// The locks are in PostgreSQL's lock_entry unless ETCDCTL_ENDPOINTS names
    /// etcd (with etcdctl's own ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY,
    /// ETCDCTL_USER and ETCDCTL_PASSWORD): then it follows the locks held with
    /// etcd's own lock service, whose expiries etcd carries out, and reports
    /// each holder's lease that ran out (reapedBy=expiry) or was revoked while
    /// it held its lock (reapedBy=revoke), with backend=etcd. PostgreSQL is
    /// then needed only for the job reaper, which runs when a database is
    /// named too (docs/etcd.md).
    #[command(after_help = run_help())]
    Run,

    /// Install or upgrade the sidecar, adopting the lock server's tables (idempotent).
    #[command(after_help = page(MIGRATE_HEAD, "migrate", MIGRATE_TAIL))]
    Migrate,

    /// Take the sidecar out of the database, leaving the lock server's tables as they were.
    #[command(after_help = page(REMOVE_HEAD, "remove", REMOVE_TAIL))]
    Remove,

    /// Preflight: check connection, schema, functions, privileges and StatsD.
    ///
    /// Prints one `ok`/`warn`/`FAIL` line per check on stdout, then a verdict,
    /// and exits 0 unless a line is FAIL, 1 otherwise. For operators and for
    /// systemd's ExecStartPre. Never prints secrets. With ETCDCTL_ENDPOINTS
    /// set, three etcd lines come first (etcd, etcd lock keys, etcd claims),
    /// and the PostgreSQL checks follow only when a database is named too.
    /// With LEASE_SWEEPER_WEB_CONFIG_FILE set, a last line, `metrics endpoint
    /// web config`, reads that file as `run` would (FAIL where `run` would not
    /// start; warn for an expired server certificate).
    #[command(after_help = page(CHECK_HEAD, "check", CHECK_TAIL))]
    Check,

    /// Inspect or reap stale job leases (a table, or the SQL functions' JSON).
    #[command(after_help = page(JOBS_HEAD, "jobs", JOBS_TAIL))]
    Jobs(JobsArgs),

    /// Show the queue's three gates and two tuning settings, or change one (audited).
    #[command(after_help = page(GATES_HEAD, "gates", GATES_TAIL))]
    Gates(GatesArgs),

    /// Show the job lease durations per kind, or set or clear one (audited).
    #[command(after_help = page(LEASES_HEAD, "leases", LEASES_TAIL))]
    Leases(LeasesArgs),

    /// Liveness probe: exit 0 while every service loop keeps making progress.
    ///
    /// Reads the heartbeat file that `run` writes to LEASE_SWEEPER_HEARTBEAT_FILE
    /// each time both loops (lock sweeper, job reaper; with etcd and no
    /// database, the lock sweeper alone) have finished a pass, failed or not.
    /// For a Kubernetes exec livenessProbe: it connects to nothing, so a
    /// database outage never fails it; a wedged loop does.
    #[command(after_help = page("", "alive", ALIVE_TAIL))]
    Alive {
        /// Oldest heartbeat accepted, in seconds (the unit's WatchdogSec).
        #[arg(long, value_name = "SECONDS", default_value_t = crate::heartbeat::DEFAULT_MAX_AGE.as_secs(),
              value_parser = clap::value_parser!(u64).range(1..=86_400))]
        max_age: u64,
    },

    /// A self-contained demonstration: a throwaway local PostgreSQL with
    /// abandoned leases and jobs, swept by the real daemon, then removed.
    /// Needs no configuration; once built, it finishes in about ten seconds.
    ///
    /// Starts PostgreSQL (as the `postgres` user when run as root), migrates,
    /// acts as a lock server that acquires leases and abandons some, opens the
    /// queue gates and abandons leased jobs, runs the real daemon so its lines
    /// and StatsD datagrams show, stops it with SIGTERM and removes the cluster.
    /// Where etcd is installed, it then does the same with a throwaway etcd:
    /// three holders of etcd's own locks die, unlock and revoke their lease,
    /// and the daemon reports the first and the last.
    #[command(after_help = page(DEMO_HEAD, "demo", DEMO_TAIL))]
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
    /// on stdout as `refused: <reason>` followed, for a closed gate, by the
    /// `gates set` command that opens it; or the JSON with --json).
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
