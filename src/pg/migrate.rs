//! Installing the sidecar into a database, and taking it out again.
//!
//! Owns the order of `migrate`: the guard against planted overloads, then
//! the lock server's and the job queue's tables (adopted where they exist,
//! the stand-ins of `pg::sql` created where they do not), the versioned
//! `migrations/` (history in `lease_sweeper_migrations`), the functions
//! whose text changed, the triggers on `lock_entry` (a short lock, tried
//! again), and the expiry index if the lock server has none (built without
//! blocking its writes). `remove` undoes exactly that. `cmd::migrate`
//! and `cmd::remove` report; `cmd::check` reuses the guard and the
//! adoption rules (`pg::adopt`).

use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use crate::pg::adopt;
use crate::pg::sql;

/// The sidecar's versioned schema (tables, type, role, grants), embedded at
/// build time, its history kept in a table of its own: a lock server that
/// uses sqlx (or Flyway) keeps its history where it does, untouched.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate::Migrator {
    table_name: std::borrow::Cow::Borrowed(MIGRATIONS_TABLE),
    ..sqlx::migrate!("./migrations")
};

/// Where the sidecar records the migrations it applied.
pub const MIGRATIONS_TABLE: &str = "lease_sweeper_migrations";

/// `LOCK_TIMEOUT`'s text, a macro so that the statement setting it carries
/// it as a literal.
macro_rules! lock_timeout {
    () => {
        "100ms"
    };
}

/// `BUILT_INDEX_COMMENT`, likewise.
macro_rules! built_index_comment {
    () => {
        "built by lease-sweeper migrate"
    };
}

/// How long one try to take `lock_entry`'s lock for the triggers (or their
/// removal) may wait. A lock-server write queued behind the waiting trigger
/// waits at most this long; a lock that is not had by then is given up and
/// tried again after `LOCK_RETRY_PAUSE`, so no long transaction of the lock
/// server makes its own calls queue behind `migrate`.
pub const LOCK_TIMEOUT: &str = lock_timeout!();

/// The pause between two tries for `lock_entry`'s lock.
pub const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(400);

/// How many tries for `lock_entry`'s lock before `migrate` or `remove`
/// gives up, saying who holds it: a minute at most, during which the lock
/// server's calls wait at most `LOCK_TIMEOUT` each time.
pub const LOCK_TRIES: u32 = 120;

/// The comment on an expiry index `migrate` built, so `remove` drops only
/// its own.
pub const BUILT_INDEX_COMMENT: &str = built_index_comment!();

/// The session advisory lock every `migrate` and `remove` holds from its
/// first look at the database to its last statement (the lock is per
/// database, so other databases of the cluster go on). Invariant: at most
/// one of them decides what is there and changes the sidecar's objects at a
/// time, so two hosts never race on the stand-ins, the versioned migrations,
/// the functions, the triggers or the expiry index, and the second one to
/// come finds the first one's work done. The bytes spell `leaswep1`; nothing
/// else of this project takes an advisory lock in a lock server's database.
/// (sqlx's migrator takes its own lock too, inside this one, for its part.)
pub const MIGRATE_LOCK_KEY: i64 = 0x6c65_6173_7765_7031;

/// How long a `migrate` or `remove` that finds the lock held waits before it
/// tries again. It polls (`pg_try_advisory_lock`) rather than blocking in
/// `pg_advisory_lock`: a statement blocked there holds a snapshot, and the
/// holder's `CREATE INDEX CONCURRENTLY` waits for every snapshot older than
/// its own, which would make the two wait on each other until PostgreSQL
/// cancels one as a deadlock.
pub const MIGRATE_LOCK_PAUSE: Duration = Duration::from_millis(250);

/// Takes `MIGRATE_LOCK_KEY` if it is free (polled, see
/// `MIGRATE_LOCK_PAUSE`).
const TRY_MIGRATE_LOCK: &str = "SELECT pg_catalog.pg_try_advisory_lock($1)";
/// Who holds `MIGRATE_LOCK_KEY` in this database, for the waiting line.
const MIGRATE_LOCK_HOLDER: &str = "SELECT pg_catalog.format('pid %s (%s, %s)', a.pid, \
         coalesce(nullif(a.application_name, ''), 'no application_name'), coalesce(a.client_addr::pg_catalog.text, 'local')) \
     FROM pg_catalog.pg_locks AS l JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid \
    WHERE l.locktype = 'advisory' AND l.granted AND l.database = \
          (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = pg_catalog.current_database()) \
      AND l.objsubid = 1 AND ((l.classid::pg_catalog.int8 << 32) | l.objid::pg_catalog.int8) = $1 LIMIT 1";
