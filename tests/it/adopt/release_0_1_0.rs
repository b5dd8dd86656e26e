//! What the first release's daemon (0.1.0) sends, recorded from it: every
//! statement its services run against the sidecar's objects, and the
//! columns and types it decodes from each. From that release on, `migrate`
//! keeps each of these answering as it did (expand now, contract a release
//! later), so a fleet upgrades host by host while the daemons not yet
//! restarted go on sweeping. These texts are copies, never the crate's
//! constants: a later release changes its own statements, not these. A
//! release that stops answering one of them fails here; drop a statement
//! from this list only a release after the daemon stopped sending it.

use sqlx::{Column as _, Executor as _, TypeInfo as _};

use crate::support::{TestDb, exec};

/// (statement, its result columns as (name, PostgreSQL type)).
const STATEMENTS: &[(&str, &[(&str, &str)])] = &[
    (
        "
SELECT handoff_id, lock_keys, owner_ids, tokens, expired_at_millis, overdue_millis,
       set_aside_keys, set_aside_owner_ids, set_aside_tokens, set_aside_errors
  FROM lock_reap_batch($1, $2)",
        &[
            ("handoff_id", "INT8"),
            ("lock_keys", "TEXT[]"),
            ("owner_ids", "TEXT[]"),
            ("tokens", "TEXT[]"),
            ("expired_at_millis", "INT8[]"),
            ("overdue_millis", "INT8[]"),
            ("set_aside_keys", "TEXT[]"),
            ("set_aside_owner_ids", "TEXT[]"),
            ("set_aside_tokens", "TEXT[]"),
            ("set_aside_errors", "TEXT[]"),
        ],
    ),
    (
        "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis, set_aside_error, reaped_by
  FROM lock_drain_takeovers($1)",
        &[
            ("lock_key", "TEXT"),
            ("owner_id", "TEXT"),
            ("token", "TEXT"),
            ("expired_at_millis", "INT8"),
            ("overdue_millis", "INT8"),
            ("set_aside_error", "TEXT"),
            ("reaped_by", "TEXT"),
        ],
    ),
    (
        "SELECT expired, takeovers, held FROM lock_sweep_probe(3000)",
        &[("expired", "BOOL"), ("takeovers", "BOOL"), ("held", "INT8")],
    ),
    (
        "SELECT held, recounted FROM lock_held_count_get($1)",
        &[("held", "INT8"), ("recounted", "BOOL")],
    ),
    (
        "SELECT lock_handoff_claim($1)",
        &[("lock_handoff_claim", "BOOL")],
    ),
    (
        "
SELECT lock_key, owner_id, token, expired_at_millis, overdue_millis
  FROM lock_handoff_recover()",
        &[
            ("lock_key", "TEXT"),
            ("owner_id", "TEXT"),
            ("token", "TEXT"),
            ("expired_at_millis", "INT8"),
            ("overdue_millis", "INT8"),
        ],
    ),
    (
        "SELECT r::text AS refusal, \
     CASE WHEN r IS NOT NULL THEN fn_job_stale_lease_count() END AS stale, \
     fn_job_reap_handoff_abandoned() AS abandoned \
     FROM fn_job_reaper_gate_refusal() AS r",
        &[
            ("refusal", "TEXT"),
            ("stale", "INT8"),
            ("abandoned", "BOOL"),
        ],
    ),
    (
        "SELECT handoff_id, report FROM fn_job_reap_stale_leases_apply_handed_off($1, $2)",
        &[("handoff_id", "INT8"), ("report", "TEXT")],
    ),
    (
        "SELECT fn_job_reap_handoff_claim($1)",
        &[("fn_job_reap_handoff_claim", "BOOL")],
    ),
    (
        "SELECT report FROM fn_job_reap_handoff_recover()",
        &[("report", "TEXT")],
    ),
    (
        "SELECT fn_job_stale_lease_count() AS stale",
        &[("stale", "INT8")],
    ),
];

/// Each recorded statement, described by the server of a database this
/// build's `migrate` made (as an upgraded database is), returns the columns
/// the first release's daemon decodes.
#[tokio::test]
async fn first_release_daemon_statements_answer_after_migrate() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    exec(&mut conn, "SET ROLE lease_sweeper").await;
    let mut wrong = Vec::new();
    for (sql, want) in STATEMENTS {
        let got: Vec<(String, String)> = match conn.describe(sqlx::SqlStr::from_static(sql)).await {
            Ok(d) => d
                .columns()
                .iter()
                .map(|c| (c.name().to_owned(), c.type_info().name().to_owned()))
                .collect(),
            Err(e) => {
                wrong.push(format!("{sql}\n  fails: {e}"));
                continue;
            }
        };
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        if got != want {
            wrong.push(format!(
                "{sql}\n  answers {got:?}\n  the release decodes {want:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
