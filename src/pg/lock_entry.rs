//! Statements on `lock_entry` and the sidecar's records of it (the
//! hand-offs, the outbox of takeovers and late releases, the shared held
//! count), and the rows they return.
//!
//! Owns the statement texts (literals calling the SECURITY DEFINER functions
//! in `sql/functions/`), the held count's maximum age that the probe's text
//! carries, and decoding their rows by column name. It owns no
//! transactions, retries or logging: `lock_store` runs these.

use std::time::Duration;

use sqlx::{FromRow, PgConnection};

use crate::model::{ExpiredLease, ReapedBy};
use crate::pg::conn;

/// `HELD_COUNT_MAX_AGE` in ms as a literal, so the probe's text
/// (`SWEEP_PROBE`) can carry it without building SQL at run time.
macro_rules! held_count_max_age_ms {
    () => {
        3000
    };
}

/// How old the shared held-lease count may be before a caller recounts it.
///
/// Sweeps need no recount: every batch records the leases it deleted
/// (`lock_held_delta`) and every reading subtracts them, so a sweep is in
/// the sweeping daemon's gauge in the same pass and in every other daemon's
/// at its next pass. What only a recount sees is the lock server's work:
/// acquisitions, releases, and sweeps of leases written after the count.
/// Those reach every daemon's `lock.held.current` within this age plus two
/// sweep periods (`SWEEP_DELAY` and a pass each; the second one when a daemon
/// reads while another is recounting and gets the previous count rather than
/// wait): 3 s + 2 x 1 s = 5 s on an idle fleet. The recount is a full scan,
/// done once per interval by one daemon of the whole fleet.
pub const HELD_COUNT_MAX_AGE: Duration = Duration::from_millis(held_count_max_age_ms!());

/// One batch of the sweep: deletes up to `$1` expired leases in deadline
/// order from `$2` (epoch ms: the newest deadline the sweep's previous
/// batch reaped; NULL: the oldest, pre-1970 and -infinity included), rows
/// other sessions hold skipped (`FOR UPDATE SKIP LOCKED`, so replicas split
/// the work), records them in one hand-off row, and returns them as arrays
/// in one row (`lock_reap_batch` in `sql/functions/`, which explains the
/// shape: the database clock decides, rows are deleted by tuple id). The
/// sweeper's role needs no
/// DELETE privilege and can never delete a live lease.
///
/// Resuming at `$2` spares each batch the dead index entries the earlier
/// ones left at the head of the index, which would make a drain quadratic
/// in its backlog; a lease passed over (held by another session when its
/// batch ran) is reaped by the next sweep, which starts from the oldest.
///
/// The `set_aside_*` arrays name leases that were NOT deleted: each failed
/// inside the function and was set aside so the rest of the batch could be
/// reaped (`lock_reap_expired`, its row-by-row path).
pub const REAP_BATCH: &str = "
SELECT handoff_id, lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis,
       set_aside_keys, set_aside_owner_ids, set_aside_tokens, set_aside_errors
  FROM lock_reap_batch($1, $2)";

/// Drains up to `$1` recorded expiries (takeovers, late releases and late
/// renewals), oldest first, each with how it left the table or came back to
/// life; overdue is measured at that moment (`lock_drain_takeovers` in `sql/functions/`).
pub const DRAIN_TAKEOVERS: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis, set_aside_error, reaped_by
  FROM lock_drain_takeovers($1)";

/// What a sweep asks first, in one statement (`lock_sweep_probe` in
/// `sql/functions/`): is any lease expired, is any expiry recorded, and the
/// shared held count (counted at most `HELD_COUNT_MAX_AGE` ago, less what
/// was swept since; NULL when something is expired: the sweep reads it
/// after deleting). Sent alone with the simple protocol (`conn::probe_row`):
/// one round trip, the argument a compile-time literal.
pub const SWEEP_PROBE: &str = concat!(
    "SELECT expired, takeovers, held FROM lock_sweep_probe(",
    held_count_max_age_ms!(),
    ")"
);

/// Leases currently held, expired-but-unswept ones included, from the count
/// the fleet shares (`lock_held_count_get` in `sql/functions/`): the stored
/// count less the leases every batch committed since it has swept, read in
/// one statement, and a `count(*)` only by the one caller that finds the
/// stored count older than `$1` ms and wins its row. Returns the count and
/// whether this call recounted.
pub const HELD_COUNT: &str = "SELECT held, recounted FROM lock_held_count_get($1)";

/// Claims hand-off `$1` for writing its lines (deletes it; the row lock lasts
/// until COMMIT); false when another sweeper recovered it first.
pub const HANDOFF_CLAIM: &str = "SELECT lock_handoff_claim($1)";

/// Deletes the oldest hand-off its writer abandoned (older than the grace in
/// `signal_handoff_grace()`, held by no one) and returns its leases.
pub const HANDOFF_RECOVER: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis
  FROM lock_handoff_recover()";

