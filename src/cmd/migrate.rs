//! `lease-sweeper migrate`: apply the bundled migrations once.
//!
//! Owns reporting what was applied and where, without a secret; the schema
//! and the migrator are `pg::migrate`'s.

use anyhow::Context as _;
use tracing::info;

use crate::config::DbTarget;
use crate::pg::migrate::MIGRATOR;

pub async fn run() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let mut conn = crate::pg::conn::connect(&db).await?;
    crate::pg::migrate::migrate(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&what_failed(&e))))
        .with_context(|| format!("applying migrations to {}", db.display()))?;
    info!(
        database = db.display(),
        migrations = MIGRATOR.iter().count(),
        "migrated"
    );
    Ok(())
}

/// A failed migration named by its version and description, with the
/// server's words, and what it leaves behind: each migration runs in one
/// transaction, so the failed one changed nothing and the ones before it
/// stay applied.
fn what_failed(err: &sqlx::migrate::MigrateError) -> String {
    match err {
        sqlx::migrate::MigrateError::ExecuteMigration(source, version) => {
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
        other => other.to_string(),
    }
}
