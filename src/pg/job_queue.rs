//! The job queue in PostgreSQL: the statements on it, each returning its SQL
//! function's JSON as text (no sqlx JSON feature; the CLI prints what the
//! database said), and `PgJobQueue`, the job reaper's `JobQueue` on its own
//! connection, with the `job_set_aside` line only it sees; where there is no
//! job queue (a lock server without one) it answers every pass with a
//! closed gate saying so. Not the reaping rules (SQL, `migrations/`) nor
//! when to reap (`sweep::job_reaper`).

use sqlx::{FromRow, PgConnection, Row as _};

use crate::config::DbTarget;
use crate::model::{ApplyReport, JobAction, SetAsideJob};
use crate::pg::conn::{self, BatchFailure, SharedDb};
use crate::store::{ApplyBatch, Gates, JobQueue, PassStart, Reporter, StoreError, Work};

/// The read-only dry run: `$1` = limit (1..10000).
pub const DRY_RUN: &str = "SELECT fn_job_reap_stale_leases_dry_run($1)::text";

/// The reaping apply: `$1` = actor, `$2` = limit (1..10000). Mutates only when
/// the gates allow; otherwise returns a refusal and changes nothing.
pub const APPLY: &str = "SELECT fn_job_reap_stale_leases_apply($1, $2)::text";

/// The daemon's apply: `APPLY`, with its report recorded in one hand-off row
/// in the same call when it reaped something, so the transaction can commit
/// before the lines are written (`fn_job_reap_stale_leases_apply_handed_off`
/// in `sql/functions/`). Returns the hand-off's id (NULL otherwise) and the
/// report.
pub const APPLY_HANDED_OFF: &str =
    "SELECT handoff_id, report FROM fn_job_reap_stale_leases_apply_handed_off($1, $2)";

/// Every queue setting with who changed it last, plus what the gates say now.
///
/// Built-ins are `pg_catalog.`-qualified: `gates` is often run by a
/// superuser, and an unqualified `jsonb_agg` or `jsonb_build_object` resolves
/// to a better-matching overload any role with CREATE on `public` may plant
/// (tests/it/privilege/holes.rs).
pub const SHOW_GATES: &str = "
SELECT pg_catalog.jsonb_build_object(
           'settings', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                                            'key', key,
                                            'value', value,
                                            'updated_at', updated_at,
                                            'updated_by', updated_by) ORDER BY key)
                                   FROM queue_setting), '[]'::pg_catalog.jsonb),
           'apply_allowed', fn_job_reaper_gate_refusal() IS NULL,
           'apply_refusal', fn_job_reaper_gate_refusal())::text";

/// The audited setter: `$1` = key, `$2` = value, `$3` = actor. Rejects an
/// unknown key, an ill-typed value or an empty actor with SQLSTATE 22023.
pub const SET_GATE: &str = "SELECT fn_queue_setting_set($1, $2, $3)::text";

/// SQLSTATE `invalid_parameter_value`: how the setters say "rejected".
pub const REJECTED_SQLSTATE: &str = "22023";

/// Every kind's own lease duration with who set it last, and the default
/// every other kind leases for (`queue.lease.duration_sec`, as
/// `fn_job_default_lease_sec` reads it). Built-ins `pg_catalog.`-qualified,
/// as in `SHOW_GATES`.
pub const SHOW_LEASES: &str = "
SELECT pg_catalog.jsonb_build_object(
           'kinds', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                                         'job_kind', k.job_kind,
                                         'lease_sec', k.lease_sec,
                                         'updated_at', k.updated_at,
                                         'updated_by', k.updated_by) ORDER BY k.job_kind)
                                FROM job_kind_lease AS k), '[]'::pg_catalog.jsonb),
           'default', pg_catalog.jsonb_build_object(
                          'setting', 'queue.lease.duration_sec',
                          'lease_sec', fn_job_default_lease_sec(),
                          'updated_at', (SELECT s.updated_at FROM queue_setting AS s
                                          WHERE s.key OPERATOR(pg_catalog.=) 'queue.lease.duration_sec'),
                          'updated_by', (SELECT s.updated_by FROM queue_setting AS s
                                          WHERE s.key OPERATOR(pg_catalog.=) 'queue.lease.duration_sec')))::text";

/// The audited kind-duration setter: `$1` = kind, `$2` = seconds (NULL
/// clears the kind's duration), `$3` = actor. Rejects an empty kind or actor
/// and seconds outside 1..86400 with SQLSTATE 22023.
pub const SET_KIND_LEASE: &str = "SELECT fn_job_kind_lease_set($1, $2, $3)::text";

