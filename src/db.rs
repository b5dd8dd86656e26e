//! One managed connection to the lock database, and the bundled migrations.
//!
//! Owns connecting (with a bounded timeout and the session settings the
//! sweeper relies on), dropping a connection after any error so the next call
//! reconnects by itself, and describing failures with their real cause instead
//! of a pool's "timed out". It owns no SQL besides the migrations.
//!
//! A pool is not used on purpose: the sweeper does one thing at a time, and a
//! pool hides a refused connection behind `PoolTimedOut` after 30 s.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use crate::config::DbTarget;
use crate::store::StoreError;

/// How long one connection attempt may take before the sweep reports it and
/// moves on; well under the 1-second rhythm times the drain bound.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Server-side guard for any one statement: a wedged query is cancelled by
/// PostgreSQL and reported as an error instead of stopping the sweep loop.
const STATEMENT_TIMEOUT_MS: &str = "30000";

/// A transaction left open (say, stdout blocked while lines are written) is
/// ended by the server, releasing its row locks for other replicas.
const IDLE_IN_TRANSACTION_TIMEOUT_MS: &str = "60000";

/// The schema this binary needs, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A lazily opened connection that reconnects after failures.
pub struct Db {
    target: DbTarget,
    conn: Option<PgConnection>,
}

impl Db {
    pub fn new(target: DbTarget) -> Self {
        Self { target, conn: None }
    }

    /// The open connection, connecting first if there is none.
    pub async fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.conn.is_none() {
            self.conn = Some(connect(&self.target).await?);
        }
        Ok(self.conn.as_mut().expect("connection was just set"))
    }

    /// Forgets the connection after an error: the next call opens a new one.
    /// Cheaper than telling a broken socket from a failed statement.
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// Turns a failed batch (see `BatchFailure`) into a `StoreError` and drops
    /// the connection.
    pub fn batch_failed(&mut self, failure: BatchFailure) -> StoreError {
        match failure {
            BatchFailure::Query(query, err) => self.query_failed(query, err),
            BatchFailure::Decode(query, cause) => {
                self.reset();
                StoreError::Query { query, cause }
            }
            BatchFailure::Report(err) => {
                self.reset();
                StoreError::Report(err)
            }
        }
    }

    /// Turns a query error into a `StoreError`, scrubbed of secrets, and
    /// drops the connection.
    pub fn query_failed(&mut self, query: &'static str, err: sqlx::Error) -> StoreError {
        self.reset();
        StoreError::Query {
            query,
            cause: self.target.redactor().redact(&describe(&err)),
        }
    }
}

