//! Who can do what through the job-queue stale-lease reaper's SQL API
//! (docs/sql-api.md, docs/least-privilege.md): a role granted apply reaps
//! exactly as apply reaps and cannot mutate, redefine or reroute it, and a
//! role that may create in `public` cannot get its overloads run inside the
//! definer functions (`search_path` is pinned).
//!
//! Owns none of what apply reaps (jobs::apply) or the gates
//! (jobs::gates).

use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::jobs::support::job_row;
use crate::support::{LoginRole, TestDb, apply_stale_leases, insert_stale_jobs, open_gates};

/// Runs a statement returning one JSON value (as text) and parses it.
async fn json_of(conn: &mut PgConnection, sql: &'static str) -> Value {
    let text: String = sqlx::query_scalar(sql).fetch_one(conn).await.unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn apply_role_cannot_mutate_or_redefine() {
    let db = TestDb::new().await;
    let mut owner = db.connect().await;
    let login = LoginRole::with_password(&db, &mut owner, "reaper", "reaper-pw", "").await;
    let role = login.role.clone();
    let id = insert_stale_jobs(&mut owner, "guarded", 1, 4, 5, 1_000)
        .await
        .remove(0);
    open_gates(&mut owner).await;
    let mut low = login.connect().await;
    let denied = |r: Result<sqlx::postgres::PgQueryResult, sqlx::Error>, what: &str| {
        let err = r.expect_err(&format!("{what} must be denied"));
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{what}: {err}");
    };

    // Not executable by PUBLIC: the owner grants it to the reaper's role.
    denied(
        sqlx::query("SELECT fn_job_reap_stale_leases_apply('mallory', 10)")
            .execute(&mut low)
            .await,
        "apply before the grant",
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) TO {role}"
    )))
    .execute(&mut owner)
    .await
    .unwrap();

    // It cannot change the data, the gates, or the function.
    denied(
        sqlx::query("UPDATE job_queue SET state = 'queued'")
            .execute(&mut low)
            .await,
        "UPDATE job_queue",
    );
    denied(
        sqlx::query("DELETE FROM job_dead_letter")
            .execute(&mut low)
            .await,
        "DELETE job_dead_letter",
    );
    denied(
        sqlx::query(
            "UPDATE queue_setting SET value = 'false' WHERE key = 'queue.lease.reaper_enabled'",
        )
        .execute(&mut low)
        .await,
        "UPDATE queue_setting",
    );
    denied(
        sqlx::query(
            "SELECT fn_queue_setting_set('queue.lease.reaper_enabled', 'false', 'mallory')",
        )
        .execute(&mut low)
        .await,
        "the setter",
    );
    denied(
        sqlx::query(
            "CREATE OR REPLACE FUNCTION fn_job_reap_stale_leases_apply(p_actor text, p_limit integer)
             RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$",
        )
        .execute(&mut low)
        .await,
        "replacing apply",
    );
    denied(
        sqlx::query("ALTER FUNCTION fn_job_reap_stale_leases_apply(text, integer) SET search_path = pg_temp")
            .execute(&mut low)
            .await,
        "re-pinning apply's search_path",
    );
    // Objects of its own that shadow the real ones are not used.
    sqlx::raw_sql(
        "CREATE TEMP TABLE job_queue (job_id uuid);
         CREATE TEMP TABLE job_dead_letter (job_id uuid);
         SET search_path = pg_temp, public",
    )
    .execute(&mut low)
    .await
    .unwrap();

    let out = apply_stale_leases(&mut low, "mallory", Some(10)).await;

    assert_eq!(out["dead_letter_count"], 1, "{out}");
    assert_eq!(job_row(&mut owner, &id).await.0, "dead_letter");
    let moved: (String, String) =
        sqlx::query_as("SELECT moved_by, moved_by_role FROM job_dead_letter")
            .fetch_one(&mut owner)
            .await
            .unwrap();
    assert_eq!(
        moved,
        ("mallory".to_owned(), role.clone()),
        "the role behind the actor name is recorded"
    );
    sqlx::Connection::close(low).await.unwrap();
    login.drop(&mut owner).await;
}