/// Whether the queue has per-kind lease durations (`job_kind_lease`): the
/// stand-in does; a queue adopted as its own tool made it may not.
pub const HAS_KIND_LEASES: &str = "SELECT pg_catalog.to_regclass('job_kind_lease') IS NOT NULL";

pub async fn has_kind_leases(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(HAS_KIND_LEASES)
        .persistent(false)
        .fetch_one(conn)
        .await
}

/// Which parts of per-kind lease durations the queue on the search path
/// has: no row without a `job_queue`.
pub const LEASE_DURATION_PARTS: &str = "
SELECT pg_catalog.to_regclass('job_kind_lease') IS NOT NULL AS kind_table,
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                WHERE p.proname OPERATOR(pg_catalog.=) 'fn_job_kind_lease_set'
                  AND pg_catalog.pg_function_is_visible(p.oid)) AS setter,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid OPERATOR(pg_catalog.=) q.oid AND NOT a.attisdropped
           AND a.attname OPERATOR(pg_catalog.=) ANY ('{lease_duration_sec,lease_duration_source}'::pg_catalog.name[]))
       OPERATOR(pg_catalog.=) 2 AS recorded
  FROM (SELECT pg_catalog.to_regclass('job_queue') AS oid) AS q
 WHERE q.oid IS NOT NULL";

/// `LEASE_DURATION_PARTS`' row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct LeaseDurationParts {
    /// `job_kind_lease`: each kind's own duration.
    pub kind_table: bool,
    /// `fn_job_kind_lease_set`, which `leases set`/`clear` call.
    pub setter: bool,
    /// `job_queue.lease_duration_sec` and `lease_duration_source`: the
    /// lease each claim gave, which the dry run reports.
    pub recorded: bool,
}

pub async fn lease_duration_parts(
    conn: &mut PgConnection,
) -> Result<Option<LeaseDurationParts>, sqlx::Error> {
    sqlx::query_as(LEASE_DURATION_PARTS)
        .persistent(false)
        .fetch_optional(conn)
        .await
}

pub async fn dry_run(conn: &mut PgConnection, limit: i32) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(DRY_RUN)
        .persistent(false)
        .bind(limit)
        .fetch_one(conn)
        .await
}

pub async fn apply(
    conn: &mut PgConnection,
    actor: &str,
    limit: i32,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(APPLY)
        .persistent(false)
        .bind(actor)
        .bind(limit)
        .fetch_one(conn)
        .await
}

pub async fn show_gates(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SHOW_GATES)
        .persistent(false)
        .fetch_one(conn)
        .await
}

pub async fn set_gate(
    conn: &mut PgConnection,
    key: &str,
    value: &str,
    actor: &str,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SET_GATE)
        .persistent(false)
        .bind(key)
        .bind(value)
        .bind(actor)
        .fetch_one(conn)
        .await
}

pub async fn show_leases(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SHOW_LEASES)
        .persistent(false)
        .fetch_one(conn)
        .await
}

/// Sets `kind`'s lease duration, or clears it when `seconds` is `None`.
pub async fn set_kind_lease(
    conn: &mut PgConnection,
    kind: &str,
    seconds: Option<i32>,
    actor: &str,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(SET_KIND_LEASE)
        .persistent(false)
        .bind(kind)
        .bind(seconds)
        .bind(actor)
        .fetch_one(conn)
        .await
}

/// The job reaper's first question of every pass, in one simple-protocol
/// round trip (`conn::probe_row`): the gates' refusal (NULL when they
/// allow reaping) and, only when they refuse, the stale-lease count behind
/// the gauge, so a gated pass (the idle fleet's usual case) is this one
/// statement. Both are PL/pgSQL functions, so the session caches their
/// plans and an idle pass plans nothing (what planning would cost is in
/// docs/performance.md, section 6). The `CASE` skips
/// the count when the pass is about to reap (it reads the gauge after
/// applying).
///
/// It also asks whether a batch some reaper handed off but did not report
/// waits for recovery (`fn_job_reap_handoff_abandoned`), so recovery adds
/// no statement to a pass.
pub const GATES_THEN_STALE: &str = "SELECT r::text AS refusal, \
     CASE WHEN r IS NOT NULL THEN fn_job_stale_lease_count() END AS stale, \
     fn_job_reap_handoff_abandoned() AS abandoned \
     FROM fn_job_reaper_gate_refusal() AS r";

/// Claims job hand-off `$1` for writing its lines; false when another
/// reaper recovered it first.
pub const HANDOFF_CLAIM: &str = "SELECT fn_job_reap_handoff_claim($1)";

/// Deletes the oldest abandoned job hand-off and returns its report (no row
/// when none waits).
pub const HANDOFF_RECOVER: &str = "SELECT report FROM fn_job_reap_handoff_recover()";

