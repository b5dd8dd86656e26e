//! What holds the xmin horizon of this database, and how many dead rows
//! `lock_entry` and `job_queue` carry: the statements behind the horizon
//! check, and their answer as plain records.
//!
//! Owns the two statements, the transaction they run in (read-only, with its
//! own short guards, PgBouncer-safe) and decoding their rows. It owns no
//! timing, wording or threshold: `sweep::horizon_check` decides what is held and
//! for how long, and what to say. It reads only catalog views that PUBLIC
//! may read, so it needs no definer function and no grant; what a role
//! without `pg_read_all_stats` cannot see of other roles' sessions comes
//! back as NULL and is marked `visible = false` (docs/least-privilege.md).
//!
//! Names are qualified with `pg_catalog` and operators spelled
//! `OPERATOR(pg_catalog.…)`, as in `catalog`: the daemon's search path may
//! hold objects it did not create.

use std::future::Future;

use sqlx::{Connection as _, Row as _};

use crate::pg::conn::SharedDb;
use crate::store::{StoreError, Work};

/// Server-side bound of each horizon statement, in ms. The views read
/// shared memory and take no lock a writer holds for long; far less than the
/// sweeps' 30 s, so a check that cannot answer gives up while it still says
/// something useful.
macro_rules! horizon_statement_timeout_ms {
    () => {
        5000
    };
}

/// Bound on waiting for any lock (a catalog under DDL), in ms.
macro_rules! horizon_lock_timeout_ms {
    () => {
        1000
    };
}

/// How every horizon transaction starts: read-only, both bounds set with
/// `SET LOCAL` in the transaction itself (never for the session: behind
/// PgBouncer in transaction mode a session setting stays on whatever server
/// connection it reached), in one simple-protocol round trip.
pub const HORIZON_BEGIN: &str = concat!(
    "BEGIN READ ONLY; SET LOCAL statement_timeout = ",
    horizon_statement_timeout_ms!(),
    "; SET LOCAL lock_timeout = ",
    horizon_lock_timeout_ms!()
);

/// The dead rows of the two tables (the statistics collector's `n_dead_tup`:
/// rows deleted or updated away and not yet vacuumed; after a vacuum, the ones
/// it could not remove), and whether this role sees every session in full.
pub const DEAD_ROWS: &str = "
SELECT pg_catalog.pg_stat_get_dead_tuples(pg_catalog.to_regclass('lock_entry')),
       pg_catalog.pg_stat_get_dead_tuples(pg_catalog.to_regclass('job_queue')),
       pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')";

/// Whether this role sees every session in full: the preflight's question.
pub const READS_ALL_STATS: &str = "SELECT pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')";

/// `READS_ALL_STATS`, for `cmd::check` (which runs it in its own guarded
/// transaction).
pub async fn reads_all_stats(conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(READS_ALL_STATS)
        .persistent(false)
        .fetch_one(conn)
        .await
}

/// Most holders one check returns, oldest horizon first: enough to name the
/// culprits, bounded so a busy server never floods a line per session.
pub const MAX_HOLDERS: i64 = 8;

