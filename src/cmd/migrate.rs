//! `lease-sweeper migrate` and `lease-sweeper remove`: install the sidecar
//! into the lock server's database (adopting its tables), or take it out.
//!
//! Owns reporting what was done and where, without a secret; what runs and
//! in which order is `pg::migrate`'s.

use anyhow::Context as _;
use tracing::info;

use crate::config::DbTarget;
use crate::pg::migrate::{Installed, Origin};

pub async fn run() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let mut conn = crate::pg::conn::connect(&db).await?;
    let installed = crate::pg::migrate::migrate(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&what_failed(&e))))
        .with_context(|| format!("migrating {}", db.display()))?;
    log_installed(db.display(), &installed);
    Ok(())
}

/// The `migrated` line: where, whose tables, and what this run changed.
pub fn log_installed(database: &str, done: &Installed) {
    let origin = |o: Origin| match o {
        Origin::Adopted => "adopted",
        Origin::Created => "created",
    };
    info!(
        database,
        schema = %done.schema,
        lockServer = origin(done.lock_server),
        jobQueue = origin(done.job_queue),
        migrationsApplied = done.migrations_applied,
        functionsApplied = done.functions_applied,
        triggersApplied = done.hooks_tries.is_some(),
        lockTries = done.hooks_tries.unwrap_or(0),
        indexBuilt = done.index_built,
        "migrated"
    );
}

pub async fn remove() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let mut conn = crate::pg::conn::connect(&db).await?;
    let tries = crate::pg::migrate::remove(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&what_failed(&e))))
        .with_context(|| format!("removing the sidecar from {}", db.display()))?;
    info!(database = db.display(), lockTries = tries, "removed");
    Ok(())
}

/// A failure in the operator's words: a failed versioned migration by its
/// version, with the server's words and what it leaves behind (each runs in
/// one transaction, so it changed nothing and the ones before it stay).
fn what_failed(err: &crate::pg::migrate::MigrateError) -> String {
    use crate::pg::migrate::{MIGRATOR, MigrateError};
    match err {
        MigrateError::Migration(sqlx::migrate::MigrateError::ExecuteMigration(source, version)) => {
            let description = MIGRATOR
                .iter()
                .find(|m| m.version == *version)
                .map_or(String::new(), |m| format!(" ({})", m.description));
            format!(
                "migration {version}{description} failed and was rolled back, the ones before it \
                 stay applied: {}; fix that, then run lease-sweeper migrate again",
                crate::pg::conn::describe(source)
            )
        }
        MigrateError::Sql { what, source } => format!(
            "{what} failed and was rolled back: {}; fix that, then run the command again",
            crate::pg::conn::describe(source)
        ),
        other => other.to_string(),
    }
}
