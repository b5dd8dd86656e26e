//! Setting a job kind's lease duration through `fn_job_kind_lease_set`:
//! every bad duration is refused with 22023 naming the bad part and changes
//! nothing, every change is audited whoever makes it, and only a role
//! granted the setter may set a duration, and only through it.
//!
//! Owns none of the leases a duration gives (jobs::lease_duration::claims) or
//! the `leases` command (jobs::lease_duration::cli).

use sqlx::PgConnection;

use crate::jobs::support::{kind_snapshot, set_kind};
use crate::support::{LoginRole, TestDb, exec, run_binary};

/// kind, old, new, actor, role: the audit in order.
type AuditRow = (String, Option<i32>, Option<i32>, String, String);

async fn audit(conn: &mut PgConnection) -> Vec<AuditRow> {
    sqlx::query_as(
        "SELECT job_kind, old_lease_sec, new_lease_sec, actor, changed_by_role
           FROM job_kind_lease_audit ORDER BY audit_id",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

async fn session_user(conn: &mut PgConnection) -> String {
    sqlx::query_scalar("SELECT session_user::text")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Runs `sql` as `conn`'s role, which must be refused with 42501.
async fn assert_denied(conn: &mut PgConnection, sql: &str) {
    let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .expect_err(&format!("must be denied: {sql}"));
    let code = err.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("42501"), "{sql}: {err}");
}

#[tokio::test]
async fn bad_duration_refused_with_22023() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_kind(&mut conn, "email", Some(60), "alice").await;
    let before = kind_snapshot(&mut conn).await;

    // kind, seconds, actor, what the message says.
    type Refused<'a> = (Option<&'a str>, Option<i32>, Option<&'a str>, &'a str);
    let refused: [Refused; 10] = [
        (
            Some("email"),
            Some(0),
            Some("alice"),
            "the lease duration of kind 'email' is a whole number of seconds from 1 to 86400 (NULL clears it), got 0",
        ),
        (Some("email"), Some(-1), Some("alice"), "got -1"),
        (Some("email"), Some(86401), Some("alice"), "got 86401"),
        (
            Some("email"),
            Some(i32::MAX),
            Some("alice"),
            "got 2147483647",
        ),
        (
            Some(""),
            Some(60),
            Some("alice"),
            "job kind must be a non-empty string, got ''",
        ),
        (
            None,
            Some(60),
            Some("alice"),
            "job kind must be a non-empty string, got NULL",
        ),
        (
            Some("email"),
            Some(60),
            Some(""),
            "actor is required (who is changing the lease duration of kind 'email'?)",
        ),
        (Some("email"), Some(60), Some("  "), "actor is required"),
        (Some("email"), None, None, "actor is required"),
        (Some("sms"), Some(0), Some(""), "actor is required"),
    ];
    for (kind, seconds, actor, message) in refused {
        let err = sqlx::query("SELECT fn_job_kind_lease_set($1, $2, $3)")
            .bind(kind)
            .bind(seconds)
            .bind(actor)
            .execute(&mut conn)
            .await
            .expect_err(&format!(
                "{kind:?}={seconds:?} by {actor:?} must be refused"
            ));
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("22023"), "{db_err}");
        assert!(
            db_err.message().starts_with("fn_job_kind_lease_set: ")
                && db_err.message().contains(message),
            "{kind:?}={seconds:?} by {actor:?}: {}",
            db_err.message()
        );
    }

    assert_eq!(
        kind_snapshot(&mut conn).await,
        before,
        "a refusal changed something"
    );
    // The bounds themselves are accepted.
    assert_eq!(
        set_kind(&mut conn, "email", Some(1), "alice").await["lease_sec"],
        1
    );
    assert_eq!(
        set_kind(&mut conn, "email", Some(86400), "alice").await["lease_sec"],
        86400
    );
}

