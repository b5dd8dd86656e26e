//! The man-style pages of each subcommand (DESCRIPTION, OUTPUT, EXAMPLES,
//! EXIT STATUS, SEE ALSO), around the environment block `cli` puts between
//! each head and tail. Text only: `cli` owns the commands they describe.

pub(super) const RUN_HEAD: &str = "\
OUTPUT:
  logfmt on stdout, one event per line: ts=<RFC 3339 UTC> level=<level> message=<event> ...
  One line per expired lock lease, written before the last record of its expiry in the
  database is gone, so a crash can repeat a line but never lose one. A log-based metric
  filters on the line's start, `{LEASE_EXPIRED_FILTER}`
  (a lock key may carry that text later in its own line):
    ts=... level=warn message=lease_expired lockKey=K token=N expiredAtMillis=MS
        overdueMillis=MS backend=pg reapedBy=sweep|takeover|release|renewal ownerId=O
  With locks in etcd (ETCDCTL_ENDPOINTS): backend=etcd reapedBy=expiry|revoke, the
  token is the holder key's create revision and ownerId its lease id in hex (docs/etcd.md);
  etcd_events_missed (error) when etcd compacted changes before they were read.
  One line per stale job lease acted on: level=warn message=job_lease_expired jobId=...
  One line per holder of the xmin horizon keeping dead rows of lock_entry/job_queue,
  every 60 s while it holds (level=warn message=xmin_horizon_held holder=... pid=...
  applicationName=... slotName=... gid=...), and xmin_horizon_released when it ends.
  Diagnostics (docs/metrics-and-logs.md), from two independent loops: the lock sweeper
  (sweep_*), on a connection of its own, and the job reaper (job_reap_*):
    starting, systemd_notify_enabled, sweeper_started, job_reaper_started
    sweep_failed / sweep_recovered, job_reap_failed / job_reap_recovered (database
      trouble: logged when it starts or changes, then once a minute, then on recovery)
    job_reaper_gated / job_reaper_armed (the gates' answer, once per change)
    statsd_unavailable / statsd_recovered, systemd_notify_failed
    shutdown_requested, shutdown_forced (a second signal)
    sweep_abandoned_at_shutdown, job_reap_abandoned_at_shutdown (a batch still running
      2 s after the signal rolls back)
    sweeper_stopped, job_reaper_stopped
  A third loop, the horizon check (horizon_check_*, every 10 s, taking turns with the job
  reaper on its connection, never part of a sweep): horizon_check_started, horizon_check_failed /
  horizon_check_recovered, xmin_horizon_partial_view (no pg_read_all_stats, once),
  horizon_check_abandoned_at_shutdown, horizon_check_stopped

METRICS (StatsD over UDP, DogStatsD tags, no prefix, flushed per batch and per sweep):
  lock.lease.expired:N|c|#backend:pg            lock.held.current:N|g|#backend:pg
  queue.lease.reaped:N|c|#backend:pg,action:A   queue.lease.stale.current:N|g|#backend:pg
  lock.lease.overdue:MS|ms|@R|#backend:pg,reaped_by:B   (lateness timers: at most 100
  queue.lease.overdue:MS|ms|@R|#backend:pg,action:A      a batch per tag set; @R only
                                                         when sampled)
  pg.xmin_horizon.age_seconds:S|g               pg.dead_rows.current:N|g|#table:lock_entry
  lock.events.missed:N|c|#backend:etcd          (with locks in etcd, the same lock.* names
                                                 tagged backend:etcd)

SIGNALS:
  SIGTERM, SIGINT   no new sweep; the batch in flight commits (or after 2 s rolls back);
                    StatsD is flushed; exit 0
  a second signal   exit at once with 128+signal

SYSTEMD:
  With NOTIFY_SOCKET set (Type=notify): READY=1 after the first lock sweep, WATCHDOG=1
  each time the lock sweeper and the job reaper (with etcd and no database, the sweeper
  alone) have each finished a pass (failed or not), so a wedged loop of either stops the
  pings; the horizon check is not watched. STOPPING=1 on the first signal.