/// Releases every session advisory lock this session holds: ours, and
/// sqlx's when a failed migration left it taken.
const RELEASE_MIGRATE_LOCK: &str = "SELECT pg_catalog.pg_advisory_unlock_all()";

/// Takes `MIGRATE_LOCK_KEY`, calling `waiting` once with who holds it when
/// it is held.
async fn take_migrate_lock(
    conn: &mut PgConnection,
    waiting: impl FnOnce(&str),
) -> Result<(), MigrateError> {
    let mut waiting = Some(waiting);
    loop {
        let had: bool = sqlx::query_scalar(TRY_MIGRATE_LOCK)
            .bind(MIGRATE_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await
            .map_err(sql_failed("taking the migrate lock"))?;
        if had {
            return Ok(());
        }
        if let Some(waiting) = waiting.take() {
            let holder: Option<String> = sqlx::query_scalar(MIGRATE_LOCK_HOLDER)
                .bind(MIGRATE_LOCK_KEY)
                .fetch_optional(&mut *conn)
                .await
                .map_err(sql_failed("looking for the holder of the migrate lock"))?;
            waiting(holder.as_deref().unwrap_or("a session that has just ended"));
        }
        tokio::time::sleep(MIGRATE_LOCK_PAUSE).await;
    }
}

/// Runs `body` holding `MIGRATE_LOCK_KEY`, and releases it however `body`
/// ends (the session ending would release it too).
async fn under_migrate_lock<T>(
    conn: &mut PgConnection,
    waiting: impl FnOnce(&str),
    body: impl AsyncFnOnce(&mut PgConnection) -> Result<T, MigrateError>,
) -> Result<T, MigrateError> {
    take_migrate_lock(conn, waiting).await?;
    let result = body(conn).await;
    let released = raw(conn, RELEASE_MIGRATE_LOCK, "releasing the migrate lock").await;
    let done = result?;
    released?;
    Ok(done)
}

/// Whose tables the sidecar sweeps: adopted, or created from its stand-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// They were there; the sidecar added only its own objects.
    Adopted,
    /// There were none; `migrate` created the stand-in.
    Created,
    /// There is none and `migrate` created none (a job queue beside an
    /// adopted lock server is the operator's to bring): the job reaper
    /// idles, and a later `migrate` adopts the queue once it exists.
    Absent,
}

/// What one `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The schema everything went into (the lock server's).
    pub schema: String,
    pub lock_server: Origin,
    pub job_queue: Origin,
    /// Versioned migrations applied by this run.
    pub migrations_applied: usize,
    /// Function files applied because their text changed (or was new, or
    /// the function was missing).
    pub functions_applied: usize,
    /// Functions the database recorded that this binary no longer ships,
    /// dropped (every overload) with their records.
    pub functions_dropped: Vec<String>,
    /// The triggers on `lock_entry` were (re)created, after this many tries
    /// for its lock; `None` when they were current.
    pub hooks_tries: Option<u32>,
    /// The expiry index was missing and this run built it.
    pub index_built: bool,
}

/// Why `migrate` or `remove` stopped. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "refusing to migrate: {0}; each shares a name with a PostgreSQL built-in, so it can be chosen \
         instead of the built-in and would run with this role's rights during the migration (CVE-2018-1058). \
         Have it dropped (DROP FUNCTION / DROP OPERATOR as named), run REVOKE CREATE ON SCHEMA public FROM PUBLIC, \
         then run lease-sweeper migrate again"
    )]
    Planted(String),
    #[error(
        "refusing to adopt {schema}.{table}, nothing was changed: {}; the sidecar reads these and \
         cannot sweep without them (docs/adopting.md)",
        .misfits.join("; ")
    )]
    Unfit {
        schema: String,
        table: &'static str,
        misfits: Vec<String>,
    },
    #[error("refusing to adopt, nothing was changed: {0}")]
    NotOwner(String),
    #[error(
        "refusing to adopt the job queue, nothing was changed: {0} is missing, which the reaper \
         needs beside job_queue (docs/adopting.md)"
    )]
    JobPieceMissing(&'static str),
    #[error("{what} failed: {source}")]
    Sql {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("{0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// A step of the one transaction of the stand-ins, the versioned
    /// migrations and the functions failed: all of it was rolled back.
    #[error(
        "{what} failed: {source}; this run's stand-ins, versioned migrations and functions were \
         rolled back together, so the database keeps the functions the daemons call; fix that, \
         then run lease-sweeper migrate again"
    )]
    Unit {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "{what}: lock_entry stayed locked for {tries} tries of {LOCK_TIMEOUT} each (a long \
         transaction of the lock server, or DDL, holds it: see pg_locks); nothing was left half \
         done; run the same command again when it is free"
    )]
    Busy { what: &'static str, tries: u32 },
    #[error("{0}")]
    Refused(String),
}