/// A row of `DRAIN_TAKEOVERS`: a recorded expiry (both millisecond fields
/// set) or, with `set_aside_error`, one left in the record.
#[derive(FromRow)]
struct LeaseRow {
    lock_key: String,
    owner_id: String,
    token: Option<String>,
    expired_at_millis: Option<i64>,
    overdue_millis: Option<i64>,
    set_aside_error: Option<String>,
    reaped_by: String,
}

/// A lease the function could not reap: left in place (or in the outbox),
/// reported so the daemon writes one ERROR line naming it and the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideLease {
    pub lock_key: String,
    pub owner_id: String,
    /// As `ExpiredLease::token`: its text, empty for NULL.
    pub token: String,
    pub reaped_by: ReapedBy,
    /// The database's error, with its SQLSTATE.
    pub cause: String,
}

/// What one drain returned: the leases reported and those set aside.
#[derive(Debug, Default)]
pub struct LeaseBatch {
    pub reaped: Vec<ExpiredLease>,
    pub set_aside: Vec<SetAsideLease>,
}

/// Splits recorded expiries into those reaped and those set aside; a
/// `reaped_by` this build does not know is a decode error, not a lost lease.
fn split(rows: Vec<LeaseRow>) -> Result<LeaseBatch, sqlx::Error> {
    let mut batch = LeaseBatch::default();
    for row in rows {
        let reaped_by = ReapedBy::parse(&row.reaped_by).ok_or_else(|| {
            sqlx::Error::Decode(format!("unknown reaped_by {:?}", row.reaped_by).into())
        })?;
        match (
            row.set_aside_error,
            row.expired_at_millis,
            row.overdue_millis,
        ) {
            (None, Some(expired_at_millis), Some(overdue_millis)) => {
                batch.reaped.push(ExpiredLease {
                    lock_key: row.lock_key,
                    owner_id: row.owner_id,
                    token: row.token.unwrap_or_default(),
                    expired_at_millis,
                    overdue_millis,
                    reaped_by,
                })
            }
            (error, _, _) => batch.set_aside.push(SetAsideLease {
                lock_key: row.lock_key,
                owner_id: row.owner_id,
                token: row.token.unwrap_or_default(),
                reaped_by,
                cause: error.unwrap_or_else(|| "reaped without a deadline".to_owned()),
            }),
        }
    }
    Ok(batch)
}

/// A batch that was reaped and handed off in one call.
#[derive(Debug, Default)]
pub struct HandedOff {
    /// The hand-off row holding `leases`; `None` when none was reaped.
    pub handoff_id: Option<i64>,
    pub leases: Vec<ExpiredLease>,
    pub set_aside: Vec<SetAsideLease>,
}

/// `REAP_BATCH`'s one row: the batch as parallel arrays (NULL when empty).
#[derive(FromRow)]
struct HandedOffRow {
    handoff_id: Option<i64>,
    lock_keys: Option<Vec<String>>,
    owner_ids: Option<Vec<String>>,
    tokens: Option<Vec<Option<String>>>,
    expired_at_millis: Option<Vec<i64>>,
    overdue_millis: Option<Vec<i64>>,
    set_aside_keys: Option<Vec<String>>,
    set_aside_owner_ids: Option<Vec<String>>,
    set_aside_tokens: Option<Vec<Option<String>>>,
    set_aside_errors: Option<Vec<String>>,
}

/// Zips the arrays of one batch into leases; arrays of unequal length (which
/// the function never returns) are a decode error, not a lost lease.
fn zip_leases(
    keys: Option<Vec<String>>,
    owners: Option<Vec<String>>,
    tokens: Option<Vec<Option<String>>>,
    expired: Option<Vec<i64>>,
    overdue: Option<Vec<i64>>,
) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let (keys, owners, tokens) = (
        keys.unwrap_or_default(),
        owners.unwrap_or_default(),
        tokens.unwrap_or_default(),
    );
    let (expired, overdue) = (expired.unwrap_or_default(), overdue.unwrap_or_default());
    let n = keys.len();
    if [owners.len(), tokens.len(), expired.len(), overdue.len()] != [n; 4] {
        return Err(sqlx::Error::Decode(
            format!("the batch's arrays differ in length (keys {n})").into(),
        ));
    }
    Ok(keys
        .into_iter()
        .zip(owners)
        .zip(tokens.into_iter().zip(expired.into_iter().zip(overdue)))
        .map(
            |((lock_key, owner_id), (token, (expired_at_millis, overdue_millis)))| ExpiredLease {
                lock_key,
                owner_id,
                token: token.unwrap_or_default(),
                expired_at_millis,
                overdue_millis,
                reaped_by: ReapedBy::Sweep,
            },
        )
        .collect())
}