/// The stale-lease count behind the gauge after an apply pass, in one
/// simple-protocol round trip (`conn::probe_row`).
pub const STALE_COUNT: &str = "SELECT fn_job_stale_lease_count() AS stale";

/// `GATES_THEN_STALE`'s row, its values decoded from text (simple protocol).
#[derive(FromRow)]
struct GatesRow {
    /// `fn_job_reaper_gate_refusal`'s JSON; NULL when the gates allow.
    refusal: Option<String>,
    /// NULL when the gates allow (the count was skipped).
    stale: Option<i64>,
    abandoned: bool,
}

/// The `backend` tag: this queue lives in PostgreSQL.
const BACKEND: &str = "pg";

/// Whether the daemon's role sees no `job_queue` (nor the `queue_setting`
/// its gates live in) on its search path: a lock server that runs without a
/// job queue, beside which `migrate` creates none.
pub const NO_JOB_QUEUE_HERE: &str = "SELECT pg_catalog.to_regclass('job_queue') IS NULL \
     OR pg_catalog.to_regclass('queue_setting') IS NULL AS absent";

/// The gates' refusal while there is no job queue: the reaper logs it once
/// (`job_reaper_gated`), as it logs any closed gate, and idles.
pub const NO_JOB_QUEUE: &str = "no job_queue in the lock server's schema: the job reaper idles; \
     lease-sweeper migrate adopts a job queue once one exists there";

/// SQLSTATE `undefined_table`: what the gates' statement fails with where
/// there is no job queue.
const UNDEFINED_TABLE: &str = "42P01";

/// The job reaper's view of the queue, on the connection it shares with the
/// horizon check.
pub struct PgJobQueue {
    db: SharedDb,
    /// There was no job queue at the last pass: the next one asks only
    /// `NO_JOB_QUEUE_HERE`, never the gates' statement, which would fail.
    absent: bool,
}

impl PgJobQueue {
    /// On a connection of its own (tests, one-shot use).
    pub fn new(target: DbTarget) -> Self {
        Self::on(SharedDb::new(target))
    }

    /// On `db`, shared with the horizon check.
    pub fn on(db: SharedDb) -> Self {
        Self { db, absent: false }
    }

    /// The pass's start while there is no job queue: closed, nothing stale,
    /// nothing abandoned (nothing was ever reaped here).
    fn idle() -> PassStart {
        PassStart {
            gates: Gates::Refuse {
                reason: NO_JOB_QUEUE.to_owned(),
                stale: 0,
            },
            abandoned: false,
        }
    }
}

impl JobQueue for PgJobQueue {
    fn backend_id(&self) -> &'static str {
        BACKEND
    }

    /// The gates' refusal reason, or `None` when they allow reaping; with a
    /// refusal, also the stale-lease count (nothing will be reaped, so it
    /// stands for the pass). One statement: `GATES_THEN_STALE`.
    async fn gates(&mut self) -> Result<PassStart, StoreError> {
        // The one statement calls all three: a failure names them.
        const WHAT: &str =
            "fn_job_reaper_gate_refusal, fn_job_stale_lease_count, fn_job_reap_handoff_abandoned";
        const WHAT_ABSENT: &str = "whether there is a job_queue";
        let mut db = self.db.lock(Work::JobQueue).await;
        if self.absent {
            let absent = queue_absent(db.conn().await?).await;
            if absent.map_err(|e| db.query_failed(WHAT_ABSENT, e))? {
                return Ok(Self::idle());
            }
            self.absent = false;
        }
        let probed = conn::probe_row(db.conn().await?, GATES_THEN_STALE).await;
        let row = match probed {
            Err(e) if is_undefined_table(&e) => {
                // Gone, or never there: idle (said once, by the reaper's
                // gate line) rather than fail every pass.
                let absent = queue_absent(db.conn().await?).await;
                let absent = absent.map_err(|e| db.query_failed(WHAT_ABSENT, e))?;
                if !absent {
                    return Err(db.query_failed(WHAT, e));
                }
                self.absent = true;
                return Ok(Self::idle());
            }
            other => other
                .and_then(|row| GatesRow::from_row(&row))
                .map_err(|e| db.query_failed(WHAT, e))?,
        };
        let abandoned = row.abandoned;
        let Some(text) = row.refusal else {
            return Ok(PassStart {
                gates: Gates::Allow,
                abandoned,
            });
        };
        let reason = decode::<ApplyReport>("fn_job_reaper_gate_refusal", &text)
            .map(|r| r.reason.unwrap_or_else(|| text.clone()))
            .map_err(|f| db.batch_failed(f))?;
        drop(db);
        let stale = match row.stale {
            Some(n) => count(n),
            // The gates refused but the count is missing: ask for it alone.
            None => self.stale_count().await?,
        };
        Ok(PassStart {
            gates: Gates::Refuse { reason, stale },
            abandoned,
        })
    }

    async fn recover(&mut self, report: &mut dyn Reporter<JobAction>) -> Result<usize, StoreError> {
        self.db
            .lock(Work::JobQueue)
            .await
            .batch(async |c| recover_in_tx(c, report).await)
            .await
    }

    /// `STALE_COUNT`.
    async fn stale_count(&mut self) -> Result<u64, StoreError> {
        const WHAT: &str = "fn_job_stale_lease_count";
        let mut db = self.db.lock(Work::JobQueue).await;
        let conn = db.conn().await?;
        conn::probe_row(conn, STALE_COUNT)
            .await
            .and_then(|row| row.try_get::<i64, _>("stale"))
            .map(count)
            .map_err(|e| db.query_failed(WHAT, e))
    }

    async fn apply_batch(
        &mut self,
        actor: &str,
        limit: usize,
        report: &mut dyn Reporter<JobAction>,
    ) -> Result<ApplyBatch, StoreError> {
        self.db
            .lock(Work::JobQueue)
            .await
            .batch(async |c| apply_in_tx(c, actor, limit, report).await)
            .await
    }
}