EXAMPLES:
  LOCKDB_URL=postgres://sweeper:secret@db.internal:5432/locks lease-sweeper run
  LOCKDB_URL='postgres://sweeper@localhost/locks?host=/run/postgresql' STATSD_HOST=statsd.internal lease-sweeper run

";

pub(super) const RUN_TAIL: &str = "
EXIT STATUS:
  0 stopped by a signal after a clean drain; 1 could not start (signal handlers);
  2 configuration error (a restart cannot fix it); 128+N forced by a second signal N.
  A database that is down or not migrated is not an exit: the daemon logs it and retries
  every second.

SEE ALSO:
  lease-sweeper check, docs/operations.md, docs/metrics-and-logs.md,
  systemd/lease-sweeper.service, docs/container.md";

pub(super) const MIGRATE_HEAD: &str = "\
DESCRIPTION:
  Installs the sidecar into the lock server's database, or upgrades it. Where the lock
  server's lock_entry (and the queue's job_queue) exist, it adopts them: it checks the
  columns the sweep reads and adds only its own objects (its tables, functions, role and
  grants, three triggers on lock_entry, and the expiry index if none exists, built
  CONCURRENTLY); it never re-creates, rewrites or constrains their tables and never
  touches their migration history. A table that does not fit is refused, nothing changed,
  each missing or unusable column named. Where neither exists (a new install), it creates
  a stand-in lock server and job queue; beside a lock server of its own without a job
  queue it creates none, and the job reaper idles (a later migrate adopts a job queue once
  one exists). It is one unit: the versioned migrations and the functions (added,
  replaced, and dropped once no longer shipped) commit together or not at all, so a
  failure leaves the functions the daemons call; then the triggers, whose lock on
  lock_entry is waited for at most 100 ms at a time and tried again, then the index. Run
  it as the owner of the lock server's tables or a superuser (the first time per cluster,
  a role that may create roles). Safe to run again, and from several hosts at once: each
  holds a session advisory lock for the whole run, and the second finds the first's work
  done. During an upgrade, migrate before starting new binaries.

OUTPUT:
  One `migrated` line on stderr: the schema, lockServer (adopted or created), jobQueue
  (adopted, created or absent), and what this run applied and dropped; beside no job
  queue, a `job_reaper_idle` line saying why.

EXAMPLES:
  LOCKDB_URL=postgres://locks_owner@db.internal:5432/locks lease-sweeper migrate

";

pub(super) const MIGRATE_TAIL: &str = "
EXIT STATUS:
  0 applied (or nothing to do), 1 the database refused, did not fit or could not be
  reached, 2 configuration error

SEE ALSO:
  lease-sweeper remove, lease-sweeper check, docs/adopting.md, docs/operations.md (Upgrade)";

pub(super) const REMOVE_HEAD: &str = "\
DESCRIPTION:
  Takes the sidecar out of the database again: its triggers on lock_entry, its functions,
  tables and history, the reaper's two gate rows where migrate inserted them (and the
  queue's audit of that), its grants, and the expiry index if migrate built it: the
  database is as migrate found it. The lock server's and the queue's tables, rows,
  triggers and history stay exactly as they were, and so does the cluster-wide role
  lease_sweeper. Where the sidecar is not installed it does nothing. One short
  transaction, its lock on lock_entry waited for at most 100 ms at a time. Refuses,
  changing nothing, while takeovers, late releases or swept batches wait to be reported:
  run the daemon until `check` shows none, stop every daemon, then remove.

OUTPUT:
  One `removed` line on stderr, or `not_installed` where there was nothing to remove.

EXAMPLES:
  LOCKDB_URL=postgres://locks_owner@db.internal:5432/locks lease-sweeper remove

";

pub(super) const REMOVE_TAIL: &str = "
EXIT STATUS:
  0 removed (or not installed), 1 refused or the database could not be reached,
  2 configuration error

SEE ALSO:
  lease-sweeper migrate, docs/adopting.md";

pub(super) const CHECK_HEAD: &str = "\
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
    etcd, etcd lock keys, etcd claims
                 with ETCDCTL_ENDPOINTS set, first: etcd answers as the user, which keys
                 the sidecar follows for locks, and that it may write under
                 lease-sweeper/ (docs/etcd.md); without a database named, only these
                 and statsd
  Each line is ok, warn (works, but worth acting on: a superuser role, a superuser owning
  the definer functions, no target set at all, a newer schema, no pg_read_all_stats) or
  FAIL; every FAIL line says what to do. Nothing is changed; the password is never printed.