fn sql_failed(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> MigrateError {
    let what = what.into();
    move |source| MigrateError::Sql { what, source }
}

/// Installs or upgrades the sidecar; safe to run again and from several
/// hosts at once (`MIGRATE_LOCK_KEY`, a session advisory lock, serialises
/// the whole of it: run it directly against PostgreSQL or through a
/// session-mode pool, never through PgBouncer in transaction mode). Run by
/// the lock server's tables' owner or a superuser where they exist
/// (docs/adopting.md).
///
/// One unit: the stand-ins (where there are none), the versioned
/// migrations and the functions (added, replaced, and dropped when no
/// longer shipped) commit in one transaction or not at all, so a failure
/// leaves the functions the daemons were calling. The triggers follow in a
/// short transaction of their own (they call only functions that exist by
/// then), and the expiry index last (`CREATE INDEX CONCURRENTLY` cannot run
/// in a transaction; an interrupted build is redone next time).
///
/// Refuses first when a schema on the search path holds a function or
/// operator named like a built-in and owned by a role that is neither a
/// superuser nor the migrating role (`PLANTED_OVERLOADS`), which would run
/// with the migrating role's rights (CVE-2018-1058). Function bodies are not
/// validated at creation (`check_function_bodies = off`, as pg_dump restores
/// do), so their order does not matter.
pub async fn migrate(conn: &mut PgConnection) -> Result<Installed, MigrateError> {
    migrate_saying_when_waiting(conn, |_| {}).await
}

/// `migrate`, calling `waiting` once, with who holds the lock, when another
/// `migrate` or `remove` holds it (the command says so while it waits).
pub async fn migrate_saying_when_waiting(
    conn: &mut PgConnection,
    waiting: impl FnOnce(&str),
) -> Result<Installed, MigrateError> {
    under_migrate_lock(conn, waiting, migrate_locked).await
}

async fn migrate_locked(conn: &mut PgConnection) -> Result<Installed, MigrateError> {
    let planted: Option<String> = sqlx::query_scalar(crate::pg::catalog::PLANTED_OVERLOADS)
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_failed("looking for planted overloads"))?;
    if let Some(planted) = planted {
        return Err(MigrateError::Planted(planted));
    }
    let lock_entry = adopt::describe(conn, "lock_entry")
        .await
        .map_err(sql_failed("describing lock_entry"))?;
    // Everything goes where the lock server's table is, and this session
    // resolves names there first from now on.
    if let Some(found) = &lock_entry {
        sqlx::query(
            "SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident($1), false)",
        )
        .bind(&found.schema)
        .execute(&mut *conn)
        .await
        .map_err(sql_failed("setting the search path"))?;
    }
    let job_queue = adopt::describe(conn, "job_queue")
        .await
        .map_err(sql_failed("describing job_queue"))?;
    judge(&lock_entry, &job_queue, conn).await?;

    raw(conn, "SET check_function_bodies = off", "SET").await?;
    let result = install(conn, lock_entry.is_some(), job_queue.is_some()).await;
    raw(conn, "RESET check_function_bodies", "RESET").await?;
    result
}

/// Refuses, changing nothing, when an existing lock server or queue does
/// not fit or may not be altered by this role.
async fn judge(
    lock_entry: &Option<adopt::Found>,
    job_queue: &Option<adopt::Found>,
    conn: &mut PgConnection,
) -> Result<(), MigrateError> {
    if let Some(found) = lock_entry {
        fits("lock_entry", found, adopt::lock_entry_misfits(found))?;
    }
    if let Some(found) = job_queue {
        let labels: Option<Vec<String>> = sqlx::query_scalar(STATE_ENUM_LABELS)
            .fetch_optional(&mut *conn)
            .await
            .map_err(sql_failed("reading the type of job_queue.state"))?
            .flatten();
        fits(
            "job_queue",
            found,
            adopt::job_queue_misfits(found, labels.as_deref()),
        )?;
        for piece in JOB_PIECES {
            let there: bool = sqlx::query_scalar(piece.exists)
                .fetch_one(&mut *conn)
                .await
                .map_err(sql_failed(format!("looking for {}", piece.name)))?;
            if !there {
                return Err(MigrateError::JobPieceMissing(piece.name));
            }
        }
        dead_letter_callable(conn).await?;
    }
    Ok(())
}

