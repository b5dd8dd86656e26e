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
        meaning: "only when gethostname(2) fails: the host part of the job reaper's actor, \
                  lease-sweeper@<host>",
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
  docs/operations.md, docs/metrics-and-logs.md, docs/container.md, systemd/lease-sweeper.service
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

const RUN_HEAD: &str = "\
OUTPUT:
  logfmt on stdout, one event per line: ts=<RFC 3339 UTC> level=<level> message=<event> ...
  Exactly one line per expired lock lease, written before its deletion commits. A
  log-based metric filters on the line's start, `{LEASE_EXPIRED_FILTER}`
  (a lock key may carry that text later in its own line):
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
  lock.lease.overdue:MS|ms|@R|#backend:pg,reaped_by:B   (lateness timers: at most 100
  queue.lease.overdue:MS|ms|@R|#backend:pg,action:A      a batch per tag set; @R only
                                                         when sampled)
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

";

const RUN_TAIL: &str = "
EXIT STATUS:
  0 stopped by a signal after a clean drain; 1 could not start (signal handlers);
  2 configuration error (a restart cannot fix it); 128+N forced by a second signal N.
  A database that is down or not migrated is not an exit: the daemon logs it and retries
  every second.

SEE ALSO:
  lease-sweeper check, docs/operations.md, docs/metrics-and-logs.md,
  systemd/lease-sweeper.service, docs/container.md";

const MIGRATE_HEAD: &str = "\
DESCRIPTION:
  Installs the sidecar into the lock server's database, or upgrades it. Where the lock
  server's lock_entry (and the queue's job_queue) exist, it adopts them: it checks the
  columns the sweep reads and adds only its own objects (its tables, functions, role and
  grants, two triggers on lock_entry, and the expiry index if none exists, built
  CONCURRENTLY); it never re-creates, rewrites or constrains their tables and never
  touches their migration history. A table that does not fit is refused, nothing changed,
  each missing or unusable column named. Where none exist (a new install), it creates a
  stand-in lock server and job queue. The triggers' lock on lock_entry is waited for at
  most 100 ms at a time and tried again. Run it as the owner of the lock server's tables
  or a superuser (the first time per cluster, a role that may create roles). Safe to run
  again and from several hosts. During an upgrade, migrate before starting new binaries.

OUTPUT:
  One `migrated` line on stderr: the schema, lockServer and jobQueue (adopted or
  created), and what this run applied.

EXAMPLES:
  LOCKDB_URL=postgres://locks_owner@db.internal:5432/locks lease-sweeper migrate

";

const MIGRATE_TAIL: &str = "
EXIT STATUS:
  0 applied (or nothing to do), 1 the database refused, did not fit or could not be
  reached, 2 configuration error

SEE ALSO:
  lease-sweeper remove, lease-sweeper check, docs/adopting.md, docs/operations.md (Upgrade)";

const REMOVE_HEAD: &str = "\
DESCRIPTION:
  Takes the sidecar out of the database again: its triggers on lock_entry, its functions,
  tables and history, the reaper's two gate rows, its grants, and the expiry index if
  migrate built it. The lock server's and the queue's tables, rows, triggers and history
  stay exactly as they were, and so does the cluster-wide role lease_sweeper. One short
  transaction, its lock on lock_entry waited for at most 100 ms at a time. Refuses,
  changing nothing, while takeovers, late releases or swept batches wait to be reported:
  run the daemon until `check` shows none, stop every daemon, then remove.

OUTPUT:
  One `removed` line on stderr.

EXAMPLES:
  LOCKDB_URL=postgres://locks_owner@db.internal:5432/locks lease-sweeper remove

";

const REMOVE_TAIL: &str = "
EXIT STATUS:
  0 removed, 1 refused, not installed, or the database could not be reached,
  2 configuration error

SEE ALSO:
  lease-sweeper migrate, docs/adopting.md";

