//! A daemon's two connections (the lock sweep's own, and one the job reaper
//! and the horizon check take turns on), their transactions, and how
//! database failures are told. Owns connecting (the host walk of `pgconn`),
//! the guards every transaction sets (`BEGIN_GUARDED`), the order of a
//! batch's report and commit (`report_then_commit`, the one place it is
//! kept), dropping a connection after any error so the next call walks the
//! hosts again, and naming a failure's real cause. No SQL besides the
//! guards.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection, Postgres, Transaction};
use tracing::info;

use pgconn::{HostFailure, Role, WalkError};

use crate::config::DbTarget;
use crate::store::{Reporter, StoreError, Work};

// The two guards below are set with `SET LOCAL` at the start of every
// transaction (`BEGIN_GUARDED`), not as startup options or `SET`: behind
// PgBouncer in transaction mode a session setting stays on whichever server
// connection it was sent to, and PgBouncer 1.18 refuses the `options` startup
// parameter outright. They are macros so that the statement's text carries
// them as literals.

/// Server-side guard for any one statement, in ms: a wedged query is
/// cancelled by PostgreSQL and reported as an error instead of stopping the
/// sweep loop.
macro_rules! statement_timeout_ms {
    () => {
        30000
    };
}

/// Server-side guard for a transaction left idle, in ms (say, stdout blocked
/// while lines are written): the server ends it, releasing its row locks for
/// other replicas.
macro_rules! idle_in_transaction_timeout_ms {
    () => {
        60000
    };
}

/// How every transaction of the daemon starts: one simple-protocol round
/// trip that opens it and sets both guards for it alone.
pub const BEGIN_GUARDED: &str = concat!(
    "BEGIN; SET LOCAL statement_timeout = ",
    statement_timeout_ms!(),
    "; SET LOCAL idle_in_transaction_session_timeout = ",
    idle_in_transaction_timeout_ms!()
);

/// How long the daemon waits for an idle probe's answer (`probe_row`): the
/// same bound as `statement_timeout_ms!`, kept on the client side.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(statement_timeout_ms!());

/// A batch's limit as the reaping functions take it (`integer`): the one
/// place a batch size leaves `usize`. Saturates, so a limit above the
/// functions' maximum is refused by them, never wrapped into range.
pub fn limit_param(limit: usize) -> i32 {
    i32::try_from(limit).unwrap_or(i32::MAX)
}

/// Runs one idle probe: a read-only statement sent ALONE with the simple
/// query protocol (`sqlx::raw_sql`: one Query message, literal arguments
/// spliced at compile time by `concat!` from named constants, no binds), and
/// returns its one row. One round trip instead of `in_tx`'s four (BEGIN with
/// its guards, Parse/Describe, Bind/Execute, COMMIT): an idle pass costs
/// the server one statement per question (docs/performance.md, section 6).
///
/// Why this is as safe as `in_tx`:
/// - PgBouncer (transaction mode): the message is its own implicit
///   transaction, answered by one server connection up to its ReadyForQuery;
///   there is no Parse to lose between round trips and no prepared statement
///   to mix up (docs/decisions.md §12). Nothing is set for the session.
/// - No wedge without `SET LOCAL statement_timeout`: the probes take no
///   row lock that waits (`EXISTS`, plain reads, and the held-count row only
///   with `FOR UPDATE SKIP LOCKED`, so a recount in progress is skipped, never
///   waited for). The one wait left is a table's ACCESS SHARE lock behind an
///   ACCESS EXCLUSIVE one (DDL, `LOCK TABLE`); that wait, or a recount of a
///   huge table, is bounded here on the client side by `PROBE_TIMEOUT`
///   (30 s, as the server-side guard): the connection is dropped (which ends
///   the statement when the server next writes to it) and the pass fails with
///   an error naming the probe, so the loop moves on and the watchdog is fed.
///   The guard is not sent in the same message (`SET LOCAL
///   statement_timeout = …; SELECT …` would work, one implicit transaction):
///   an idle probe is one statement for the server, not two (what a second
///   one costs is in docs/performance.md, section 6).
///
/// Anything but exactly one row is an error, as `fetch_one`'s would be, not a
/// silent first row.
pub async fn probe_row(
    conn: &mut PgConnection,
    sql: &'static str,
) -> Result<sqlx::postgres::PgRow, sqlx::Error> {
    probe_row_within(conn, sql, PROBE_TIMEOUT).await
}