OUTPUT (stdout):
  ok    migrations: 1 of 1 versioned migrations applied (latest 20261207000200)
  ok    functions: all 28 of this binary's functions are installed with its text
  FAIL  grant EXECUTE on function lock_reap_batch: this role lacks EXECUTE, needed because
        ...; GRANT EXECUTE ON FUNCTION lock_reap_batch TO <this role>
  check FAILED: 1 of 49 checks failed (see the FAIL lines above); the migrated role
        lease_sweeper holds every privilege listed: GRANT lease_sweeper TO <this role>
  A database that passes ends with: check passed: all 49 checks ok
  A database never migrated gets one line for its migrations, objects and grants:
  FAIL  schema: not migrated (...); run `lease-sweeper migrate` with a role that may create objects

SYSTEMD:
  The shipped unit runs `ExecStartPre=-lease-sweeper check`: the list lands in the journal
  before every start, and a failure does not block it (the daemon itself waits out a
  database that is down; a blocking preflight would turn a brief outage into a failed unit).

EXAMPLES:
  LOCKDB_URL=postgres://sweeper_host_a:secret@db.internal:5432/locks lease-sweeper check

";

pub(super) const CHECK_TAIL: &str = "
EXIT STATUS:
  0 no FAIL line (warn lines allowed), 1 at least one FAIL line, 2 configuration error

SEE ALSO:
  lease-sweeper migrate, docs/operations.md (Install, Troubleshooting)";

pub(super) const JOBS_HEAD: &str = "\
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

pub(super) const JOBS_TAIL: &str = "
EXIT STATUS:
  0 success, 1 failure or a refused apply (stdout says why), 2 usage or configuration error

SEE ALSO:
  lease-sweeper gates, lease-sweeper leases, docs/jobs-operator-guide.md, docs/sql-api.md";

pub(super) const GATES_HEAD: &str = "\
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

pub(super) const GATES_TAIL: &str = "
EXIT STATUS:
  0 success, 1 a rejected setting or failure, 2 usage or configuration error

SEE ALSO:
  lease-sweeper jobs, lease-sweeper leases, docs/jobs-operator-guide.md";

pub(super) const LEASES_HEAD: &str = "\
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

pub(super) const LEASES_TAIL: &str = "
EXIT STATUS:
  0 success, 1 a rejected change (an empty kind or actor, seconds outside 1-86400) or
  failure, 2 usage or configuration error (e.g. SECONDS not a number)

SEE ALSO:
  lease-sweeper gates, lease-sweeper jobs, docs/jobs-operator-guide.md, docs/sql-api.md";

pub(super) const ALIVE_TAIL: &str =
    "  run and alive need the same LEASE_SWEEPER_HEARTBEAT_FILE; under --read-only put it on a
  small writable volume, e.g. an emptyDir at /run/lease-sweeper.

EXAMPLES:
  LEASE_SWEEPER_HEARTBEAT_FILE=/run/lease-sweeper/heartbeat lease-sweeper alive --max-age 120

EXIT STATUS:
  0 alive, 1 heartbeat stale or missing (a loop is wedged, or none has run yet),
  2 LEASE_SWEEPER_HEARTBEAT_FILE not set

SEE ALSO:
  docs/container.md (the Kubernetes manifest's livenessProbe)";

pub(super) const DEMO_HEAD: &str = "\
NEEDS:
  PostgreSQL's server binaries (initdb, postgres) under /usr/lib/postgresql/*/bin, on PATH
  or in PG_BINDIR; as root, a `postgres` (or `nobody`) user to run them as. No server needs
  to be running, no configuration is read, and nothing outside a temporary directory is
  touched.

OUTPUT:
  The demonstration's own events (demo_*) and the daemon's lines and StatsD datagrams,
  logfmt on stdout.

";

pub(super) const DEMO_TAIL: &str = "
EXIT STATUS:
  0 the demonstration ran and cleaned up, 1 it could not (the error says why)

SEE ALSO:
  lease-sweeper run, README.md";
