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
        .map_err(|e| anyhow::anyhow!(db.redactor().redact(&e.to_string())))
        .with_context(|| format!("applying migrations to {}", db.display()))?;
    info!(
        database = db.display(),
        migrations = MIGRATOR.iter().count(),
        "migrated"
    );
    Ok(())
}
