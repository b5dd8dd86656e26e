//! LOGIN roles a test creates for its database (the daemon's least-privilege
//! role, a wrong password, TLS users), dropped afterwards.

use sqlx::{Connection as _, PgConnection};

use super::TestDb;

/// A LOGIN role for one test's database, and the URL that logs in as it.
/// Roles are cluster-wide: the name carries the database's.
pub struct LoginRole {
    pub role: String,
    pub url: String,
}

impl LoginRole {
    /// `CREATE ROLE <db>_<suffix> LOGIN <options>`. The throwaway cluster
    /// trusts local connections, so the URL carries no password (see the
    /// password test in `faults::hostile` for real authentication).
    pub async fn create(
        db: &TestDb,
        admin: &mut PgConnection,
        suffix: &str,
        options: &str,
    ) -> Self {
        Self::create_with(db, admin, suffix, None, options).await
    }

    /// The same with `PASSWORD '<password>'`, which the URL carries too.
    pub async fn with_password(
        db: &TestDb,
        admin: &mut PgConnection,
        suffix: &str,
        password: &str,
        options: &str,
    ) -> Self {
        Self::create_with(db, admin, suffix, Some(password), options).await
    }

    async fn create_with(
        db: &TestDb,
        admin: &mut PgConnection,
        suffix: &str,
        password: Option<&str>,
        options: &str,
    ) -> Self {
        let role = format!("{}_{suffix}", db.name);
        let pass = password.map_or(String::new(), |p| format!("PASSWORD '{p}'"));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE ROLE {role} LOGIN {pass} {options}"
        )))
        .execute(admin)
        .await
        .unwrap_or_else(|e| panic!("creating role {role}: {e}"));
        let mut url = url::Url::parse(&db.url).expect("test URL parses");
        url.set_username(&role).unwrap();
        url.set_password(password).unwrap();
        Self {
            role,
            url: url.to_string(),
        }
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connecting as {}: {e}", self.role))
    }

    /// Removes the role (and anything it owns or was granted) from this database.
    pub async fn drop(self, admin: &mut PgConnection) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP OWNED BY {0} CASCADE; DROP ROLE {0}",
            self.role
        )))
        .execute(admin)
        .await
        .unwrap_or_else(|e| panic!("dropping role {}: {e}", self.role));
    }
}