/// `probe_row` with its client-side bound given (tests use a short one).
pub async fn probe_row_within(
    conn: &mut PgConnection,
    sql: &'static str,
    within: Duration,
) -> Result<sqlx::postgres::PgRow, sqlx::Error> {
    let mut rows = match tokio::time::timeout(within, sqlx::raw_sql(sql).fetch_all(conn)).await {
        Ok(rows) => rows?,
        Err(_) => {
            return Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {} ms (waiting behind a table lock such as DDL's?); \
                     the connection is dropped and reopened",
                    within.as_millis()
                ),
            )));
        }
    };
    match rows.len() {
        1 => Ok(rows.pop().expect("one row")),
        0 => Err(sqlx::Error::RowNotFound),
        n => Err(sqlx::Error::Decode(
            format!("expected one row from the probe statement, got {n}").into(),
        )),
    }
}

/// The words for a server in recovery, whichever way it is met (the walk
/// passes it over, or a statement fails with SQLSTATE 25006).
pub const HOT_STANDBY: &str = "the server is a hot standby (in recovery): nothing is deleted; \
     sweeping resumes when it is promoted or when LOCKDB_URL names the primary";

/// A lazily opened connection that reconnects after failures.
/// Its errors name the `work` it does.
///
/// Not a pool, on purpose: a service does one thing at a time, and a pool
/// hides a refused connection behind `PoolTimedOut` after 30 s.
pub struct Db {
    /// Where to connect: every host of the walk, and the session it needs.
    target: DbTarget,
    /// Whose work the connection does, so a failure names it.
    work: Work,
    /// The open connection; `None` until the first call and after any
    /// failure, so the next call walks the hosts again.
    conn: Option<PgConnection>,
    /// The host of the last connection (index into the target's hosts), so a
    /// failover to another host is logged once.
    host: Option<usize>,
}

impl Db {
    pub fn new(target: DbTarget, work: Work) -> Self {
        Self {
            target,
            work,
            conn: None,
            host: None,
        }
    }