/// The labels of `job_queue.state`'s type when it is an enum; NULL (or no
/// row) otherwise.
const STATE_ENUM_LABELS: &str = "
SELECT CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'e' THEN
            ARRAY(SELECT e.enumlabel::pg_catalog.text FROM pg_catalog.pg_enum AS e
                   WHERE e.enumtypid OPERATOR(pg_catalog.=) t.oid ORDER BY e.enumsortorder) END
  FROM pg_catalog.pg_attribute AS a
  JOIN pg_catalog.pg_type AS t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
 WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('job_queue')
   AND a.attname OPERATOR(pg_catalog.=) 'state' AND NOT a.attisdropped";

/// The queue's own dead-letter move, as the reaper calls it for each job at
/// its last attempt: the job, the final error, the actor; its JSON is the
/// action's `dead_letter`.
const DEAD_LETTER_CALL: &str = "fn_job_move_to_dead_letter(uuid, text, text) returning jsonb";

/// Whether `fn_job_move_to_dead_letter(uuid, text, text)` returns jsonb;
/// and, when not, every visible function of that name with what it returns.
const DEAD_LETTER_FITS: &str = "
SELECT COALESCE((SELECT p.prorettype OPERATOR(pg_catalog.=) 'pg_catalog.jsonb'::pg_catalog.regtype
                   FROM pg_catalog.pg_proc AS p
                  WHERE p.oid OPERATOR(pg_catalog.=)
                        pg_catalog.to_regprocedure('fn_job_move_to_dead_letter(uuid, text, text)')), false),
       (SELECT pg_catalog.string_agg(p.oid::pg_catalog.regprocedure::pg_catalog.text
                                     OPERATOR(pg_catalog.||) ' returning '
                                     OPERATOR(pg_catalog.||) pg_catalog.format_type(p.prorettype, NULL),
                                     ', ' ORDER BY p.oid)
          FROM pg_catalog.pg_proc AS p
         WHERE p.proname OPERATOR(pg_catalog.=) 'fn_job_move_to_dead_letter'
           AND pg_catalog.pg_function_is_visible(p.oid))";

/// Refuses when the queue's `fn_job_move_to_dead_letter` is not one the
/// reaper can call, naming what was found and what is needed.
async fn dead_letter_callable(conn: &mut PgConnection) -> Result<(), MigrateError> {
    let (fits, found): (bool, Option<String>) = sqlx::query_as(DEAD_LETTER_FITS)
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_failed("looking at fn_job_move_to_dead_letter"))?;
    match (fits, found) {
        (true, _) => Ok(()),
        (false, None) => Err(MigrateError::JobPieceMissing(
            "the function fn_job_move_to_dead_letter(uuid, text, text)",
        )),
        (false, Some(found)) => Err(MigrateError::Refused(format!(
            "refusing to adopt the job queue, nothing was changed: its fn_job_move_to_dead_letter is \
             {found}, and the reaper calls {DEAD_LETTER_CALL} (the job, the final error, the actor) \
             for each job at its last attempt, carrying its JSON as the action's dead_letter \
             (docs/adopting.md)"
        ))),
    }
}

/// `table` as found may be adopted: it has no `misfits` and this role may
/// alter it.
fn fits(
    table: &'static str,
    found: &adopt::Found,
    misfits: Vec<String>,
) -> Result<(), MigrateError> {
    if !misfits.is_empty() {
        return Err(MigrateError::Unfit {
            schema: found.schema.clone(),
            table,
            misfits,
        });
    }
    if !found.may_alter {
        return Err(MigrateError::NotOwner(adopt::not_owner(table, found)));
    }
    Ok(())
}

/// What the reaper needs of a job queue besides `job_queue`. Per-kind
/// lease durations (`job_kind_lease`) are optional: the reaper only asks
/// `lease_until < now()`, and `leases` says when a queue has none.
struct Piece {
    name: &'static str,
    exists: &'static str,
}

