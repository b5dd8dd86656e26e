//! Least privilege against an attacker holding the sweeper's credential:
//! the SECURITY DEFINER reaper and lock functions cannot be hijacked through
//! `search_path` (objects planted in `pg_temp` or a schema of the attacker's)
//! nor by an overload created in `public`; they reap exactly what expired.
//! What the role itself may and may not do is `privilege::role`.

use sqlx::{Connection as _, PgConnection};

use crate::privilege::support::{GRANTED, assert_denied, insert_live_job, job_state};
use crate::support::{
    LoginRole, TestDb, apply_stale_leases, insert_expired, insert_stale_jobs, open_gates,
};

/// Objects an attacker (a LOGIN role granted `lease_sweeper`, say a stolen
/// sweeper credential) plants so that a definer function resolving names
/// through the caller's `search_path` would use them. Each records a hit in
/// `evil.hits` if it ever runs.
const PLANT_IN_EVIL_AND_PG_TEMP: &str = "
CREATE TABLE evil.hits (what text, as_user text);
GRANT INSERT ON evil.hits TO PUBLIC;
CREATE TABLE evil.queue_setting (key text, value text);
INSERT INTO evil.queue_setting VALUES ('queue.job_substrate.enabled', 'true'),
    ('queue.lease.reaper_enabled', 'true'), ('queue.lease.reaper_dry_run_only', 'false');
CREATE TABLE evil.job_queue (job_id uuid, job_kind text, payload jsonb, state text, attempts integer, max_attempts integer,
    scheduled_at timestamptz, lease_owner text, lease_until timestamptz, last_error text, metadata jsonb,
    created_at timestamptz, updated_at timestamptz);
CREATE TABLE evil.lock_entry (lock_key text PRIMARY KEY, session_id uuid, owner_id text, token bigint, acquired_at timestamptz, expires_at timestamptz);
INSERT INTO evil.lock_entry (lock_key, owner_id, token, acquired_at, expires_at)
    VALUES ('planted', 'evil', 1, now(), now() - interval '1 h');
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO evil.hits VALUES ('now', current_user); RETURN pg_catalog.now() + interval '1 day'; END $$;
CREATE FUNCTION evil.fn_job_reaper_gate_refusal() RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO evil.hits VALUES ('gate', current_user); RETURN NULL; END $$;
CREATE FUNCTION evil.fn_job_reaper_limit_refusal(integer) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO evil.hits VALUES ('limit', current_user); RETURN NULL; END $$;
CREATE FUNCTION evil.jsonb_build_object(text, text, text, boolean, text, integer, text, integer, text, integer)
    RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO evil.hits VALUES ('jsonb_build_object', current_user); RETURN NULL; END $$;
CREATE TEMP TABLE queue_setting (key text, value text);
INSERT INTO pg_temp.queue_setting VALUES ('queue.job_substrate.enabled', 'true'),
    ('queue.lease.reaper_enabled', 'true'), ('queue.lease.reaper_dry_run_only', 'false');
CREATE TEMP TABLE job_queue (job_id uuid, job_kind text, payload jsonb, state text, attempts integer, max_attempts integer,
    scheduled_at timestamptz, lease_owner text, lease_until timestamptz, last_error text, metadata jsonb,
    created_at timestamptz, updated_at timestamptz);
CREATE TEMP TABLE lock_entry (lock_key text PRIMARY KEY, session_id uuid, owner_id text, token bigint, acquired_at timestamptz, expires_at timestamptz);
CREATE TEMP TABLE lock_expiry_outbox (outbox_id bigint, lock_key text, owner_id text, token bigint,
    expires_at timestamptz, taken_over_at timestamptz, new_token bigint);
INSERT INTO pg_temp.lock_expiry_outbox VALUES (1, 'planted', 'evil', 1, now(), now(), 2);
CREATE FUNCTION pg_temp.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO evil.hits VALUES ('pg_temp.now', current_user); RETURN pg_catalog.now() + interval '1 day'; END $$;
SET search_path = evil, pg_temp, public;
";

/// A live lease ('live', returned token), an expired one ('expired') and a
/// recorded takeover (of 'stolen').
async fn live_lease_and_one_expired_and_one_takeover(admin: &mut PgConnection) -> i64 {
    insert_expired(admin, "expired", 1, 1_000).await;
    insert_expired(admin, "stolen", 1, 1_000).await;
    sqlx::query("SELECT lock_acquire('stolen1', 'thief', 60000)")
        .execute(&mut *admin)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT lock_acquire('live', 'holder', 60000)")
        .fetch_one(admin)
        .await
        .unwrap()
}