    /// The open connection, connecting first if there is none: a fresh walk
    /// over the target's hosts, so after a failover (connection lost, the
    /// server read-only or in recovery) the next writable host is found.
    pub async fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.conn.is_none() {
            let (conn, host) = connect_to(&self.target)
                .await
                .map_err(|e| e.for_work(self.work))?;
            if let Some(before) = self.host.filter(|b| *b != host) {
                let hosts = self.target.target().hosts();
                info!(
                    work = %self.work,
                    from = %hosts[before].display(),
                    to = %hosts[host].display(),
                    "database_host_changed"
                );
            }
            self.host = Some(host);
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("connection was just set"))
    }

    /// Forgets the connection after an error: the next call opens a new one.
    /// Cheaper than telling a broken socket from a failed statement.
    pub fn reset(&mut self) {
        self.conn = None;
    }

    /// Runs one batch's transactions (`body`) on the connection, connecting
    /// first if there is none; a failure becomes a `StoreError` and drops the
    /// connection (`batch_failed`).
    pub async fn batch<T>(
        &mut self,
        body: impl AsyncFnOnce(&mut PgConnection) -> Result<T, BatchFailure>,
    ) -> Result<T, StoreError> {
        let conn = self.conn().await?;
        match body(conn).await {
            Ok(done) => Ok(done),
            Err(failure) => Err(self.batch_failed(failure)),
        }
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

/// One connection that two services take turns on, each call naming the
/// work it does (so a failure says whose it was). The job reaper and the
/// horizon check share one: neither is the signal, and a daemon then holds
/// two connections at most, the lock sweep's own being the other, so a job
/// backlog or a slow catalog read never delays a lease's line.
#[derive(Clone)]
pub struct SharedDb(std::sync::Arc<tokio::sync::Mutex<Db>>);

impl SharedDb {
    pub fn new(target: DbTarget) -> Self {
        Self(std::sync::Arc::new(tokio::sync::Mutex::new(Db::new(
            target,
            Work::JobQueue,
        ))))
    }

    /// The connection, for `work`, once the other service is done with it.
    pub async fn lock(&self, work: Work) -> tokio::sync::MutexGuard<'_, Db> {
        let mut db = self.0.lock().await;
        db.work = work;
        db
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

/// A connection that could not be opened: where to, and why (no secret).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {target}: {cause} ({hint})")]
    Unreachable {
        target: String,
        cause: String,
        /// What to check, from the cause (`login_hint`).
        hint: &'static str,
    },
    /// Reachable, but no host is a server the sweeper may use (every one a
    /// hot standby, say): the cause is the whole message.
    #[error("{target}: {cause}")]
    Topology { target: String, cause: String },
}

impl ConnectError {
    /// Why it failed, without the target or advice (for callers that say
    /// those themselves, like `check`).
    pub fn cause(&self) -> &str {
        match self {
            ConnectError::Unreachable { cause, .. } | ConnectError::Topology { cause, .. } => cause,
        }
    }

    /// The same failure as a service's store error.
    pub fn for_work(self, work: Work) -> StoreError {
        match self {
            ConnectError::Unreachable {
                target,
                cause,
                hint,
            } => StoreError::Connect {
                work,
                target,
                cause,
                hint,
            },
            ConnectError::Topology { target, cause } => StoreError::Topology {
                work,
                target,
                cause,
            },
        }
    }
}

/// Opens one connection: the first host of the target with the session the
/// target asks for (read-write unless told otherwise).
pub async fn connect(target: &DbTarget) -> Result<PgConnection, ConnectError> {
    connect_to(target).await.map(|(conn, _)| conn)
}

/// `connect`, also saying which host (index into the target's hosts) it is.
pub async fn connect_to(target: &DbTarget) -> Result<(PgConnection, usize), ConnectError> {
    target
        .target()
        .connect(target.session_attrs())
        .await
        .map_err(|walk| walk_failed(target, &walk))
}

/// One message for a walk that found no usable host: each host's reason, in
/// walk order; the hot-standby words alone when every host is one.
fn walk_failed(target: &DbTarget, walk: &WalkError) -> ConnectError {
    let redact = |s: String| target.redactor().redact(&s);
    if walk.all_standby() {
        return ConnectError::Topology {
            target: target.display().to_owned(),
            cause: HOT_STANDBY.to_owned(),
        };
    }
    let reason = |failure: &HostFailure| match failure {
        HostFailure::Connect(e) => describe(e),
        HostFailure::Timeout(t) => format!("no answer within {} s", t.as_secs()),
        HostFailure::Role(Role::Standby) => {
            "a hot standby (in recovery), passed over for a writable server".to_owned()
        }
        HostFailure::Role(Role::ReadOnlyPrimary) => format!(
            "sessions are read-only (default_transaction_read_only), not {}",
            walk.attrs.as_str()
        ),
        HostFailure::Role(Role::Writable) => {
            format!("a writable primary, not {}", walk.attrs.as_str())
        }
    };
    let cause = match walk.attempts.as_slice() {
        [(_, only)] => reason(only),
        many => many
            .iter()
            .map(|(host, f)| format!("{host}: {}", reason(f)))
            .collect::<Vec<_>>()
            .join("; "),
    };
    ConnectError::Unreachable {
        target: target.display().to_owned(),
        cause: redact(cause),
        hint: login_hint(walk),
    }
}

/// What the operator should check, from why the hosts refused: a refused
/// password, role or database, or TLS, each say so; only when none of those
/// came back is it about reaching the server at all.
const CHECK_PASSWORD: &str = "check the password: the URL's, PGPASSWORD or ~/.pgpass (PGPASSFILE)";
const CHECK_ROLE: &str = "check the user name, and that pg_hba.conf lets it connect from this host";
const CHECK_DATABASE: &str = "check the database name (the URL's path or PGDATABASE): it must exist; `lease-sweeper migrate` creates the schema, not the database";
const CHECK_TLS: &str =
    "check TLS: sslmode, sslrootcert (the server's CA), and that the server has TLS on";
const CHECK_REACHABLE: &str = "is the server up, and do the host and port name it?";

fn login_hint(walk: &WalkError) -> &'static str {
    walk.attempts
        .iter()
        .find_map(|(_, failure)| match failure {
            HostFailure::Connect(sqlx::Error::Tls(_)) => Some(CHECK_TLS),
            HostFailure::Connect(sqlx::Error::Database(db)) => match db.code().as_deref() {
                Some("28P01") => Some(CHECK_PASSWORD),
                Some("28000") => Some(CHECK_ROLE),
                Some("3D000") => Some(CHECK_DATABASE),
                _ => None,
            },
            _ => None,
        })
        .unwrap_or(CHECK_REACHABLE)
}