const JOB_PIECES: &[Piece] = &[
    Piece {
        name: "the table job_dead_letter",
        exists: "SELECT pg_catalog.to_regclass('job_dead_letter') IS NOT NULL",
    },
    Piece {
        name: "the table queue_setting (the gates and the backoff setting)",
        exists: "SELECT pg_catalog.to_regclass('queue_setting') IS NOT NULL",
    },
    Piece {
        name: "the function fn_job_move_to_dead_letter",
        exists: "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p \
                  WHERE p.proname OPERATOR(pg_catalog.=) 'fn_job_move_to_dead_letter' \
                    AND pg_catalog.pg_function_is_visible(p.oid))",
    },
];

async fn install(
    conn: &mut PgConnection,
    lock_server_there: bool,
    job_queue_there: bool,
) -> Result<Installed, MigrateError> {
    // The stand-in queue only beside the stand-in lock server (an empty
    // database): beside a lock server of its own, a job queue is the
    // operator's to bring, and the reaper idles until there is one
    // (docs/decisions.md).
    let create_job_queue = !lock_server_there && !job_queue_there;
    // One transaction: what the daemons call is replaced all at once, or
    // not at all. sqlx's migrator runs each migration in a savepoint of it.
    let mut tx = conn.begin().await.map_err(sql_failed("BEGIN"))?;
    if !lock_server_there {
        raw(
            &mut tx,
            sql::LOCK_SERVER,
            "creating the stand-in lock server (sql/lock_server.sql)",
        )
        .await
        .map_err(in_the_unit)?;
    }
    if create_job_queue {
        raw(
            &mut tx,
            sql::JOB_SUBSTRATE,
            "creating the stand-in job queue (sql/job_substrate.sql)",
        )
        .await
        .map_err(in_the_unit)?;
    }
    let schema: String = sqlx::query_scalar("SELECT pg_catalog.current_schema()::pg_catalog.text")
        .fetch_one(&mut *tx)
        .await
        .map_err(sql_failed("reading the current schema"))?;
    raw(
        &mut tx,
        FORGET_PRE_RELEASE,
        "forgetting the history of a build before the first release",
    )
    .await
    .map_err(in_the_unit)?;
    let before = applied_count(&mut tx).await?;
    MIGRATOR.run(&mut tx).await?;
    let migrations_applied = applied_count(&mut tx).await?.saturating_sub(before);
    let functions = apply_functions(&mut tx).await.map_err(in_the_unit)?;
    raw(
        &mut tx,
        sql::JOB_QUEUE_ACCESS,
        "applying sql/job_queue_access.sql",
    )
    .await
    .map_err(in_the_unit)?;
    tx.commit()
        .await
        .map_err(sql_failed(
            "COMMIT of the versioned migrations and the functions",
        ))
        .map_err(in_the_unit)?;
    // What `check` reads too: whether both triggers and a deadline index
    // are there.
    let found = crate::pg::catalog::adoption(conn)
        .await
        .map_err(sql_failed("looking at lock_entry's triggers and indexes"))?;
    let hooks_tries =
        apply_hooks(conn, found.triggers == crate::pg::catalog::HOOK_TRIGGERS).await?;
    let index_built = found.deadline_index.is_none();
    if index_built {
        build_expiry_index(conn).await?;
    }
    Ok(Installed {
        schema,
        lock_server: if lock_server_there {
            Origin::Adopted
        } else {
            Origin::Created
        },
        job_queue: if job_queue_there {
            Origin::Adopted
        } else if create_job_queue {
            Origin::Created
        } else {
            Origin::Absent
        },
        migrations_applied,
        functions_applied: functions.applied,
        functions_dropped: functions.dropped,
        hooks_tries,
        index_built,
    })
}

/// Builds before the first release recorded their one migration as version
/// 20261207000100; the first release's migration replaces it and tolerates
/// what it left, so that row is forgotten before the migrations run (sqlx
/// refuses a database that applied a migration the binary lacks).
const FORGET_PRE_RELEASE: &str = "DO $$ BEGIN \
     IF pg_catalog.to_regclass('lease_sweeper_migrations') IS NOT NULL THEN \
         DELETE FROM lease_sweeper_migrations WHERE version = 20261207000100; \
     END IF; END $$";

/// A statement of the one transaction failed: said as such, since the
/// whole of it was rolled back.
fn in_the_unit(e: MigrateError) -> MigrateError {
    match e {
        MigrateError::Sql { what, source } => MigrateError::Unit { what, source },
        other => other,
    }
}