/// Everything that holds back this database's xmin horizon, oldest first:
/// sessions of this database with a snapshot (`backend_xmin`) or a
/// transaction id (`backend_xid`); walsenders (a standby's
/// hot_standby_feedback without a slot, which holds every database: the
/// walsender takes the standby's oldest snapshot as its own xmin);
/// replication slots with a data `xmin` (every database; `catalog_xmin`
/// holds only the catalogs, not these tables); prepared transactions of
/// this database. The check's own session is left out. A walsender's state
/// is its replication state (`streaming`, `catchup`, …), which says whether
/// the standby is live, where its `pg_stat_activity` state reads `active`.
/// `held_seconds` is the server's own clock (transaction start, time of
/// PREPARE) when it has one and shows it.
pub const HOLDERS: &str = "
WITH walsender AS (SELECT pg_catalog.array_agg(r.pid) AS pids FROM pg_catalog.pg_stat_replication r),
     here AS (SELECT d.oid FROM pg_catalog.pg_database d
               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()),
     holder AS (
    SELECT CASE WHEN a.pid OPERATOR(pg_catalog.=) ANY (w.pids) THEN 'standby' ELSE 'session' END AS kind,
           a.pid,
           a.application_name::text AS application_name,
           pg_catalog.host(a.client_addr) AS client_addr,
           COALESCE((SELECT r.state FROM pg_catalog.pg_stat_replication r
                      WHERE r.pid OPERATOR(pg_catalog.=) a.pid), a.state)::text AS state,
           a.backend_type::text AS backend_type,
           EXTRACT(EPOCH FROM pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-) a.xact_start)::float8
               AS held_seconds,
           COALESCE(a.backend_xmin, a.backend_xid)::text AS horizon_xid,
           GREATEST(pg_catalog.age(a.backend_xmin), pg_catalog.age(a.backend_xid)) AS xid_age,
           NULL::text AS name,
           COALESCE(pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
                    OR pg_catalog.pg_has_role(a.usesysid, 'USAGE'), false) AS visible
      FROM pg_catalog.pg_stat_activity a, walsender w, here
     WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
       AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
       AND (a.datid OPERATOR(pg_catalog.=) here.oid OR a.pid OPERATOR(pg_catalog.=) ANY (w.pids))
       -- VACUUM's own snapshot holds no other vacuum back.
       AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
    UNION ALL
    SELECT 'replication_slot', s.active_pid, NULL, NULL,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, s.slot_type,
           NULL, s.xmin::text, pg_catalog.age(s.xmin), s.slot_name::text, true
      FROM pg_catalog.pg_replication_slots s
     WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared_transaction', NULL, NULL, NULL, 'prepared', NULL,
           EXTRACT(EPOCH FROM pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-) p.prepared)::float8,
           p.transaction::text, pg_catalog.age(p.transaction), p.gid, true
      FROM pg_catalog.pg_prepared_xacts p
     WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database())
SELECT kind, pid, application_name, client_addr, state, backend_type, held_seconds,
       horizon_xid, xid_age, name, visible
  FROM holder
 ORDER BY xid_age DESC
 LIMIT $1";

/// What holds the horizon: the kinds `HOLDERS` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HolderKind {
    /// A client session: an open transaction, idle or not.
    Session,
    /// A walsender whose standby sends hot_standby_feedback.
    Standby,
    ReplicationSlot,
    PreparedTransaction,
}

impl HolderKind {
    /// The word in the lines and the statement.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Session => "session",
            HolderKind::Standby => "standby",
            HolderKind::ReplicationSlot => "replication_slot",
            HolderKind::PreparedTransaction => "prepared_transaction",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        [
            HolderKind::Session,
            HolderKind::Standby,
            HolderKind::ReplicationSlot,
            HolderKind::PreparedTransaction,
        ]
        .into_iter()
        .find(|k| k.as_str() == word)
    }
}

/// One holder as the server described it. Text fields are the server's (an
/// application_name is whatever the client chose); NULL stays `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub kind: HolderKind,
    /// The backend (a slot's only while a walsender uses it).
    pub pid: Option<i32>,
    pub application_name: Option<String>,
    pub client_addr: Option<String>,
    pub state: Option<String>,
    pub backend_type: Option<String>,
    /// Age by the server's clock, when it has one this role may see.
    pub held_seconds: Option<f64>,
    /// The xid it holds the horizon at: with `kind` and the name or pid, what
    /// tells one hold from the next.
    pub horizon_xid: String,
    /// Transactions started since `horizon_xid` (`age()`).
    pub xid_age: i64,
    /// The slot's name or the prepared transaction's gid.
    pub name: Option<String>,
    /// False when this role may not see the session's state, client address
    /// and transaction start (another role's, without `pg_read_all_stats`).
    pub visible: bool,
}