/// Why a batch did not commit, in the order it can happen: a statement
/// failed, its answer could not be decoded, or its lines could not be
/// written. Every case drops the transaction, which rolls the batch back, so
/// what it would have deleted stays for the next pass (at least once).
pub enum BatchFailure {
    Query(&'static str, sqlx::Error),
    Decode(&'static str, String),
    Report(std::io::Error),
}

/// Opens one connection with the sweeper's session settings.
pub async fn connect(target: &DbTarget) -> Result<PgConnection, StoreError> {
    let options = target.options().clone().options([
        ("statement_timeout", STATEMENT_TIMEOUT_MS),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT_MS,
        ),
    ]);
    let failed = |cause: String| StoreError::Connect {
        target: target.display().to_owned(),
        cause: target.redactor().redact(&cause),
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(failed(describe(&e))),
        Err(_) => Err(failed(format!(
            "no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

/// Applies the bundled migrations; safe to run again and from several
/// replicas at once (sqlx takes an advisory lock).
///
/// Refuses first when a schema on the search path holds a function or
/// operator named like a built-in and owned by a role that is neither a
/// superuser nor the migrating role (`PLANTED_OVERLOADS`): such an overload
/// can be a better match than the built-in and would run with the migrating
/// role's rights inside a migration (CVE-2018-1058; an early migration calls
/// `format(…, current_schema())`, which an exact-typed `format(text, name)`
/// beats). Function bodies are not validated at creation
/// (`check_function_bodies = off`, as pg_dump restores do), so the schema
/// can be installed into a schema other than `public`: the last migration
/// re-pins every definer's search_path to that schema.
pub async fn migrate(conn: &mut PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    let planted: Option<String> = sqlx::query_scalar(PLANTED_OVERLOADS)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(planted) = planted {
        return Err(sqlx::migrate::MigrateError::Source(
            format!(
                "refusing to migrate: {planted}; each shares a name with a PostgreSQL built-in, so it can be chosen \
                 instead of the built-in and would run with this role's rights during the migration (CVE-2018-1058). \
                 Have it dropped (DROP FUNCTION / DROP OPERATOR as named), run REVOKE CREATE ON SCHEMA public FROM PUBLIC, \
                 then run lease-sweeper migrate again"
            )
            .into(),
        ));
    }
    sqlx::raw_sql("SET check_function_bodies = off")
        .execute(&mut *conn)
        .await?;
    let result = MIGRATOR.run(&mut *conn).await;
    sqlx::raw_sql("RESET check_function_bodies")
        .execute(&mut *conn)
        .await?;
    result
}

/// Functions and operators on the search path, outside pg_catalog, that
/// share a name with a built-in and are owned by a role that is neither a
/// superuser nor the current one; NULL when there is none. Every name here
/// is qualified and every operand exactly typed, so nothing it finds can
/// run while it looks.
pub const PLANTED_OVERLOADS: &str = "
SELECT pg_catalog.string_agg(x.what, '; ' ORDER BY x.what)
  FROM (SELECT pg_catalog.format('function %I.%I(%s) owned by %I', n.nspname, p.proname,
                                 pg_catalog.pg_get_function_identity_arguments(p.oid),
                                 pg_catalog.pg_get_userbyid(p.proowner)) AS what
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
          JOIN pg_catalog.pg_roles AS o ON o.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
           AND n.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name
           AND NOT o.rolsuper
           AND o.rolname OPERATOR(pg_catalog.<>) CURRENT_USER
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS b
                        WHERE b.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid
                          AND b.proname OPERATOR(pg_catalog.=) p.proname)
        UNION ALL
        SELECT pg_catalog.format('operator %I.%s(%s, %s) owned by %I', n.nspname, op.oprname,
                                 pg_catalog.format_type(op.oprleft, NULL), pg_catalog.format_type(op.oprright, NULL),
                                 pg_catalog.pg_get_userbyid(op.oprowner))
          FROM pg_catalog.pg_operator AS op
          JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) op.oprnamespace
          JOIN pg_catalog.pg_roles AS o ON o.oid OPERATOR(pg_catalog.=) op.oprowner
         WHERE n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
           AND n.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name
           AND NOT o.rolsuper
           AND o.rolname OPERATOR(pg_catalog.<>) CURRENT_USER
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_operator AS b
                        WHERE b.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid
                          AND b.oprname OPERATOR(pg_catalog.=) op.oprname)) AS x";

/// A one-line description of a database error with its underlying cause
/// (sqlx's Display alone often says only "error communicating with database").
pub fn describe(err: &sqlx::Error) -> String {
    if let sqlx::Error::Database(db) = err {
        return describe_server_error(db.as_ref());
    }
    let mut msg = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = cause.source();
    }
    msg
}

/// The server's own words: message, detail, hint and SQLSTATE (not sqlx's
/// Display, which appends PostgreSQL's internal source position).
fn describe_server_error(db: &dyn sqlx::error::DatabaseError) -> String {
    let mut msg = db.message().to_owned();
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        if let Some(detail) = pg.detail() {
            msg.push_str(&format!(" ({detail})"));
        }
        if let Some(hint) = pg.hint() {
            msg.push_str(&format!("; hint: {hint}"));
        }
    }
    if let Some(code) = db.code() {
        msg.push_str(&format!(" (SQLSTATE {code})"));
        // undefined_table / undefined_function: the schema is not there.
        if code == "42P01" || code == "42883" {
            msg.push_str("; is the schema migrated? run `lease-sweeper migrate`");
        }
    }
    msg
}
