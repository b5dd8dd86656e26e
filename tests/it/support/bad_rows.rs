//! Helpers the bad-row suites share (`locks::bad_rows`, `jobs::bad_rows`): the
//! migration before the bad-row rules, the documented encodings of an
//! infinite deadline, a refusal with its SQLSTATE, and the real daemon run
//! until its log shows what a test waits for. The database helpers every
//! suite shares live beside it in `support`.

use std::time::Duration;

use sqlx::PgConnection;

use crate::support::{Daemon, StatsdCapture, TestDb, events, wait_until};

/// How an infinite deadline is reported: a `-infinity` deadline's
/// `expiredAtMillis` and its `overdueMillis` saturate at i64's bounds.
pub const I64_MIN: &str = "-9223372036854775808";
/// See `I64_MIN`.
pub const I64_MAX: &str = "9223372036854775807";

/// An operator's legal hold: a trigger on each of `tables` refusing to
/// delete a row whose `lock_key` is LIKE `keys` (`legal hold on <key>`,
/// SQLSTATE P0001). `DROP FUNCTION legal_hold() CASCADE` lifts it.
pub async fn legal_hold(conn: &mut PgConnection, keys: &str, tables: &[&str]) {
    let mut sql = format!(
        "CREATE FUNCTION legal_hold() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF OLD.lock_key LIKE '{keys}' THEN RAISE EXCEPTION 'legal hold on %', OLD.lock_key; END IF;
             RETURN OLD;
         END $$;"
    );
    for table in tables {
        sql.push_str(&format!(
            "\nCREATE TRIGGER legal_hold BEFORE DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION legal_hold();"
        ));
    }
    crate::support::exec(conn, &sql).await;
}

/// Runs `sql`, which must fail with `code`; returns the error text.
pub async fn refused_with(conn: &mut PgConnection, sql: &str, code: &str) -> String {
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .expect_err(&format!("must be refused: {sql}"));
    let got = err.as_database_error().and_then(|e| e.code());
    assert_eq!(got.as_deref(), Some(code), "{sql}: {err}");
    err.to_string()
}

/// The real daemon on `db` until `done(lines)`; then SIGTERM, exit 0.
pub async fn daemon_until(
    db: &TestDb,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    daemon_with_statsd_until(db, what, |l, _| done(l)).await.0
}

/// The same, with the StatsD capture it sent to.
pub async fn daemon_with_statsd_until(
    db: &TestDb,
    what: &str,
    done: impl Fn(&[String], &StatsdCapture) -> bool,
) -> (Vec<String>, StatsdCapture) {
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", db.url.as_str()),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
    ]);
    wait_until(Duration::from_secs(20), what, || async {
        done(&daemon.lines(), &statsd)
    })
    .await;
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    (lines, statsd)
}

pub fn keys(lines: &[String], event: &str, field: &str) -> Vec<String> {
    let mut k: Vec<String> = events(lines, event)
        .iter()
        .map(|f| f[field].clone())
        .collect();
    k.sort();
    k
}

pub fn error_lines(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains("level=error")).collect()
}