/// Opens a batch's transaction, guarded like every other (`BEGIN_GUARDED`).
pub async fn begin(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, BatchFailure> {
    conn.begin_with(BEGIN_GUARDED)
        .await
        .map_err(|e| BatchFailure::Query("BEGIN", e))
}

/// The second half of every batch, the one place its order is kept: `tx`
/// has already retired the batch's last durable record (a hand-off claimed
/// or recovered, outbox rows or a job hand-off deleted; the record was
/// committed before, by the batch's first transaction or by the lock
/// server's own statement), and holds that deletion's row locks, so no other
/// sweeper can take the record meanwhile. The rows' lines are written and
/// flushed, and only then is the deletion committed: a crash or a failed
/// write before the commit leaves the record for a later pass (a line may be
/// written twice, never lost), and the `committed` call that lets the
/// reporter count them follows the commit. A failed report drops the
/// transaction, which rolls the deletion back.
pub async fn report_then_commit<T>(
    tx: Transaction<'_, Postgres>,
    rows: &[T],
    report: &mut dyn Reporter<T>,
) -> Result<(), BatchFailure> {
    report.lines(rows).map_err(BatchFailure::Report)?;
    commit(tx).await?;
    report.committed();
    Ok(())
}

/// The second transaction of a batch whose first one deleted its rows,
/// recorded them in hand-off `id` and committed: `claim` (a statement that
/// deletes the hand-off and returns whether it was still there; one per
/// hand-off table, each the same shape) takes it back, and only then are the
/// rows' lines written and the claim committed (`report_then_commit`). A
/// claim that finds nothing means another sweeper or reaper recovered the
/// hand-off (this one was slower than `signal_handoff_grace()`) and wrote
/// its lines: none here. `what` names the claim in a failure.
pub async fn claim_then_report<T>(
    conn: &mut PgConnection,
    claim: &'static str,
    what: &'static str,
    id: i64,
    rows: &[T],
    report: &mut dyn Reporter<T>,
) -> Result<(), BatchFailure> {
    let mut tx = begin(conn).await?;
    // The hand-off's row lock lasts until the commit, so no recoverer takes
    // it while the lines are written.
    let claimed: bool = sqlx::query_scalar(claim)
        .persistent(false)
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| BatchFailure::Query(what, e))?;
    if claimed {
        report_then_commit(tx, rows, report).await?;
    }
    Ok(())
}

/// Commits a batch's transaction: after its lines were written
/// (`report_then_commit`), or, for a batch the reaping call handed off, at
/// once, so the reaped rows' locks end before their lines are written.
pub async fn commit(tx: Transaction<'_, Postgres>) -> Result<(), BatchFailure> {
    tx.commit()
        .await
        .map_err(|e| BatchFailure::Query("COMMIT", e))
}