#[tokio::test]
async fn public_overloads_never_run_in_definers() {
    let db = TestDb::new().await;
    let mut owner = db.connect().await;
    let login = LoginRole::with_password(&db, &mut owner, "creator", "creator-pw", "").await;
    let role = &login.role;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "GRANT CREATE ON SCHEMA public TO {role};
         GRANT EXECUTE ON FUNCTION fn_job_reap_stale_leases_apply(text, integer) TO {role};
         GRANT EXECUTE ON FUNCTION fn_queue_setting_set(text, text, text) TO {role};"
    )))
    .execute(&mut owner)
    .await
    .unwrap();
    insert_stale_jobs(&mut owner, "retry", 2, 0, 5, 1_000).await;
    insert_stale_jobs(&mut owner, "bury", 1, 0, 1, 1_000).await;
    open_gates(&mut owner).await;
    let mut low = login.connect().await;
    // Better-matching overloads than pg_catalog's variadic, polymorphic or
    // coercing ones, each recording who it ran as.
    sqlx::raw_sql(
        r#"CREATE TABLE public.hits (what text, as_user text);
           GRANT INSERT ON public.hits TO PUBLIC;
           CREATE FUNCTION public.hit(w text) RETURNS void LANGUAGE sql
               AS $$ INSERT INTO public.hits VALUES (w, current_user) $$;
           CREATE FUNCTION public.jsonb_build_object(text, text, text, boolean, text, bigint, text, bigint, text, jsonb)
               RETURNS jsonb LANGUAGE sql AS $$ SELECT public.hit('report'); SELECT '{}'::jsonb $$;
           CREATE FUNCTION public.jsonb_build_object(text, text, text, boolean, text, integer, text, integer, text, integer)
               RETURNS jsonb LANGUAGE sql AS $$ SELECT public.hit('limit'); SELECT '{}'::jsonb $$;
           CREATE FUNCTION public.jsonb_build_object(text, text, text, text, text, text, text, text, text, timestamptz)
               RETURNS jsonb LANGUAGE sql AS $$ SELECT public.hit('setter'); SELECT '{}'::jsonb $$;
           CREATE FUNCTION public.agg_step(jsonb, jsonb) RETURNS jsonb LANGUAGE sql
               AS $$ SELECT public.hit('jsonb_agg'); SELECT '[]'::jsonb $$;
           CREATE AGGREGATE public.jsonb_agg(jsonb) (sfunc = public.agg_step, stype = jsonb);
           CREATE FUNCTION public.mul_bi(bigint, interval) RETURNS interval LANGUAGE sql
               AS $$ SELECT public.hit('bigint*interval'); SELECT interval '0' $$;
           CREATE OPERATOR public.* (leftarg = bigint, rightarg = interval, function = public.mul_bi);
           CREATE FUNCTION public.mul_ni(numeric, integer) RETURNS numeric LANGUAGE sql
               AS $$ SELECT public.hit('numeric*integer'); SELECT 0::numeric $$;
           CREATE OPERATOR public.* (leftarg = numeric, rightarg = integer, function = public.mul_ni);"#,
    )
    .execute(&mut low)
    .await
    .unwrap();
    let limit: Value = json_of(
        &mut low,
        "SELECT fn_job_reap_stale_leases_apply('creator', 0)::text",
    )
    .await;
    let applied: Value = json_of(
        &mut low,
        "SELECT fn_job_reap_stale_leases_apply('creator', 10)::text",
    )
    .await;
    let setting: Value = json_of(
        &mut low,
        "SELECT fn_queue_setting_set('queue.lease.duration_sec', '60', 'creator')::text",
    )
    .await;

    let hits: Vec<(String, String)> = sqlx::query_as("SELECT what, as_user FROM public.hits")
        .fetch_all(&mut owner)
        .await
        .unwrap();
    assert!(
        hits.is_empty(),
        "attacker code ran inside a definer: {hits:?}"
    );
    assert_eq!(limit["reason"], "limit_out_of_range", "{limit}");
    assert_eq!(
        (
            applied["reset_count"].clone(),
            applied["dead_letter_count"].clone()
        ),
        (json!(2), json!(1))
    );
    let backoffs: Vec<&Value> = applied["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.get("backoff_sec"))
        .collect();
    assert_eq!(backoffs, [&json!(10), &json!(10)]);
    assert!(applied["actions"][0]["overdue_millis"].as_i64().unwrap() >= 1_000);
    let waits: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM scheduled_at - updated_at)::float8 FROM job_queue WHERE state = 'retry_waiting'",
    )
    .fetch_all(&mut owner)
    .await
    .unwrap();
    assert_eq!(waits, [10.0, 10.0]);
    assert_eq!(setting["value"], "60");
    // And no unqualified variadic/polymorphic JSON builder is left anywhere.
    let unqualified: Vec<String> = sqlx::query_scalar(
        r"SELECT proname::text FROM pg_proc
           WHERE proname ~ '^fn_(job|queue)_'
             AND prosrc ~ '(^|[^.a-z_])jsonb_(build_object|agg)\('",
    )
    .fetch_all(&mut owner)
    .await
    .unwrap();
    assert!(unqualified.is_empty(), "{unqualified:?}");
    sqlx::Connection::close(low).await.unwrap();
    login.drop(&mut owner).await;
}