/// Runs `REAP_BATCH`.
pub async fn reap_batch(
    conn: &mut PgConnection,
    limit: usize,
    after_millis: Option<i64>,
) -> Result<HandedOff, sqlx::Error> {
    let row: HandedOffRow = sqlx::query_as(REAP_BATCH)
        .persistent(false)
        .bind(conn::limit_param(limit))
        .bind(after_millis)
        .fetch_one(conn)
        .await?;
    let leases = zip_leases(
        row.lock_keys,
        row.owner_ids,
        row.tokens,
        row.expired_at_millis,
        row.overdue_millis,
    )?;
    let keys = row.set_aside_keys.unwrap_or_default();
    let (owners, tokens, errors) = (
        row.set_aside_owner_ids.unwrap_or_default(),
        row.set_aside_tokens.unwrap_or_default(),
        row.set_aside_errors.unwrap_or_default(),
    );
    let set_aside = keys
        .into_iter()
        .zip(owners)
        .zip(tokens.into_iter().zip(errors))
        .map(|((lock_key, owner_id), (token, cause))| SetAsideLease {
            lock_key,
            owner_id,
            token: token.unwrap_or_default(),
            reaped_by: ReapedBy::Sweep,
            cause,
        })
        .collect();
    Ok(HandedOff {
        handoff_id: row.handoff_id,
        leases,
        set_aside,
    })
}

/// Runs `DRAIN_TAKEOVERS`.
pub async fn drain_takeovers(
    conn: &mut PgConnection,
    limit: usize,
) -> Result<LeaseBatch, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(DRAIN_TAKEOVERS)
        .persistent(false)
        .bind(conn::limit_param(limit))
        .fetch_all(conn)
        .await?;
    split(rows)
}

/// Claims hand-off `id` (`HANDOFF_CLAIM`): true when this transaction now
/// holds it and must write its lines before committing.
pub async fn handoff_claim(conn: &mut PgConnection, id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(HANDOFF_CLAIM)
        .persistent(false)
        .bind(id)
        .fetch_one(conn)
        .await
}

/// A row of `HANDOFF_RECOVER`.
#[derive(FromRow)]
struct HandoffRow {
    lock_key: String,
    owner_id: String,
    token: Option<String>,
    expired_at_millis: i64,
    overdue_millis: i64,
}

/// Recovers one abandoned hand-off (`HANDOFF_RECOVER`): its leases, swept by
/// a sweeper that did not get to write their lines; empty when none waits.
pub async fn handoff_recover(conn: &mut PgConnection) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let rows: Vec<HandoffRow> = sqlx::query_as(HANDOFF_RECOVER)
        .persistent(false)
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| ExpiredLease {
            lock_key: r.lock_key,
            owner_id: r.owner_id,
            token: r.token.unwrap_or_default(),
            expired_at_millis: r.expired_at_millis,
            overdue_millis: r.overdue_millis,
            reaped_by: ReapedBy::Sweep,
        })
        .collect())
}

/// `SWEEP_PROBE`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct SweepProbe {
    /// Some lease is past its deadline.
    pub expired: bool,
    /// Some expiry is recorded and not yet drained (a takeover, a late
    /// release, an abandoned hand-off).
    pub takeovers: bool,
    /// The shared held count; `None` when `expired` (read after the sweep).
    pub held: Option<i64>,
}

/// Asks `SWEEP_PROBE`. Its values come as text (simple protocol), which
/// sqlx decodes for these types.
pub async fn sweep_probe(conn: &mut PgConnection) -> Result<SweepProbe, sqlx::Error> {
    let row = crate::pg::conn::probe_row(conn, SWEEP_PROBE).await?;
    SweepProbe::from_row(&row)
}

/// `HELD_COUNT`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct HeldCount {
    /// Leases held (counted at most the max age ago, plus one count's
    /// duration, less what was swept since).
    pub held: i64,
    /// This call was the one that recounted.
    pub recounted: bool,
}

/// The shared held-lease count, recounted when the stored one is older than
/// `max_age_millis`.
pub async fn held_count(
    conn: &mut PgConnection,
    max_age_millis: i64,
) -> Result<HeldCount, sqlx::Error> {
    sqlx::query_as(HELD_COUNT)
        .persistent(false)
        .bind(max_age_millis)
        .fetch_one(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::SWEEP_DELAY;

    /// What docs/metrics-and-logs.md promises for `lock.held.current`: an
    /// acquisition or release is in every daemon's gauge within the max age
    /// plus two sweep periods, at most 5 s on an idle fleet.
    #[test]
    fn the_gauge_shows_the_lock_servers_work_within_five_seconds() {
        assert!(
            HELD_COUNT_MAX_AGE + 2 * SWEEP_DELAY <= std::time::Duration::from_secs(5),
            "{HELD_COUNT_MAX_AGE:?} + 2 x {SWEEP_DELAY:?}"
        );
    }
}
