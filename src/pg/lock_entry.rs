//! Statements on `lock_entry` and `lock_expiry_outbox`, and the rows they
//! return.
//!
//! Owns the statement texts (literals calling the SECURITY DEFINER functions
//! in `migrations/`), the held count's maximum age that the idle probe's text
//! carries, and decoding their rows by column name. It owns no
//! transactions, retries or logging: `lock_store` runs these inside the
//! batch transaction.

use std::time::Duration;

use sqlx::{FromRow, PgConnection};
use time::OffsetDateTime;

use crate::model::{ExpiredLease, ReapedBy};
use crate::pg::conn;

/// `HELD_COUNT_MAX_AGE` in ms as a literal, so the idle probe's text
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
/// done once per interval by one daemon of the whole fleet
/// (docs/performance.md). It lives here, beside `SWEEP_PROBE`, which carries
/// it in its text.
pub const HELD_COUNT_MAX_AGE: Duration = Duration::from_millis(held_count_max_age_ms!());

/// Deletes up to `$1` expired leases, oldest deadline first, records them in
/// one hand-off row, and returns them as arrays in one row.
///
/// The statement is the SECURITY DEFINER function
/// `lock_reap_expired_handed_off` in `migrations/`, around `lock_reap_expired`
/// (so the sweeper's role needs no DELETE privilege and can never delete a
/// live lease); their comments there explain the shape: the database clock
/// decides, `FOR UPDATE SKIP LOCKED` splits work between replicas, rows are
/// deleted by tuple id, and the batch's hand-off is written in the same call
/// so its transaction can commit before a line is written.
///
/// `waiters` counts the sessions queued behind the batch's row locks when
/// it ended (lock-server calls on its keys), so the sweep can take smaller
/// batches while the lock server is contending with it. It is a signal,
/// not a tally: the index reap deletes in a subtransaction, and a caller
/// queued on it is moved to the transaction when the subtransaction ends,
/// so one caught moving at that instant is not counted; a storm has many.
///
/// `$2` resumes the index scan at the deadline (epoch milliseconds) of the
/// newest lease the previous batch of the same sweep reaped, instead of
/// stepping again over the dead index entries the earlier batches left
/// (quadratic in the backlog, see docs/performance.md); NULL starts from the
/// oldest (pre-1970 and -infinity deadlines included), as the first batch of
/// every sweep does.
///
/// The `set_aside_*` arrays name leases that were NOT deleted: each failed
/// inside the function and was set aside so the rest of the batch could be
/// reaped (contract in migrations/20261130000100_lock_rows_never_block.sql).
pub const REAP_EXPIRED: &str = "
SELECT handoff_id, lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis,
       set_aside_keys, set_aside_owner_ids, set_aside_tokens, set_aside_errors, waiters
  FROM lock_reap_expired_handed_off($1, $2)";

/// Drains up to `$1` recorded takeovers, oldest first; overdue is measured at
/// the moment of the steal (`lock_drain_takeovers` in `migrations/`).
pub const DRAIN_TAKEOVERS: &str = "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis, set_aside_error
  FROM lock_drain_takeovers($1)";

/// The backlog form of `REAP_EXPIRED`: deletes up to `$1` expired leases
/// walking the heap from page `$2` in physical order (a TID range scan),
/// locking each first and skipping those others hold when `$3`, for
/// when most of the table has expired and the index order would visit pages
/// at random (`lock_reap_walk` in `migrations/`, which explains the page
/// budget, the ranges replicas split the heap by and the `next_page` it
/// returns), hands them off the same way and returns them as arrays, with
/// the deadlines as timestamps and the statement's clock (`reaped_at`), from
/// which `walk_leases` derives both millisecond fields, and `busy`: how many
/// other sessions were running a statement (`lock_reap_busy`). It looks only
/// at the ranges whose number is `$5` modulo `$4` (`Ranges`).
pub const REAP_EXPIRED_WALK: &str = "
SELECT handoff_id, next_page, lock_keys, owner_ids, tokens, expires_at, reaped_at, waiters, busy
  FROM lock_reap_walk($1, $2, $3, $4, $5)";

/// Which of the heap's ranges a walk batch may take (`lock_reap_walk`'s
/// stride and phase): every one, or, for one of a sweeper's two walkers,
/// every other one, so that the two never read each other's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ranges {
    stride: i32,
    phase: i32,
}

impl Ranges {
    /// Every range: one walker.
    pub const ALL: Ranges = Ranges {
        stride: 1,
        phase: 0,
    };

    /// Walker `phase` (0 or 1) of two, taking alternate ranges.
    pub const fn every_other(phase: usize) -> Ranges {
        Ranges {
            stride: 2,
            phase: (phase % 2) as i32,
        }
    }
}

