//! One managed connection per service, and how database failures are told.
//!
//! Owns connecting (with a bounded timeout and the session settings the
//! services rely on), dropping a connection after any error so the next call
//! reconnects by itself, and describing failures with their real cause instead
//! of a pool's "timed out". It owns no SQL; the migrations are in `migrate`.
//!
//! A pool is not used on purpose: each service does one thing at a time on
//! its own connection, and a pool hides a refused connection behind
//! `PoolTimedOut` after 30 s.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection, Postgres, Transaction};

use crate::config::DbTarget;
use crate::store::{Report, StoreError, Work};

/// How long one connection attempt may take before the sweep reports it and
/// moves on; well under the 1-second rhythm times the drain bound.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Server-side guard for any one statement: a wedged query is cancelled by
/// PostgreSQL and reported as an error instead of stopping the sweep loop.
const STATEMENT_TIMEOUT_MS: &str = "30000";

/// A transaction left open (say, stdout blocked while lines are written) is
/// ended by the server, releasing its row locks for other replicas.
const IDLE_IN_TRANSACTION_TIMEOUT_MS: &str = "60000";

/// A lazily opened connection that reconnects after failures; its errors
/// name the `work` it does.
pub struct Db {
    target: DbTarget,
    work: Work,
    conn: Option<PgConnection>,
}

impl Db {
    pub fn new(target: DbTarget, work: Work) -> Self {
        Self {
            target,
            work,
            conn: None,
        }
    }

    /// The open connection, connecting first if there is none.
    pub async fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.conn.is_none() {
            let conn = connect(&self.target)
                .await
                .map_err(|e| e.for_work(self.work))?;
            self.conn = Some(conn);
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
                StoreError::Decode {
                    work: self.work,
                    query,
                    cause,
                }
            }
            BatchFailure::Report(source) => {
                self.reset();
                StoreError::Report {
                    work: self.work,
                    source,
                }
            }
        }
    }

    /// Turns a query error into a `StoreError`, scrubbed of secrets, and
    /// drops the connection.
    pub fn query_failed(&mut self, query: &'static str, err: sqlx::Error) -> StoreError {
        self.reset();
        StoreError::Query {
            work: self.work,
            query,
            cause: self.target.redactor().redact(&describe(&err)),
            source: Some(Box::new(err)),
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

/// Opens a batch's transaction.
pub async fn begin(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, BatchFailure> {
    conn.begin()
        .await
        .map_err(|e| BatchFailure::Query("BEGIN", e))
}

/// Reports a batch's rows (their lines written and flushed) and only then
/// commits: the order that makes "at least once, never lost". A failed report
/// drops the transaction, which rolls the batch back.
pub async fn report_then_commit<T>(
    tx: Transaction<'_, Postgres>,
    rows: &[T],
    report: Report<'_, T>,
) -> Result<(), BatchFailure> {
    if !rows.is_empty() {
        report(rows).map_err(BatchFailure::Report)?;
    }
    tx.commit()
        .await
        .map_err(|e| BatchFailure::Query("COMMIT", e))
}

/// A connection that could not be opened: where to, and why (no secret).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {target}: {cause} (is the server up, and does LOCKDB_URL name it?)")]
pub struct ConnectError {
    target: String,
    cause: String,
    #[source]
    source: Option<sqlx::Error>,
}

impl ConnectError {
    /// Why it failed, without the target or advice (for callers that say
    /// those themselves, like `check`).
    pub fn cause(&self) -> &str {
        &self.cause
    }

    /// The same failure as a service's store error.
    pub fn for_work(self, work: Work) -> StoreError {
        StoreError::Connect {
            work,
            target: self.target,
            cause: self.cause,
            source: self.source.map(|e| Box::new(e) as _),
        }
    }
}

/// Opens one connection with the services' session settings.
pub async fn connect(target: &DbTarget) -> Result<PgConnection, ConnectError> {
    let options = target.options().clone().options([
        ("statement_timeout", STATEMENT_TIMEOUT_MS),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT_MS,
        ),
    ]);
    let failed = |cause: String, source: Option<sqlx::Error>| ConnectError {
        target: target.display().to_owned(),
        cause: target.redactor().redact(&cause),
        source,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(failed(describe(&e), Some(e))),
        Err(_) => Err(failed(
            format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            None,
        )),
    }
}

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