/// Dead rows of the two swept tables (`n_dead_tup`; 0 when a table is not
/// there or has no statistics yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadRows {
    pub lock_entry: i64,
    pub job_queue: i64,
}

/// One check's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Horizon {
    pub dead: DeadRows,
    /// The role is a member of `pg_read_all_stats` (or a superuser).
    pub reads_all_stats: bool,
    pub holders: Vec<Holder>,
}

/// Where the horizon check reads from: PostgreSQL here, a stub in tests.
pub trait HorizonSource: Send {
    fn read(&mut self) -> impl Future<Output = Result<Horizon, StoreError>> + Send;
}

/// The horizon check's reads, on the connection it shares with the job
/// reaper.
pub struct PgHorizon {
    db: SharedDb,
}

impl PgHorizon {
    /// On `db`, shared with the job reaper.
    pub fn on(db: SharedDb) -> Self {
        Self { db }
    }
}

impl HorizonSource for PgHorizon {
    async fn read(&mut self) -> Result<Horizon, StoreError> {
        let mut db = self.db.lock(Work::Horizon).await;
        let conn = db.conn().await?;
        match read_horizon(conn).await {
            Ok(horizon) => Ok(horizon),
            Err((query, e)) => Err(db.query_failed(query, e)),
        }
    }
}

/// Runs both statements in one guarded read-only transaction.
pub async fn read_horizon(
    conn: &mut sqlx::PgConnection,
) -> Result<Horizon, (&'static str, sqlx::Error)> {
    let mut tx = conn
        .begin_with(HORIZON_BEGIN)
        .await
        .map_err(|e| ("BEGIN", e))?;
    let dead = sqlx::query(DEAD_ROWS)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| ("DEAD_ROWS", e))?;
    let rows = sqlx::query(HOLDERS)
        .bind(MAX_HOLDERS)
        .persistent(false)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| ("HOLDERS", e))?;
    tx.commit().await.map_err(|e| ("COMMIT", e))?;
    let decode = |e| ("HOLDERS", e);
    let mut holders = Vec::with_capacity(rows.len());
    for row in rows {
        let kind: String = row.try_get(0).map_err(decode)?;
        let Some(kind) = HolderKind::parse(&kind) else {
            continue;
        };
        holders.push(Holder {
            kind,
            pid: row.try_get(1).map_err(decode)?,
            application_name: row.try_get(2).map_err(decode)?,
            client_addr: row.try_get(3).map_err(decode)?,
            state: row.try_get(4).map_err(decode)?,
            backend_type: row.try_get(5).map_err(decode)?,
            held_seconds: row.try_get(6).map_err(decode)?,
            horizon_xid: row.try_get(7).map_err(decode)?,
            xid_age: row
                .try_get::<Option<i32>, _>(8)
                .map_err(decode)?
                .unwrap_or(0) as i64,
            name: row.try_get(9).map_err(decode)?,
            visible: row.try_get(10).map_err(decode)?,
        });
    }
    let decode = |e| ("DEAD_ROWS", e);
    Ok(Horizon {
        dead: DeadRows {
            lock_entry: dead
                .try_get::<Option<i64>, _>(0)
                .map_err(decode)?
                .unwrap_or(0),
            job_queue: dead
                .try_get::<Option<i64>, _>(1)
                .map_err(decode)?
                .unwrap_or(0),
        },
        reads_all_stats: dead
            .try_get::<Option<bool>, _>(2)
            .map_err(decode)?
            .unwrap_or(false),
        holders,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guards_are_local_and_short() {
        assert_eq!(
            HORIZON_BEGIN,
            "BEGIN READ ONLY; SET LOCAL statement_timeout = 5000; SET LOCAL lock_timeout = 1000"
        );
    }
}