#[tokio::test]
async fn every_change_audited() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let who = session_user(&mut conn).await;

    set_kind(&mut conn, "email", Some(60), "alice").await;
    set_kind(&mut conn, "email", Some(90), "bob").await;
    set_kind(&mut conn, "email", None, "carol").await;
    // Clearing a kind without a duration changes nothing: nothing to audit.
    set_kind(&mut conn, "never-set", None, "dave").await;
    for sql in [
        "INSERT INTO job_kind_lease (job_kind, lease_sec, updated_by) VALUES ('sms', 10, 'x')",
        "UPDATE job_kind_lease SET lease_sec = 20 WHERE job_kind = 'sms'",
        "DELETE FROM job_kind_lease WHERE job_kind = 'sms'",
        // The setter's actor never leaks onto a later direct write.
        "BEGIN; SELECT fn_job_kind_lease_set('push', 5, 'erin'); UPDATE job_kind_lease SET lease_sec = 6; COMMIT;",
    ] {
        exec(&mut conn, sql).await;
    }

    let direct = |op: &str| format!("direct {op} by {who}");
    let row = |kind: &str, old: Option<i32>, new: Option<i32>, actor: &str| -> AuditRow {
        (kind.into(), old, new, actor.into(), who.clone())
    };
    assert_eq!(
        audit(&mut conn).await,
        vec![
            row("email", None, Some(60), "alice"),
            row("email", Some(60), Some(90), "bob"),
            row("email", Some(90), None, "carol"),
            row("sms", None, Some(10), &direct("insert")),
            row("sms", Some(10), Some(20), &direct("update")),
            row("sms", Some(20), None, &direct("delete")),
            row("push", None, Some(5), "erin"),
            row("push", Some(5), Some(6), &direct("update")),
        ]
    );
    let stamped: (String, bool) = sqlx::query_as(
        "SELECT updated_by, updated_at IS NOT NULL FROM job_kind_lease WHERE job_kind = 'push'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(stamped, ("erin".to_owned(), true));
}

#[tokio::test]
async fn only_granted_role_sets_through_it() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    set_kind(&mut admin, "email", Some(60), "alice").await;
    let sweeper = LoginRole::create(&db, &mut admin, "sweeper", "IN ROLE lease_sweeper").await;
    let nobody = LoginRole::create(&db, &mut admin, "nobody", "").await;
    let operator = LoginRole::create(&db, &mut admin, "operator", "").await;
    exec(
        &mut admin,
        &format!(
            "GRANT EXECUTE ON FUNCTION fn_job_kind_lease_set(text, integer, text) TO {}",
            operator.role
        ),
    )
    .await;
    let before = kind_snapshot(&mut admin).await;

    for role in [&sweeper, &nobody, &operator] {
        let mut low = role.connect().await;
        if role.role != operator.role {
            // The sweeper role and PUBLIC may not call the setter.
            assert_denied(
                &mut low,
                "SELECT fn_job_kind_lease_set('email', 1, 'mallory')",
            )
            .await;
            assert_denied(
                &mut low,
                "SELECT fn_job_kind_lease_set('email', NULL, 'mallory')",
            )
            .await;
        }
        // Nobody but the owner writes the table or its audit directly.
        for sql in [
            "UPDATE job_kind_lease SET lease_sec = 1",
            "INSERT INTO job_kind_lease (job_kind, lease_sec, updated_by) VALUES ('x', 1, 'm')",
            "DELETE FROM job_kind_lease",
            "INSERT INTO job_kind_lease_audit (job_kind, new_lease_sec, actor) VALUES ('x', 1, 'm')",
            "DELETE FROM job_kind_lease_audit",
        ] {
            assert_denied(&mut low, sql).await;
        }
        sqlx::Connection::close(low).await.unwrap();
    }
    assert_eq!(kind_snapshot(&mut admin).await, before, "nothing changed");
    // The command says what the role lacks and what to do.
    for args in [
        &["leases"][..],
        &["leases", "set", "email", "1", "--actor", "mallory"][..],
    ] {
        let (code, out) = run_binary(args, &sweeper.url).await;
        assert_eq!(code, Some(1), "{args:?}: {out}");
        assert!(
            out.contains("(SQLSTATE 42501); `leases` needs SELECT on job_kind_lease")
                && out.contains("run it as an operator's role"),
            "{args:?}: {out}"
        );
    }

    // The operator's role, granted the setter, changes it, audited as itself.
    let mut op = operator.connect().await;
    set_kind(&mut op, "email", Some(120), "op@host").await;
    assert_eq!(
        audit(&mut admin).await.last().unwrap(),
        &(
            "email".to_owned(),
            Some(60),
            Some(120),
            "op@host".to_owned(),
            operator.role.clone()
        )
    );
    sqlx::Connection::close(op).await.unwrap();
    for role in [sweeper, nobody, operator] {
        role.drop(&mut admin).await;
    }
}
