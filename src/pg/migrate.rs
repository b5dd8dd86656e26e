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

/// Whose tables the sidecar sweeps: adopted, or created from its stand-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// They were there; the sidecar added only its own objects.
    Adopted,
    /// There were none; `migrate` created the stand-in.
    Created,
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
    /// Function files applied because their text changed (or was new).
    pub functions_applied: usize,
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
/// hosts at once (a session advisory lock serialises the versioned part:
/// run it directly against PostgreSQL or through a session-mode pool, never
/// through PgBouncer in transaction mode). Run by the lock server's tables'
/// owner or a superuser where they exist (docs/adopting.md).
///
/// Refuses first when a schema on the search path holds a function or
/// operator named like a built-in and owned by a role that is neither a
/// superuser nor the migrating role (`PLANTED_OVERLOADS`), which would run
/// with the migrating role's rights (CVE-2018-1058). Function bodies are not
/// validated at creation (`check_function_bodies = off`, as pg_dump restores
/// do), so their order does not matter.
pub async fn migrate(conn: &mut PgConnection) -> Result<Installed, MigrateError> {
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
        fits("job_queue", found, adopt::job_queue_misfits(found))?;
        for piece in JOB_PIECES {
            let there: bool = sqlx::query_scalar(piece.exists)
                .fetch_one(&mut *conn)
                .await
                .map_err(sql_failed(format!("looking for {}", piece.name)))?;
            if !there {
                return Err(MigrateError::JobPieceMissing(piece.name));
            }
        }
    }
    Ok(())
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

/// What the reaper needs of a job queue besides `job_queue`.
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
        name: "the table job_kind_lease (lease durations per kind, which the dry run reports)",
        exists: "SELECT pg_catalog.to_regclass('job_kind_lease') IS NOT NULL",
    },
    Piece {
        name: "the function fn_job_move_to_dead_letter(uuid, text, text)",
        exists: "SELECT pg_catalog.to_regprocedure('fn_job_move_to_dead_letter(uuid, text, text)') IS NOT NULL",
    },
];

async fn install(
    conn: &mut PgConnection,
    lock_server_there: bool,
    job_queue_there: bool,
) -> Result<Installed, MigrateError> {
    if !lock_server_there {
        in_one_tx(
            conn,
            sql::LOCK_SERVER,
            "creating the stand-in lock server (sql/lock_server.sql)",
        )
        .await?;
    }
    if !job_queue_there {
        in_one_tx(
            conn,
            sql::JOB_SUBSTRATE,
            "creating the stand-in job queue (sql/job_substrate.sql)",
        )
        .await?;
    }
    let schema: String = sqlx::query_scalar("SELECT pg_catalog.current_schema()::pg_catalog.text")
        .fetch_one(&mut *conn)
        .await
        .map_err(sql_failed("reading the current schema"))?;
    let before = applied_count(conn).await;
    MIGRATOR.run(&mut *conn).await?;
    let migrations_applied = applied_count(conn).await.saturating_sub(before);
    let functions_applied = apply_functions(conn).await?;
    // What `check` reads too: whether both triggers and a deadline index
    // are there.
    let found = crate::pg::catalog::adoption(conn)
        .await
        .map_err(sql_failed("looking at lock_entry's triggers and indexes"))?;
    let hooks_tries = apply_hooks(conn, found.triggers == 2).await?;
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
        } else {
            Origin::Created
        },
        migrations_applied,
        functions_applied,
        hooks_tries,
        index_built,
    })
}

/// How many sidecar migrations the database records (0 before the first).
async fn applied_count(conn: &mut PgConnection) -> usize {
    sqlx::query_scalar::<_, i64>(
        "SELECT CASE WHEN pg_catalog.to_regclass('lease_sweeper_migrations') IS NULL THEN 0 \
         ELSE (SELECT pg_catalog.count(*) FROM lease_sweeper_migrations) END",
    )
    .fetch_one(&mut *conn)
    .await
    .map_or(0, |n| usize::try_from(n).unwrap_or(0))
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

/// Applies, in one transaction, each function file whose text differs from
/// the one the database recorded, then pins the definers' search path.
/// CREATE OR REPLACE keeps a function's grants and callers; no table lock.
async fn apply_functions(conn: &mut PgConnection) -> Result<usize, MigrateError> {
    let mut tx = conn.begin().await.map_err(sql_failed("BEGIN"))?;
    let mut applied = 0;
    for (name, text) in sql::FUNCTIONS {
        if current(&mut tx, name, text).await? {
            continue;
        }
        sqlx::raw_sql(*text)
            .execute(&mut *tx)
            .await
            .map_err(sql_failed(format!("sql/functions/{name}.sql")))?;
        record(&mut tx, name, text).await?;
        applied += 1;
    }
    sqlx::raw_sql(sql::PIN_SEARCH_PATH)
        .execute(&mut *tx)
        .await
        .map_err(sql_failed("sql/pin_search_path.sql"))?;
    tx.commit().await.map_err(sql_failed("COMMIT"))?;
    Ok(applied)
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

async fn in_one_tx(
    conn: &mut PgConnection,
    sql: &'static str,
    what: &str,
) -> Result<(), MigrateError> {
    let mut tx = conn.begin().await.map_err(sql_failed("BEGIN"))?;
    sqlx::raw_sql(sql)
        .execute(&mut *tx)
        .await
        .map_err(sql_failed(what))?;
    tx.commit().await.map_err(sql_failed("COMMIT"))
}

/// Takes the sidecar out (`sql/remove.sql`), in one transaction with a short
/// lock wait, tried again while the lock server holds `lock_entry`. Refuses,
/// changing nothing, while an expiry waits to be reported, or where the
/// sidecar is not installed.
pub async fn remove(conn: &mut PgConnection) -> Result<u32, MigrateError> {
    let installed: Option<String> = sqlx::query_scalar(
        "SELECT n.nspname::pg_catalog.text FROM pg_catalog.pg_class AS c \
           JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
          WHERE c.relname = 'lease_sweeper_sql' AND c.relkind = 'r' \
          ORDER BY pg_catalog.array_position(pg_catalog.current_schemas(false), n.nspname) LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(sql_failed("looking for the sidecar"))?;
    let Some(schema) = installed else {
        return Err(MigrateError::Refused(
            "the sidecar is not installed in this database (no lease_sweeper_sql table): nothing to remove"
                .to_owned(),
        ));
    };
    sqlx::query("SELECT pg_catalog.set_config('search_path', pg_catalog.quote_ident($1), false)")
        .bind(&schema)
        .execute(&mut *conn)
        .await
        .map_err(sql_failed("setting the search path"))?;
    with_short_lock(conn, "removing the sidecar", async |tx| {
        sqlx::raw_sql(sql::REMOVE).execute(&mut **tx).await?;
        Ok(())
    })
    .await
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
    const LANDED: &[(i64, &str)] = &[(20261207000100, "775d437765c5df49")];

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