/// How many sidecar migrations the database records (0 before the first).
/// Asked in two statements, never one that fails: inside `migrate`'s
/// transaction a failed statement would abort everything after it.
async fn applied_count(conn: &mut PgConnection) -> Result<usize, MigrateError> {
    let there: bool =
        sqlx::query_scalar("SELECT pg_catalog.to_regclass('lease_sweeper_migrations') IS NOT NULL")
            .fetch_one(&mut *conn)
            .await
            .map_err(sql_failed("looking for lease_sweeper_migrations"))?;
    if !there {
        return Ok(0);
    }
    let n: i64 = sqlx::query_scalar("SELECT pg_catalog.count(*) FROM lease_sweeper_migrations")
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_failed("counting the applied migrations"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Whether `lease_sweeper_sql` records `$1` with the SHA-256 of text `$2`;
/// and recording it so.
const RECORDED: &str = "SELECT s.sha256 = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($2, 'UTF8')), 'hex') \
     FROM lease_sweeper_sql AS s WHERE s.name = $1";
const RECORD: &str = "INSERT INTO lease_sweeper_sql AS s (name, sha256) \
     VALUES ($1, pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($2, 'UTF8')), 'hex')) \
     ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, applied_at = pg_catalog.now()";

/// Whether `name`'s recorded text is `text`.
async fn current(conn: &mut PgConnection, name: &str, text: &str) -> Result<bool, MigrateError> {
    let same: Option<bool> = sqlx::query_scalar(RECORDED)
        .bind(name)
        .bind(text)
        .fetch_optional(&mut *conn)
        .await
        .map_err(sql_failed(format!("reading the recorded text of {name}")))?;
    Ok(same == Some(true))
}

async fn record(conn: &mut PgConnection, name: &str, text: &str) -> Result<(), MigrateError> {
    sqlx::query(RECORD)
        .bind(name)
        .bind(text)
        .execute(&mut *conn)
        .await
        .map_err(sql_failed(format!("recording {name}")))?;
    Ok(())
}

/// Whether function `$1` is in the sidecar's schema with the text `$2` as
/// `lease_sweeper_sql` records it: a record whose function was dropped
/// since (by hand, or by a migration that changes its signature) is not.
const FUNCTION_CURRENT: &str = "SELECT s.sha256 = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to($2, 'UTF8')), 'hex') \
            AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p \
                         WHERE p.proname = s.name \
                           AND p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace) \
     FROM lease_sweeper_sql AS s WHERE s.name = $1";

/// The names `lease_sweeper_sql` records that are not in `$1` (the names
/// the binary keeps): what `sql::SIDECAR_FUNCTIONS` drops.
const UNSHIPPED: &str = "SELECT s.name FROM lease_sweeper_sql AS s \
     WHERE s.name <> ALL ($1::pg_catalog.text[]) ORDER BY s.name";

/// Hands `sql::SIDECAR_FUNCTIONS` the names it keeps, for this transaction
/// (none: `remove`).
const KEEP: &str = "SELECT pg_catalog.set_config('lease_sweeper.kept', $1, true)";

/// What the function step did.
struct FunctionsApplied {
    applied: usize,
    dropped: Vec<String>,
}

/// In the caller's transaction: applies each shipped function whose text
/// differs from the recorded one or which is missing, then drops the
/// recorded functions the binary no longer ships (all their overloads) and
/// pins the definers' search path (`sql::SIDECAR_FUNCTIONS`). CREATE OR
/// REPLACE keeps a function's grants and callers; no table lock.
async fn apply_functions(conn: &mut PgConnection) -> Result<FunctionsApplied, MigrateError> {
    let kept: Vec<&str> = sql::FUNCTIONS
        .iter()
        .map(|(name, _)| *name)
        .chain([HOOKS])
        .chain(sql::RETIRED.iter().copied())
        .collect();
    let dropped: Vec<String> = sqlx::query_scalar(UNSHIPPED)
        .bind(&kept)
        .fetch_all(&mut *conn)
        .await
        .map_err(sql_failed(
            "reading which recorded functions are no longer shipped",
        ))?;
    let mut applied = 0;
    for (name, text) in sql::FUNCTIONS {
        let same: Option<bool> = sqlx::query_scalar(FUNCTION_CURRENT)
            .bind(name)
            .bind(text)
            .fetch_optional(&mut *conn)
            .await
            .map_err(sql_failed(format!("reading the recorded text of {name}")))?;
        if same == Some(true) {
            continue;
        }
        sqlx::raw_sql(*text)
            .execute(&mut *conn)
            .await
            .map_err(sql_failed(format!("applying sql/functions/{name}.sql")))?;
        record(conn, name, text).await?;
        applied += 1;
    }
    sqlx::query(KEEP)
        .bind(kept.join(","))
        .execute(&mut *conn)
        .await
        .map_err(sql_failed("naming the functions kept"))?;
    let what = if dropped.is_empty() {
        "applying sql/sidecar_functions.sql (pinning the search path)".to_owned()
    } else {
        format!(
            "applying sql/sidecar_functions.sql (dropping the functions no longer shipped: {})",
            dropped.join(", ")
        )
    };
    raw(conn, sql::SIDECAR_FUNCTIONS, &what).await?;
    Ok(FunctionsApplied { applied, dropped })
}

/// The name `lease_sweeper_sql` records the triggers' text under.
const HOOKS: &str = "lock_entry_hooks";

/// Creates or replaces the triggers on `lock_entry` when their text changed
/// or one is missing (`both` there or not); how many tries its lock took.
async fn apply_hooks(conn: &mut PgConnection, both: bool) -> Result<Option<u32>, MigrateError> {
    if both && current(conn, HOOKS, sql::LOCK_ENTRY_HOOKS).await? {
        return Ok(None);
    }
    let tries = with_short_lock(conn, "adding the triggers to lock_entry", async |tx| {
        sqlx::raw_sql(sql::LOCK_ENTRY_HOOKS)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
    .await?;
    record(conn, HOOKS, sql::LOCK_ENTRY_HOOKS).await?;
    Ok(Some(tries))
}

/// Runs `body` in a transaction whose lock waits last at most
/// `LOCK_TIMEOUT`, trying again after `LOCK_RETRY_PAUSE` when a lock was
/// not had (SQLSTATE 55P03), up to `LOCK_TRIES` times; how many tries it
/// took.
pub async fn with_short_lock(
    conn: &mut PgConnection,
    what: &'static str,
    body: impl AsyncFn(&mut sqlx::Transaction<'_, sqlx::Postgres>) -> Result<(), sqlx::Error>,
) -> Result<u32, MigrateError> {
    for attempt in 1..=LOCK_TRIES {
        let mut tx = conn.begin().await.map_err(sql_failed("BEGIN"))?;
        sqlx::raw_sql(concat!("SET LOCAL lock_timeout = '", lock_timeout!(), "'"))
            .execute(&mut *tx)
            .await
            .map_err(sql_failed("SET LOCAL lock_timeout"))?;
        match body(&mut tx).await {
            Ok(()) => {
                tx.commit().await.map_err(sql_failed("COMMIT"))?;
                return Ok(attempt);
            }
            Err(e) if is_lock_timeout(&e) => {
                drop(tx);
                tokio::time::sleep(LOCK_RETRY_PAUSE).await;
            }
            Err(e) => {
                return Err(MigrateError::Sql {
                    what: what.to_owned(),
                    source: e,
                });
            }
        }
    }
    Err(MigrateError::Busy {
        what,
        tries: LOCK_TRIES,
    })
}

fn is_lock_timeout(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "55P03")
}

/// Builds `lock_entry_expiry_idx`, called when no valid index leads with
/// `expires_at`: CONCURRENTLY, so the lock server's writes go on (it waits
/// for transactions already running on the table, and blocks none). An
/// invalid one left by an interrupted build is dropped first.
async fn build_expiry_index(conn: &mut PgConnection) -> Result<(), MigrateError> {
    raw(
        conn,
        "DROP INDEX CONCURRENTLY IF EXISTS lock_entry_expiry_idx",
        "dropping an invalid lock_entry_expiry_idx",
    )
    .await?;
    raw(
        conn,
        "CREATE INDEX CONCURRENTLY lock_entry_expiry_idx ON lock_entry (expires_at)",
        "building lock_entry_expiry_idx",
    )
    .await?;
    raw(
        conn,
        concat!(
            "COMMENT ON INDEX lock_entry_expiry_idx IS '",
            built_index_comment!(),
            "'"
        ),
        "commenting lock_entry_expiry_idx",
    )
    .await
}

async fn raw(conn: &mut PgConnection, sql: &'static str, what: &str) -> Result<(), MigrateError> {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .map_err(sql_failed(what))?;
    Ok(())
}

/// What one `remove` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The sidecar was taken out, after this many tries for `lock_entry`'s
    /// lock.
    Removed { tries: u32 },
    /// It was not installed (no `lease_sweeper_sql` table): nothing to do,
    /// as after a `remove` that already ran.
    NotInstalled,
}

/// Where the sidecar is installed: the schema of its `lease_sweeper_sql`,
/// the first on the search path when there are several.
const INSTALLED_SCHEMA: &str = "SELECT n.nspname::pg_catalog.text FROM pg_catalog.pg_class AS c \
       JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
      WHERE c.relname = 'lease_sweeper_sql' AND c.relkind = 'r' \
      ORDER BY pg_catalog.array_position(pg_catalog.current_schemas(false), n.nspname) LIMIT 1";

/// What `remove` drops last, once `sql::SIDECAR_FUNCTIONS`, keeping
/// nothing, has dropped every function the database records: that record,
/// and the row type an earlier build's function returned (so no function
/// is left that depends on it).
const REMOVE_LAST: &str = "DROP TABLE lease_sweeper_sql; DROP TYPE lock_reaped_lease";

/// Takes the sidecar out (`sql/remove.sql`, then every function the
/// database records with `sql::SIDECAR_FUNCTIONS`, then `REMOVE_LAST`),
/// holding `MIGRATE_LOCK_KEY` (`waiting` as for
/// `migrate_saying_when_waiting`), in one transaction with a short lock
/// wait, tried again while the lock server holds `lock_entry`. Refuses,
/// changing nothing, while an expiry waits to be reported. Where the
/// sidecar is not installed it does nothing and says so, so a second
/// `remove` (or two at once) succeeds.
pub async fn remove(
    conn: &mut PgConnection,
    waiting: impl FnOnce(&str),
) -> Result<Removed, MigrateError> {
    under_migrate_lock(conn, waiting, remove_locked).await
}

async fn remove_locked(conn: &mut PgConnection) -> Result<Removed, MigrateError> {
    let installed: Option<String> = sqlx::query_scalar(INSTALLED_SCHEMA)
        .fetch_optional(&mut *conn)
        .await
        .map_err(sql_failed("looking for the sidecar"))?;
    let Some(schema) = installed else {
        return Ok(Removed::NotInstalled);
    };
    sqlx::query("SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident($1), false)")
        .bind(&schema)
        .execute(&mut *conn)
        .await
        .map_err(sql_failed("setting the search path"))?;
    with_short_lock(conn, "removing the sidecar", async |tx| {
        sqlx::raw_sql(sql::REMOVE).execute(&mut **tx).await?;
        sqlx::query(KEEP).bind("").execute(&mut **tx).await?;
        sqlx::raw_sql(sql::SIDECAR_FUNCTIONS)
            .execute(&mut **tx)
            .await?;
        sqlx::raw_sql(REMOVE_LAST).execute(&mut **tx).await?;
        Ok(())
    })
    .await
    .map(|tries| Removed::Removed { tries })
    .map_err(|e| match e {
        MigrateError::Sql { source, .. }
            if source
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "55000") =>
        {
            MigrateError::Refused(
                source
                    .as_database_error()
                    .map(|d| d.message().to_owned())
                    .unwrap_or_default(),
            )
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each migration as it first landed: the start of its SHA-384, the
    /// checksum sqlx stores when it applies it. A database that applied a
    /// migration refuses a binary whose copy of it differs, so a landed
    /// migration is never edited (a change is a new migration); a new one
    /// adds its line here.
    const LANDED: &[(i64, &str)] = &[(20261207000200, "a070a1aef2c8aca3")];

    #[test]
    fn landed_migrations_are_never_edited() {
        let bundled: Vec<(i64, String)> = MIGRATOR
            .iter()
            .map(|m| {
                let hex: String = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
                (m.version, hex[..16].to_owned())
            })
            .collect();
        let landed: Vec<(i64, String)> = LANDED.iter().map(|&(v, h)| (v, h.to_owned())).collect();
        assert_eq!(bundled, landed);
    }

    #[test]
    fn the_history_is_the_sidecars_own() {
        assert_eq!(MIGRATOR.table_name, MIGRATIONS_TABLE);
    }

    /// `remove` drops the index only by this comment (sql/remove.sql).
    #[test]
    fn remove_knows_the_built_index_by_its_comment() {
        assert!(crate::pg::sql::REMOVE.contains(&format!("'{BUILT_INDEX_COMMENT}'")));
    }
}