/// What an idle sweep asks first, in one statement (`lock_sweep_probe` in
/// `migrations/`): is any lease expired (and then, are others busy), is any
/// takeover recorded, and the shared held count (counted at most
/// `HELD_COUNT_MAX_AGE` ago, less what was swept since; NULL when something
/// is expired: the sweep reads it after deleting). Sent alone with the
/// simple protocol (`conn::probe_row`): one round trip, the argument a
/// compile-time literal.
pub const SWEEP_PROBE: &str = concat!(
    "SELECT expired, takeovers, held, busy FROM lock_sweep_probe(",
    held_count_max_age_ms!(),
    ")"
);

/// Leases currently held, expired-but-unswept ones included, from the count
/// the fleet shares (`lock_held_count_get` in `migrations/`): the stored
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

/// A row of `REAP_EXPIRED` or `DRAIN_TAKEOVERS`: a reaped lease (both
/// millisecond fields set) or, with `set_aside_error`, one left in place.
#[derive(FromRow)]
struct LeaseRow {
    lock_key: String,
    owner_id: String,
    token: i64,
    expired_at_millis: Option<i64>,
    overdue_millis: Option<i64>,
    set_aside_error: Option<String>,
}

/// A lease the function could not reap: left in place (or in the outbox),
/// reported so the daemon writes one ERROR line naming it and the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideLease {
    pub lock_key: String,
    pub owner_id: String,
    pub token: i64,
    pub reaped_by: ReapedBy,
    /// The database's error, with its SQLSTATE.
    pub cause: String,
}

/// What one batch returned: the leases reaped and those set aside.
#[derive(Debug, Default)]
pub struct LeaseBatch {
    pub reaped: Vec<ExpiredLease>,
    pub set_aside: Vec<SetAsideLease>,
}

fn split(rows: Vec<LeaseRow>, reaped_by: ReapedBy) -> LeaseBatch {
    let mut batch = LeaseBatch::default();
    for row in rows {
        match (
            row.set_aside_error,
            row.expired_at_millis,
            row.overdue_millis,
        ) {
            (None, Some(expired_at_millis), Some(overdue_millis)) => {
                batch.reaped.push(ExpiredLease {
                    lock_key: row.lock_key,
                    owner_id: row.owner_id,
                    token: row.token,
                    expired_at_millis,
                    overdue_millis,
                    reaped_by,
                })
            }
            (error, _, _) => batch.set_aside.push(SetAsideLease {
                lock_key: row.lock_key,
                owner_id: row.owner_id,
                token: row.token,
                reaped_by,
                cause: error.unwrap_or_else(|| "reaped without a deadline".to_owned()),
            }),
        }
    }
    batch
}

/// A batch that was reaped and handed off in one call.
#[derive(Debug, Default)]
pub struct HandedOff {
    /// The hand-off row holding `leases`; `None` when none was reaped.
    pub handoff_id: Option<i64>,
    pub leases: Vec<ExpiredLease>,
    pub set_aside: Vec<SetAsideLease>,
    /// Sessions that waited on the batch's row locks when it ended.
    pub waiters: u32,
    /// Other sessions running a statement when it ended (walk batches; 0
    /// for the index reap, which does not ask).
    pub busy: u32,
}

/// `REAP_EXPIRED`'s one row: the batch as parallel arrays (NULL when empty).
#[derive(FromRow)]
struct HandedOffRow {
    handoff_id: Option<i64>,
    lock_keys: Option<Vec<String>>,
    owner_ids: Option<Vec<String>>,
    tokens: Option<Vec<i64>>,
    expired_at_millis: Option<Vec<i64>>,
    overdue_millis: Option<Vec<i64>>,
    set_aside_keys: Option<Vec<String>>,
    set_aside_owner_ids: Option<Vec<String>>,
    set_aside_tokens: Option<Vec<i64>>,
    set_aside_errors: Option<Vec<String>>,
    waiters: i32,
}

/// Zips the arrays of one batch into leases; arrays of unequal length (which
/// the function never returns) are a decode error, not a lost lease.
fn zip_leases(
    keys: Option<Vec<String>>,
    owners: Option<Vec<String>>,
    tokens: Option<Vec<i64>>,
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
                token,
                expired_at_millis,
                overdue_millis,
                reaped_by: ReapedBy::Sweep,
            },
        )
        .collect())
}

pub async fn reap_expired(
    conn: &mut PgConnection,
    limit: usize,
    after_millis: Option<i64>,
) -> Result<HandedOff, sqlx::Error> {
    let row: HandedOffRow = sqlx::query_as(REAP_EXPIRED)
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
            token,
            reaped_by: ReapedBy::Sweep,
            cause,
        })
        .collect();
    Ok(HandedOff {
        handoff_id: row.handoff_id,
        leases,
        set_aside,
        waiters: u32::try_from(row.waiters).unwrap_or(0),
        busy: 0,
    })
}