const CHECK_HEAD: &str = "\
DESCRIPTION:
  With the same environment as `run`, checks and prints one line per item:
    connect      the database answers, each host within its connect_timeout (5 s unless
                 set); where the target came from, the role and server version
    lock server's table
                 whose lock_entry is, whether it fits what the sweep reads, and whether
                 the sidecar adopted it; if not yet, what `migrate` will add
    migrations   every migration of this binary is applied, none failed or changed
                 (newer ones are a warning, fine while an upgrade rolls out)
    table, index, function
                 every object the daemon uses is visible to this role, and whose it is
                 (the lock server's, the job queue's, the sidecar's); indexes are valid
    grant        this role holds each privilege `run` needs, one line per object (the
                 list, with why each is needed: docs/least-privilege.md, section 2); the
                 sweep deletes through SECURITY DEFINER functions, so no DELETE is needed
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
  ok    migrations: all 1 applied (latest 20261207000100)
  FAIL  grant EXECUTE on function lock_reap_batch: this role lacks EXECUTE, needed because
        ...; GRANT EXECUTE ON FUNCTION lock_reap_batch TO <this role>
  check FAILED: 1 of 50 checks failed (see the FAIL lines above); the migrated role
        lease_sweeper holds every privilege listed: GRANT lease_sweeper TO <this role>
  A database that passes ends with: check passed: all 50 checks ok
  A database never migrated gets one line for its migrations, objects and grants:
  FAIL  schema: not migrated (...); run `lease-sweeper migrate` with a role that may create objects

SYSTEMD:
  The shipped unit runs `ExecStartPre=-lease-sweeper check`: the list lands in the journal
  before every start, and a failure does not block it (the daemon itself waits out a
  database that is down; a blocking preflight would turn a brief outage into a failed unit).

EXAMPLES:
  LOCKDB_URL=postgres://sweeper_host_a:secret@db.internal:5432/locks lease-sweeper check

";

const CHECK_TAIL: &str = "
EXIT STATUS:
  0 no FAIL line (warn lines allowed), 1 at least one FAIL line, 2 configuration error

SEE ALSO:
  lease-sweeper migrate, docs/operations.md (Install, Troubleshooting)";

const JOBS_HEAD: &str = "\
DESCRIPTION:
  The job queue's stale-lease reaper, by hand. `dry-run` is read-only and always allowed;
  `apply` acts only while the three gates allow it (three of the five settings
  `lease-sweeper gates` shows; the other two tune the retry backoff and the default
  lease). The daemon
  runs the same apply on every sweep; these commands are for operators.

OUTPUT:
  A table on stdout: one row per job with what the reaper would do (dry-run) or did
  (apply), then a summary line. dry-run's LEASE column is the lease duration the job's
  latest claim or heartbeat gave it and where that came from (`30s kind`: its kind's
  duration; `override`: its metadata.lease_override_sec; `default`:
  queue.lease.duration_sec; `-`: not leased through fn_job_claim or fn_job_heartbeat).
  A refused apply prints `refused: <reason>` and exits 1; a closed gate's refusal adds the
  command that opens it:
    refused: queue.lease.reaper_dry_run_only=true
    to open that gate: lease-sweeper gates set queue.lease.reaper_dry_run_only false --actor NAME
  --json prints the SQL function's JSON unchanged instead (for scripts and jq), the
  refusal included. Diagnostics go to stderr. No colour, terminal or not.

EXAMPLES:
  lease-sweeper jobs dry-run --limit 20
  lease-sweeper jobs dry-run --json | jq .stale_lease_count
  lease-sweeper jobs apply --actor alice@ops --limit 100

";

const JOBS_TAIL: &str = "
EXIT STATUS:
  0 success, 1 failure or a refused apply (stdout says why), 2 usage or configuration error

SEE ALSO:
  lease-sweeper gates, lease-sweeper leases, docs/jobs-operator-guide.md, docs/sql-api.md";

const GATES_HEAD: &str = "\
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
  the three gates     queue.job_substrate.enabled=false, queue.lease.reaper_enabled=false,
                      queue.lease.reaper_dry_run_only=true
  two tuning settings queue.retry.backoff_base_sec=10 (the retry backoff's base),
                      queue.lease.duration_sec=300 (the job lease when neither the job
                      nor its kind sets one; see `lease-sweeper leases`)

EXAMPLES:
  lease-sweeper gates
  lease-sweeper gates --json
  lease-sweeper gates set queue.lease.reaper_enabled true --actor alice@ops

";

const GATES_TAIL: &str = "
EXIT STATUS:
  0 success, 1 a rejected setting or failure, 2 usage or configuration error

SEE ALSO:
  lease-sweeper jobs, lease-sweeper leases, docs/jobs-operator-guide.md";

const LEASES_HEAD: &str = "\
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

";

const LEASES_TAIL: &str = "
EXIT STATUS:
  0 success, 1 a rejected change (an empty kind or actor, seconds outside 1-86400) or
  failure, 2 usage or configuration error (e.g. SECONDS not a number)

SEE ALSO:
  lease-sweeper gates, lease-sweeper jobs, docs/jobs-operator-guide.md, docs/sql-api.md";

const ALIVE_TAIL: &str =
    "  run and alive need the same LEASE_SWEEPER_HEARTBEAT_FILE; under --read-only put it on a
  small writable volume, e.g. an emptyDir at /run/lease-sweeper.

EXAMPLES:
  LEASE_SWEEPER_HEARTBEAT_FILE=/run/lease-sweeper/heartbeat lease-sweeper alive --max-age 120

EXIT STATUS:
  0 alive, 1 heartbeat stale or missing (a loop is wedged, or none has run yet),
  2 LEASE_SWEEPER_HEARTBEAT_FILE not set

SEE ALSO:
  docs/container.md (the Kubernetes manifest's livenessProbe)";

const DEMO_HEAD: &str = "\
NEEDS:
  PostgreSQL's server binaries (initdb, postgres) under /usr/lib/postgresql/*/bin, on PATH
  or in PG_BINDIR; as root, a `postgres` (or `nobody`) user to run them as. No server needs
  to be running, no configuration is read, and nothing outside a temporary directory is
  touched.

OUTPUT:
  The demonstration's own events (demo_*) and the daemon's lines and StatsD datagrams,
  logfmt on stdout.

";

const DEMO_TAIL: &str = "
EXIT STATUS:
  0 the demonstration ran and cleaned up, 1 it could not (the error says why)

SEE ALSO:
  lease-sweeper run, README.md";

/// Sweeps expired lock leases and stale job leases out of PostgreSQL, turning
/// each lock-lease expiry into one WARN `lease_expired` line and one StatsD
/// count.
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
    /// systemd's ExecStartPre. Never prints secrets.
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
    /// each time both loops (lock sweeper, job reaper) have finished a pass,
    /// failed or not. For a Kubernetes exec livenessProbe: it connects to
    /// nothing, so a database outage never fails it; a wedged loop does.
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