/// Calls the two lock definers as `low` and checks they reaped exactly the
/// expired lease and the takeover, leaving the live leases.
async fn assert_reaps_only_what_expired(
    low: &mut PgConnection,
    admin: &mut PgConnection,
    live: i64,
) {
    let reaped: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM lock_reap_batch(100)")
            .fetch_all(&mut *low)
            .await
            .unwrap();
    assert_eq!(reaped, vec!["expired1"]);
    let drained: Vec<String> = sqlx::query_scalar("SELECT lock_key FROM lock_drain_takeovers(100)")
        .fetch_all(&mut *low)
        .await
        .unwrap();
    assert_eq!(drained, vec!["stolen1"]);
    let left: Vec<String> = sqlx::query_scalar("SELECT lock_key FROM lock_entry ORDER BY 1")
        .fetch_all(&mut *admin)
        .await
        .unwrap();
    assert_eq!(left, vec!["live", "stolen1"], "live leases untouched");
    let token: i64 = sqlx::query_scalar("SELECT token FROM lock_entry WHERE lock_key = 'live'")
        .fetch_one(admin)
        .await
        .unwrap();
    assert_eq!(token, live);
}

#[tokio::test]
async fn search_path_never_reaches_definer() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let login = LoginRole::create(&db, &mut admin, "mallory", GRANTED).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA evil AUTHORIZATION {}",
        login.role
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let stale = insert_stale_jobs(&mut admin, "stale", 1, 0, 5, 60_000).await;
    let live = insert_live_job(&mut admin).await;
    let live_lease = live_lease_and_one_expired_and_one_takeover(&mut admin).await;
    let mut low = login.connect().await;
    sqlx::raw_sql(PLANT_IN_EVIL_AND_PG_TEMP)
        .execute(&mut low)
        .await
        .unwrap();
    assert_denied(
        &mut low,
        "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT pg_catalog.now() + interval '1 day' $$",
    )
    .await;

    // Its own limit check and the real gates still decide.
    let out = apply_stale_leases(&mut low, "mallory", Some(0)).await;
    assert_eq!(out["reason"], "limit_out_of_range", "{out}");
    let out = apply_stale_leases(&mut low, "mallory", Some(10)).await;
    assert_eq!(out["reason"], "queue.job_substrate.enabled=false", "{out}");
    // With the real gates open it reaps the real stale job and not the live
    // one that a planted now() would have made look stale.
    open_gates(&mut admin).await;
    let out = apply_stale_leases(&mut low, "mallory", Some(10)).await;
    assert_eq!(
        (
            out["reset_count"].as_i64(),
            out["dead_letter_count"].as_i64()
        ),
        (Some(1), Some(0)),
        "{out}"
    );
    assert_eq!(job_state(&mut admin, &stale[0]).await, "retry_waiting");
    assert_eq!(job_state(&mut admin, &live).await, "leased");
    // The lock sweep's definers: the real expired lease and the real
    // takeover, and not the live lease a planted now() would have expired.
    assert_reaps_only_what_expired(&mut low, &mut admin, live_lease).await;
    let hits: Vec<(String, String)> = sqlx::query_as("SELECT what, as_user FROM evil.hits")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    assert!(hits.is_empty(), "a planted object ran: {hits:?}");
    low.close().await.unwrap();
    login.drop(&mut admin).await;
}

/// Databases created before PostgreSQL 15 let every role CREATE in `public`.
/// There, an overload with exact argument types of a function a definer calls
/// (`jsonb_build_object(VARIADIC "any")`) would win over pg_catalog's and run
/// as the function's owner, unless the definer qualifies its calls; the lock
/// definers are tried with a planted `now()` and `floor(numeric)` too.
#[tokio::test]
async fn public_overload_cannot_hijack() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let login = LoginRole::create(&db, &mut admin, "overload", GRANTED).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "GRANT CREATE ON SCHEMA public TO {0};
         CREATE TABLE hits (what text, as_user text);
         GRANT INSERT ON hits TO {0};",
        login.role
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let live_lease = live_lease_and_one_expired_and_one_takeover(&mut admin).await;
    let mut low = login.connect().await;
    sqlx::raw_sql(
        "CREATE FUNCTION public.jsonb_build_object(text, text, text, boolean, text, integer, text, integer, text, integer)
             RETURNS jsonb LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.hits VALUES ('jsonb_build_object', current_user); RETURN NULL; END $$;
         CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.hits VALUES ('now', current_user); RETURN pg_catalog.now() + interval '1 day'; END $$;
         CREATE FUNCTION public.floor(numeric) RETURNS numeric LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.hits VALUES ('floor', current_user); RETURN 0; END $$;
         SET search_path = public, pg_catalog;",
    )
    .execute(&mut low)
    .await
    .unwrap();

    let out = apply_stale_leases(&mut low, "mallory", Some(0)).await;
    assert_reaps_only_what_expired(&mut low, &mut admin, live_lease).await;
    let hits: Vec<(String, String)> = sqlx::query_as("SELECT what, as_user FROM hits")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    low.close().await.unwrap();
    login.drop(&mut admin).await;
    assert!(
        hits.is_empty(),
        "attacker code ran inside the definer: {hits:?}"
    );
    assert_eq!(out["reason"], "limit_out_of_range", "{out}");
}