pub async fn drain_takeovers(
    conn: &mut PgConnection,
    limit: usize,
) -> Result<LeaseBatch, sqlx::Error> {
    let rows: Vec<LeaseRow> = sqlx::query_as(DRAIN_TAKEOVERS)
        .persistent(false)
        .bind(conn::limit_param(limit))
        .fetch_all(conn)
        .await?;
    Ok(split(rows, ReapedBy::Takeover))
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
    token: i64,
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
            token: r.token,
            expired_at_millis: r.expired_at_millis,
            overdue_millis: r.overdue_millis,
            reaped_by: ReapedBy::Sweep,
        })
        .collect())
}

/// `REAP_EXPIRED_WALK`'s one row.
#[derive(FromRow)]
struct WalkRow {
    handoff_id: Option<i64>,
    next_page: i64,
    lock_keys: Option<Vec<String>>,
    owner_ids: Option<Vec<String>>,
    tokens: Option<Vec<i64>>,
    expires_at: Option<Vec<OffsetDateTime>>,
    reaped_at: OffsetDateTime,
    waiters: i32,
    busy: i32,
}

/// Milliseconds from `from` to `to`, floored (negative when `to` is
/// earlier): `lease_overdue_millis` in `migrations/`, and with the epoch as
/// `from`, `lease_epoch_millis`. PostgreSQL's timestamps count whole
/// microseconds, so this is exact.
fn floor_millis(from: OffsetDateTime, to: OffsetDateTime) -> i64 {
    let nanos = to.unix_timestamp_nanos() - from.unix_timestamp_nanos();
    // |nanos| < 2^72 for any two timestamps PostgreSQL stores: the quotient
    // fits an i64.
    nanos.div_euclid(1_000_000) as i64
}

/// Zips a walk batch's arrays into leases, both millisecond fields derived
/// from each deadline and the statement's clock.
fn walk_leases(row: WalkRow) -> Result<Vec<ExpiredLease>, sqlx::Error> {
    let expires_at = row.expires_at.unwrap_or_default();
    let reaped_at = row.reaped_at;
    let (expired, overdue) = expires_at
        .iter()
        .map(|&at| {
            (
                floor_millis(OffsetDateTime::UNIX_EPOCH, at),
                floor_millis(at, reaped_at),
            )
        })
        .unzip();
    zip_leases(
        row.lock_keys,
        row.owner_ids,
        row.tokens,
        Some(expired),
        Some(overdue),
    )
}

/// One walk batch, handed off: the leases and the page the next batch starts
/// at (-1 once the walk has reached the end of the table).
pub async fn reap_expired_walk(
    conn: &mut PgConnection,
    limit: usize,
    from_page: i64,
    skip_locked: bool,
    ranges: Ranges,
) -> Result<(HandedOff, i64), sqlx::Error> {
    let row: WalkRow = sqlx::query_as(REAP_EXPIRED_WALK)
        .persistent(false)
        .bind(conn::limit_param(limit))
        .bind(from_page)
        .bind(skip_locked)
        .bind(ranges.stride)
        .bind(ranges.phase)
        .fetch_one(conn)
        .await?;
    let (handoff_id, next_page) = (row.handoff_id, row.next_page);
    let waiters = u32::try_from(row.waiters).unwrap_or(0);
    let busy = u32::try_from(row.busy).unwrap_or(0);
    let batch = HandedOff {
        handoff_id,
        leases: walk_leases(row)?,
        set_aside: Vec::new(),
        waiters,
        busy,
    };
    Ok((batch, next_page))
}

/// `SWEEP_PROBE`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct SweepProbe {
    /// Some lease is past its deadline.
    pub expired: bool,
    /// Some takeover is recorded and not yet drained.
    pub takeovers: bool,
    /// The shared held count; `None` when `expired` (read after the sweep).
    pub held: Option<i64>,
    /// Other sessions running a statement, when `expired` (else 0).
    pub busy: i32,
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

    /// The walk's millisecond fields floor as `lease_epoch_millis` and
    /// `lease_overdue_millis` do, before 1970 too (the index path's
    /// `lock_reap_expired` computes them in SQL; both paths write the same
    /// line for the same lease).
    #[test]
    fn walk_millis_floor_like_the_sql() {
        let micros = |us: i128| OffsetDateTime::from_unix_timestamp_nanos(us * 1_000).unwrap();
        let epoch = OffsetDateTime::UNIX_EPOCH;
        let at = micros(1_796_378_400_000_999);
        assert_eq!(floor_millis(epoch, at), 1_796_378_400_000);
        let before = micros(-500);
        assert_eq!(floor_millis(epoch, before), -1, "floored, not truncated");
        let reaped = micros(1_796_378_401_000_998);
        assert_eq!(floor_millis(at, reaped), 999, "999.999 ms late");
        assert_eq!(
            floor_millis(reaped, at),
            -1000,
            "-999.999 ms floors to -1000"
        );
    }

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