/// Apply, write and flush the lines, commit. A refusal changes nothing and
/// its transaction is dropped (rolled back).
async fn apply_in_tx(
    conn: &mut PgConnection,
    actor: &str,
    limit: usize,
    report: &mut dyn Reporter<JobAction>,
) -> Result<ApplyBatch, BatchFailure> {
    const WHAT: &str = "fn_job_reap_stale_leases_apply_handed_off";
    let mut tx = conn::begin(conn).await?;
    let (handoff_id, text): (Option<i64>, String) = sqlx::query_as(APPLY_HANDED_OFF)
        .persistent(false)
        .bind(actor)
        .bind(conn::limit_param(limit))
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| BatchFailure::Query(WHAT, e))?;
    let report_json: ApplyReport = decode(WHAT, &text)?;
    if report_json.refused {
        return Ok(ApplyBatch::Refused(report_json.reason.unwrap_or(text)));
    }
    let n = report_json.actions.len();
    // Not reaped, so nothing to write; a set-aside job keeps the batch
    // short, so the pass moves on and the next retries it.
    log_set_aside(&report_json.set_aside);
    // The reaped jobs' row locks would hold up a worker's heartbeat or
    // completion of them: the call handed the report off, so commit first,
    // then write the lines.
    conn::commit(tx).await?;
    if let Some(id) = handoff_id {
        let what = "fn_job_reap_handoff_claim";
        conn::claim_then_report(conn, HANDOFF_CLAIM, what, id, &report_json.actions, report)
            .await?;
    }
    Ok(ApplyBatch::Applied { n })
}

/// One abandoned hand-off: its report's lines written, then its deletion
/// committed.
async fn recover_in_tx(
    conn: &mut PgConnection,
    report: &mut dyn Reporter<JobAction>,
) -> Result<usize, BatchFailure> {
    const WHAT: &str = "fn_job_reap_handoff_recover";
    let mut tx = conn::begin(conn).await?;
    let text: Option<String> = sqlx::query_scalar(HANDOFF_RECOVER)
        .persistent(false)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| BatchFailure::Query(WHAT, e))?;
    let Some(text) = text else {
        return Ok(0);
    };
    let recovered: ApplyReport = decode(WHAT, &text)?;
    conn::report_then_commit(tx, &recovered.actions, report).await?;
    Ok(recovered.actions.len())
}

/// One ERROR line per job the database set aside (only this layer sees
/// them: they never reach the reaper as actions).
fn log_set_aside(jobs: &[SetAsideJob]) {
    for job in jobs {
        tracing::error!(
            jobId = %job.job_id,
            jobKind = %job.job_kind.as_deref().unwrap_or(""),
            leaseOwner = %job.lease_owner.as_deref().unwrap_or(""),
            cause = %job.error,
            backend = BACKEND,
            "job_set_aside"
        );
    }
}

/// `NO_JOB_QUEUE_HERE`, in one simple-protocol round trip.
async fn queue_absent(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    conn::probe_row(conn, NO_JOB_QUEUE_HERE)
        .await
        .and_then(|row| row.try_get::<bool, _>("absent"))
}

fn is_undefined_table(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == UNDEFINED_TABLE)
}

/// A count from PostgreSQL (`bigint`, never negative) as the gauge's `u64`.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn decode<'a, T: serde::Deserialize<'a>>(
    query: &'static str,
    text: &'a str,
) -> Result<T, BatchFailure> {
    serde_json::from_str(text)
        .map_err(|e| BatchFailure::Decode(query, format!("unexpected JSON ({e}): {text}")))
}