/// Runs `body` in one transaction opened with `BEGIN_GUARDED` and commits.
/// The daemon sends no extended-protocol statement outside a transaction:
/// behind PgBouncer in transaction mode, a statement's Parse and its Bind
/// must reach the same server connection, which only a transaction
/// guarantees. (The idle probes, one simple-protocol message each, need no
/// explicit transaction: `probe_row`.)
pub async fn in_tx<T>(
    conn: &mut PgConnection,
    body: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    let mut tx = conn.begin_with(BEGIN_GUARDED).await?;
    let out = body(&mut tx).await?;
    tx.commit().await?;
    Ok(out)
}

/// A one-line description of a database error with its underlying cause
/// (sqlx's Display alone often says only "error communicating with database").
pub fn describe(err: &sqlx::Error) -> String {
    match err {
        sqlx::Error::Database(db) => return describe_server_error(db.as_ref()),
        sqlx::Error::Protocol(what) => {
            return format!(
                "protocol error: the server or a connection pooler in between answered out of \
                 turn ({what}); the connection is dropped and reopened (PgBouncer in \
                 transaction mode: see docs/topologies.md)"
            );
        }
        _ => {}
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
    // sqlx reports a failed handshake as an I/O error ("error communicating
    // with database: invalid peer certificate: …"), not always as `Tls`.
    match tls_word(&msg) {
        Some(word) => format!("{word} ({msg})"),
        None => msg,
    }
}

/// The server's own words: message, detail, hint and SQLSTATE (not sqlx's
/// Display, which appends PostgreSQL's internal source position).
fn describe_server_error(db: &dyn sqlx::error::DatabaseError) -> String {
    let mut msg = db.message().to_owned();
    // undefined_table / undefined_function: the schema is not there, and the
    // server's hint ("You might need to add explicit type casts") would only
    // stand in front of ours.
    let undefined = db.code().is_some_and(|c| c == "42P01" || c == "42883");
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        if let Some(detail) = pg.detail() {
            msg.push_str(&format!(" ({detail})"));
        }
        if let Some(hint) = pg.hint().filter(|_| !undefined) {
            msg.push_str(&format!("; hint: {hint}"));
        }
    }
    if let Some(code) = db.code() {
        msg.push_str(&format!(" (SQLSTATE {code})"));
        if undefined {
            msg.push_str("; is the schema migrated? run `lease-sweeper migrate`");
        }
        // read_only_sql_transaction: connected to a standby (target_session_attrs
        // let it through, or it was demoted under us).
        if code == "25006" {
            return format!("{HOT_STANDBY} (SQLSTATE 25006: {})", db.message());
        }
        // A pooler's protocol_violation, or prepared statements lost or
        // mixed up between server connections.
        if code == "08P01" || code == "26000" || code == "42P05" {
            msg.push_str(
                "; a connection pooler in between? see docs/topologies.md for PgBouncer's settings",
            );
        }
    }
    msg
}

/// One clear word for a TLS failure: which of the usual ones it is.
fn tls_word(cause: &str) -> Option<&'static str> {
    let lower = cause.to_ascii_lowercase();
    Some(
        if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
            "TLS failure: unknown CA: the server's certificate is not signed by the CA in \
             sslrootcert (PGSSLROOTCERT)"
        } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
            "TLS failure: host name mismatch: the server's certificate does not name the host \
             connected to (sslmode=verify-full checks it)"
        } else if lower.contains("invalid peer certificate: expired")
            || lower.contains("notvalidyet")
        {
            "TLS failure: the server's certificate is expired or not yet valid"
        } else if lower.contains("server does not support tls") {
            "TLS failure: the server does not accept TLS connections, but sslmode requires them"
        } else if lower.contains("certificate") || lower.contains("handshake") {
            "TLS failure"
        } else {
            return None;
        },
    )
}

#[cfg(test)]
mod tests;
