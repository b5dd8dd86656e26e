//! The bundled schema (`migrations/`, embedded at build time) and applying it.
//!
//! Owns only the migrator; `cmd::migrate` reports what it did and the tests
//! migrate their throwaway databases through here.

use sqlx::PgConnection;

/// The schema this binary needs, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies the bundled migrations; safe to run again and from several
/// replicas at once (sqlx takes a session advisory lock, held across the
/// migrations' transactions: run it directly against PostgreSQL or through a
/// session-mode pool, never through PgBouncer in transaction mode).
pub async fn migrate(conn: &mut PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(conn).await
}
