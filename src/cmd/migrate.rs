//! `lease-sweeper migrate` and `lease-sweeper remove`: install the sidecar
//! into the lock server's database (adopting its tables), or take it out.
//!
//! Owns reporting what was done and where, without a secret; what runs and
//! in which order is `pg::migrate`'s.

use anyhow::Context as _;
use tracing::info;

use crate::config::DbTarget;
use crate::pg::migrate::{Installed, Origin, Removed};

pub async fn run() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let mut conn = crate::pg::conn::connect(&db).await?;
    let installed = crate::pg::migrate::migrate_saying_when_waiting(&mut conn, waiting)
        .await
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&what_failed(&e))))
        .with_context(|| format!("migrating {}", db.display()))?;
    log_installed(db.display(), &installed);
    Ok(())
}

/// The line saying this run waits for another `migrate` or `remove` (on
/// another host) to finish, and whose session that is.
fn waiting(holder: &str) {
    info!(holder, "waiting_for_another_migrate");
}

/// The `migrated` line: where, whose tables, and what this run changed.
pub fn log_installed(database: &str, done: &Installed) {
    let origin = |o: Origin| match o {
        Origin::Adopted => "adopted",
        Origin::Created => "created",
        Origin::Absent => "absent",
    };
    info!(
        database,
        schema = %done.schema,
        lockServer = origin(done.lock_server),
        jobQueue = origin(done.job_queue),
        migrationsApplied = done.migrations_applied,
        functionsApplied = done.functions_applied,
        functionsDropped = %done.functions_dropped.join(","),
        triggersApplied = done.hooks_tries.is_some(),
        lockTries = done.hooks_tries.unwrap_or(0),
        indexBuilt = done.index_built,
        "migrated"
    );
    if done.job_queue == Origin::Absent {
        info!(
            database,
            schema = %done.schema,
            reason = NO_JOB_QUEUE,
            "job_reaper_idle"
        );
    }
}

/// Why the job reaper idles beside a lock server without a job queue, as
/// `migrate` says it.
const NO_JOB_QUEUE: &str = "no job_queue in the lock server's schema, and migrate creates the \
     stand-in queue only in an empty database; the reaper idles, and lease-sweeper migrate \
     adopts a job queue once one exists there";

pub async fn remove() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let mut conn = crate::pg::conn::connect(&db).await?;
    let removed = crate::pg::migrate::remove(&mut conn, waiting)
        .await
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&what_failed(&e))))
        .with_context(|| format!("removing the sidecar from {}", db.display()))?;
    match removed {
        Removed::Removed { tries } => {
            info!(database = db.display(), lockTries = tries, "removed");
        }
        Removed::NotInstalled => info!(
            database = db.display(),
            note = "the sidecar is not installed in this database (no lease_sweeper_sql table): nothing to remove",
            "not_installed"
        ),
    }
    Ok(())
}

/// A failure in the operator's words: a failed versioned migration by its
/// version, with the server's words and what it leaves behind (the
/// migrations and the functions run in one transaction, so a failure there
/// changed none of them: the database keeps what the daemons call).
fn what_failed(err: &crate::pg::migrate::MigrateError) -> String {
    use crate::pg::migrate::{MIGRATOR, MigrateError};
    match err {
        MigrateError::Migration(sqlx::migrate::MigrateError::ExecuteMigration(source, version)) => {
            let description = MIGRATOR
                .iter()
                .find(|m| m.version == *version)
                .map_or(String::new(), |m| format!(" ({})", m.description));
            format!(
                "migration {version}{description} failed: {}; this run's stand-ins, versioned \
                 migrations and functions were rolled back together, so the database keeps the \
                 functions the daemons call; fix that, then run lease-sweeper migrate again",
                crate::pg::conn::describe(source)
            )
        }
        MigrateError::Unit { what, source } => format!(
            "{what} failed: {}; this run's stand-ins, versioned migrations and functions were \
             rolled back together, so the database keeps the functions the daemons call; fix \
             that, then run lease-sweeper migrate again",
            crate::pg::conn::describe(source)
        ),
        MigrateError::Sql { what, source } => format!(
            "{what} failed and was rolled back: {}; fix that, then run the command again",
            crate::pg::conn::describe(source)
        ),
        other => other.to_string(),
    }
}
