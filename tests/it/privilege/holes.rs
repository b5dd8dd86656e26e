//! Privilege holes: planted overloads of built-ins never run as
//! the operator; the takeover trigger needs no outbox privilege and cannot
//! be shadowed; definer functions follow the schema they are installed in;
//! a pre-existing `lease_sweeper` is reused only if it is safe; the grant can
//! be scoped to one database; `check` warns about superuser-owned definers.

use std::time::Duration;

use lease_sweeper::testing::check::Status;
use sqlx::{Connection as _, PgConnection};

use crate::support::{
    Daemon, LoginRole, StatsdCapture, TestDb, assert_fails_with, count, events, exec,
    insert_expired, insert_stale_jobs, open_gates, own_cluster, run_binary, wait_until,
};

/// Overloads a role allowed to CREATE in `public` plants so that an
/// unqualified call by a more privileged session runs them: an aggregate
/// (`jsonb_agg(jsonb)`, `array_agg(text)`, beating pg_catalog's polymorphic
/// ones), a set-returning `unnest(text[])`, exact-typed `jsonb_build_object`
/// and `format` overloads that beat `VARIADIC "any"`, and an operator
/// `=(oid, regclass)` that beats the coercing built-in. Each records
/// current_user in `public.hits` if it ever runs.
const PLANT: &str = r#"
CREATE FUNCTION public.hit(what text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN INSERT INTO public.hits VALUES (what, current_user); END $$;
CREATE FUNCTION public.hit_sfunc(jsonb, jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('jsonb_agg'); RETURN $2; END $$;
CREATE AGGREGATE public.jsonb_agg(jsonb) (sfunc = public.hit_sfunc, stype = jsonb);
CREATE FUNCTION public.hit_tfunc(text[], text) RETURNS text[] LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('array_agg'); RETURN $1 || $2; END $$;
CREATE AGGREGATE public.array_agg(text) (sfunc = public.hit_tfunc, stype = text[]);
CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('unnest'); RETURN QUERY SELECT pg_catalog.unnest($1); END $$;
CREATE FUNCTION public.jsonb_build_object(text, jsonb, text, boolean, text, jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('jsonb_build_object/6'); RETURN '{}'; END $$;
CREATE FUNCTION public.jsonb_build_object(text, text, text, text, text, timestamptz, text, text) RETURNS jsonb LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('jsonb_build_object/8'); RETURN '{}'; END $$;
CREATE FUNCTION public.format(text, name) RETURNS text LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('format'); RETURN pg_catalog.format($1, $2); END $$;
CREATE FUNCTION public.hit_eq(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('=(oid,regclass)'); RETURN $1 = $2::oid; END $$;
CREATE OPERATOR public.= (leftarg = oid, rightarg = regclass, function = public.hit_eq);
CREATE FUNCTION public.floor(numeric) RETURNS numeric LANGUAGE plpgsql AS $$
    BEGIN PERFORM public.hit('floor'); RETURN 0; END $$;
"#;

/// Gives `role` CREATE on public and a `hits` table it may write, then
/// plants `PLANT` as that role.
async fn plant(admin: &mut PgConnection, role: &str, url: &str) {
    exec(
        admin,
        &format!(
            "GRANT CREATE ON SCHEMA public TO {role};
             CREATE TABLE IF NOT EXISTS public.hits (what text, as_user text);
             GRANT INSERT ON public.hits TO PUBLIC;"
        ),
    )
    .await;
    let mut planter = PgConnection::connect(url).await.unwrap();
    exec(&mut planter, PLANT).await;
    planter.close().await.unwrap();
}

async fn hits(conn: &mut PgConnection) -> Vec<(String, String)> {
    sqlx::query_as("SELECT what, as_user FROM public.hits")
        .fetch_all(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn planted_overloads_never_run_as_operator() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let LoginRole {
        role: planter,
        url: planter_url,
    } = LoginRole::create(&db, &mut admin, "planter", "").await;
    open_gates(&mut admin).await;
    insert_expired(&mut admin, "expired-", 5, 1_000).await;
    insert_expired(&mut admin, "stolen-", 2, 1_000).await;
    exec(&mut admin, "SELECT lock_acquire(lock_key, 'thief', 60000) FROM lock_entry WHERE lock_key LIKE 'stolen-%'").await;
    insert_stale_jobs(&mut admin, "dry", 2, 0, 5, 60_000).await;
    plant(&mut admin, &planter, &planter_url).await;
    let operator: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut admin)
        .await
        .unwrap();

    // Each command, run as the operator (a superuser here).
    let (code, out) = run_binary(&["gates"], &db.url).await;
    assert_eq!(code, Some(0), "gates: {out}");
    assert!(out.contains("queue.lease.reaper_enabled"), "{out}");
    let (code, out) = run_binary(&["jobs", "dry-run"], &db.url).await;
    assert_eq!(code, Some(0), "dry-run: {out}");
    let (code, out) = run_binary(&["leases", "set", "k", "60", "--actor", "ops"], &db.url).await;
    assert_eq!(code, Some(0), "leases set: {out}");
    let (code, out) = run_binary(&["leases"], &db.url).await;
    assert_eq!(code, Some(0), "leases: {out}");
    assert!(out.contains("every other kind: 300 s"), "{out}");
    let (code, out) = run_binary(&["check"], &db.url).await;
    assert_eq!(code, Some(1), "check fails on the planted overloads: {out}");
    assert!(
        out.contains(&format!(
            "function public.format(text, name) owned by {planter}"
        )) && out.contains(&format!(
            "function public.unnest(text[]) owned by {planter}"
        )) && out.contains(&format!(
            "operator public.=(oid, regclass) owned by {planter}"
        )),
        "check names them: {out}"
    );
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(1), "migrate refuses: {out}");
    assert!(
        out.contains("refusing to migrate: function public.array_agg(text) owned by")
            && out.contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC"),
        "{out}"
    );
    let (code, out) = run_binary(
        &["jobs", "apply", "--actor", "ops", "--limit", "1"],
        &db.url,
    )
    .await;
    assert_eq!(code, Some(0), "apply: {out}");

    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    insert_stale_jobs(&mut admin, "daemon", 3, 0, 5, 60_000).await;
    let mut daemon = Daemon::spawn(&[
        ("LOCKDB_URL", db.url.as_str()),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", &port),
    ]);
    wait_until(
        Duration::from_secs(15),
        "leases, takeovers and jobs",
        || async {
            let l = daemon.lines();
            events(&l, "lease_expired").len() >= 7 && events(&l, "job_lease_expired").len() >= 4
        },
    )
    .await;
    let (code, _) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", daemon.lines().join("\n"));

    let ran = hits(&mut admin).await;
    assert!(
        ran.is_empty(),
        "planted code ran (operator {operator}): {ran:?}"
    );
    // The planted objects are real and would have run unqualified.
    let hijacked: String =
        sqlx::query_scalar("SELECT jsonb_agg(x)::text FROM (VALUES ('1'::jsonb)) AS v(x)")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(hijacked, "1");
    assert_eq!(
        hits(&mut admin).await,
        vec![("jsonb_agg".to_owned(), operator.clone())],
        "control: an unqualified call does run the planted aggregate"
    );
    eprintln!(
        "FIGURES holes_planted: commands=8 (gates, dry-run, leases set, leases, check, migrate, apply, run) planted=9 ran_as_operator=0"
    );
}

#[tokio::test]
async fn migrate_refuses_planted_format_overload() {
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    let LoginRole {
        role: planter,
        url: planter_url,
    } = LoginRole::create(&db, &mut admin, "fresh", "").await;
    plant(&mut admin, &planter, &planter_url).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "function public.format(text, name) owned by {planter}"
        )),
        "{out}"
    );
    assert!(hits(&mut admin).await.is_empty());
    assert_eq!(
        count(
            &mut admin,
            "SELECT count(*) FROM pg_class WHERE relname = 'lock_entry'"
        )
        .await,
        0,
        "nothing was applied"
    );
    // Dropped as told: migrate runs.
    exec(&mut admin, &format!("DROP OWNED BY {planter}")).await;
    let (code, out) = run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(hits(&mut admin).await.is_empty());
}

#[tokio::test]
async fn takeovers_recorded_without_outbox_privileges() {
    let db = TestDb::new().await;
    let mut admin = db.connect().await;
    let LoginRole { role, url } = LoginRole::create(&db, &mut admin, "lockserver", "").await;
    exec(
        &mut admin,
        &format!(
            "GRANT SELECT, INSERT, UPDATE ON lock_entry TO {role};
             GRANT USAGE ON SEQUENCE lock_fencing_token_seq TO {role};"
        ),
    )
    .await;
    insert_expired(&mut admin, "k", 3, 1_000).await;
    let mut server = PgConnection::connect(&url).await.unwrap();
    exec(
        &mut server,
        "CREATE TEMP TABLE lock_expiry_outbox (outbox_id bigint, lock_key text, owner_id text, token bigint,
             expires_at timestamptz, taken_over_at timestamptz, new_token bigint);
         SET search_path = pg_temp, public;",
    )
    .await;
    for key in ["k1", "k2", "k3"] {
        let token: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, 'new-owner', 60000)")
            .bind(key)
            .fetch_one(&mut server)
            .await
            .unwrap();
        assert!(token.is_some(), "stole {key}");
    }
    let swallowed: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_temp.lock_expiry_outbox")
        .fetch_one(&mut server)
        .await
        .unwrap();
    assert_eq!(swallowed, 0, "the temp table got nothing");
    // It cannot forge one either.
    assert_fails_with(
        &mut server,
        "INSERT INTO public.lock_expiry_outbox (lock_key, owner_id, token, expires_at, new_token) VALUES ('forged', 'x', 1, now(), 2)",
        "42501",
    )
    .await;
    server.close().await.unwrap();
    let drained: Vec<String> =
        sqlx::query_scalar("SELECT lock_key FROM lock_drain_takeovers(10) ORDER BY 1")
            .fetch_all(&mut admin)
            .await
            .unwrap();
    assert_eq!(
        drained,
        vec!["k1", "k2", "k3"],
        "all three recorded in the real outbox"
    );
    exec(
        &mut admin,
        &format!("DROP OWNED BY {role}; DROP ROLE {role}"),
    )
    .await;
}

#[tokio::test]
async fn definers_act_on_their_own_schema() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    exec(&mut conn, "CREATE SCHEMA locks; SET search_path = locks").await;
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .expect("migrates into schema locks");
    // Same-named tables in public with the gates open and an expired lease.
    exec(
        &mut conn,
        "CREATE TABLE public.queue_setting (key text, value text);
         INSERT INTO public.queue_setting VALUES ('queue.job_substrate.enabled', 'true'),
             ('queue.lease.reaper_enabled', 'true'), ('queue.lease.reaper_dry_run_only', 'false');
         CREATE TABLE public.lock_entry (LIKE locks.lock_entry);
         INSERT INTO public.lock_entry (lock_key, owner_id, token, acquired_at, expires_at)
             VALUES ('public-decoy', 'o', 1, now(), now() - interval '1 hour');",
    )
    .await;
    let pinned: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, array_to_string(p.proconfig, ',') FROM pg_proc p
          WHERE p.pronamespace = 'locks'::regnamespace AND p.proconfig IS NOT NULL ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(pinned.len() >= 10, "{pinned:?}");
    for (name, config) in &pinned {
        // Either the installing schema, or no schema at all for a function
        // that names no table (pg_catalog and pg_temp only).
        assert!(
            config.contains("search_path=pg_catalog, locks, pg_temp")
                || config == "search_path=pg_catalog, pg_temp",
            "{name}: {config}"
        );
        assert!(!config.contains("public"), "{name}: {config}");
    }
    // Called from a session whose path is public first.
    exec(&mut conn, "SET search_path = public, locks").await;
    let out: String =
        sqlx::query_scalar("SELECT locks.fn_job_reap_stale_leases_apply('ops', 10)::text")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(
        out.contains("queue.job_substrate.enabled=false"),
        "reads locks.queue_setting: {out}"
    );
    exec(&mut conn, "INSERT INTO locks.lock_entry (lock_key, owner_id, token, expires_at) VALUES ('real', 'o', 2, now() - interval '1 s')").await;
    let reaped: Vec<String> =
        sqlx::query_scalar("SELECT unnest(lock_keys) FROM locks.lock_reap_batch(10)")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(reaped, vec!["real"], "never public's decoy");
}

#[tokio::test]
async fn loginable_lease_sweeper_role_refused() {
    let (pg, mut admin) = own_cluster(
        &[],
        &[
            "CREATE ROLE lease_sweeper LOGIN PASSWORD 'everybody-knows'",
            "CREATE DATABASE a",
            "CREATE DATABASE b",
        ],
    )
    .await;

    let (code, out) = run_binary(&["migrate"], &pg.url("a")).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("role lease_sweeper exists but is not the NOLOGIN role lease-sweeper creates (it has LOGIN)"), "{out}");
    assert!(
        out.contains("ALTER ROLE lease_sweeper NOLOGIN")
            && out.contains("DROP OWNED BY lease_sweeper"),
        "{out}"
    );

    exec(&mut admin, "ALTER ROLE lease_sweeper NOLOGIN PASSWORD NULL; CREATE ROLE stranger LOGIN IN ROLE lease_sweeper").await;
    let (code, out) = run_binary(&["migrate"], &pg.url("a")).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("has members (stranger) who would receive this database's sweep privileges"),
        "{out}"
    );
    let adopt = "COMMENT ON ROLE lease_sweeper IS 'lease-sweeper daemon role: NOLOGIN, members are sweeper hosts (docs/least-privilege.md)'";
    assert!(out.contains(adopt), "gives the adoption statement: {out}");

    exec(&mut admin, adopt).await;
    for database in ["a", "b"] {
        let (code, out) = run_binary(&["migrate"], &pg.url(database)).await;
        assert_eq!(code, Some(0), "{database}: {out}");
    }
    drop(admin);
    drop(pg);
}

#[tokio::test]
async fn revoking_connect_scopes_host_to_one_database() {
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    let mut admin_a = a.connect().await;
    let LoginRole { role, url: url_a } =
        LoginRole::create(&a, &mut admin_a, "host", "IN ROLE lease_sweeper").await;
    // As docs/least-privilege.md says: CONNECT only where the host sweeps.
    exec(
        &mut admin_a,
        &format!("REVOKE CONNECT ON DATABASE {} FROM PUBLIC", b.name),
    )
    .await;
    let mut url_b = url::Url::parse(&b.url).unwrap();
    url_b.set_username(&role).unwrap();
    let err = PgConnection::connect(url_b.as_str()).await.unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{err}"
    );
    assert!(
        err.to_string().contains("permission denied for database"),
        "{err}"
    );
    insert_expired(&mut admin_a, "k", 2, 1_000).await;
    let mut host = PgConnection::connect(&url_a).await.unwrap();
    let reaped: i64 = sqlx::query_scalar(
        "SELECT coalesce(cardinality(lock_keys), 0)::bigint FROM lock_reap_batch(10)",
    )
    .fetch_one(&mut host)
    .await
    .unwrap();
    assert_eq!(reaped, 2, "still sweeps its own database");
    host.close().await.unwrap();
    exec(
        &mut admin_a,
        &format!("DROP OWNED BY {role}; DROP ROLE {role}"),
    )
    .await;
}

#[tokio::test]
async fn check_warns_on_superuser_owned_definers() {
    let statsd = StatsdCapture::start().await;
    let su = TestDb::new().await;
    let report = lease_sweeper::testing::check::preflight(&su.target(), &statsd.target()).await;
    let line = report
        .lines
        .iter()
        .find(|l| l.what == "definer functions' owner")
        .unwrap();
    assert_eq!(line.status, Status::Warn, "{line:?}");
    assert!(
        line.to_string()
            .starts_with("warn  definer functions' owner: owned by superuser "),
        "{line}"
    );
    assert!(
        report.passed(),
        "a warning does not fail the check: {report}"
    );
    assert!(
        line.detail.contains("migrate as a dedicated owner role"),
        "{line:?}"
    );

    // The documented way: a dedicated, non-superuser owner migrates.
    let db = TestDb::empty().await;
    let mut admin = db.connect().await;
    let LoginRole {
        role: owner,
        url: owner_url,
    } = LoginRole::create(&db, &mut admin, "owner", "").await;
    exec(
        &mut admin,
        &format!("ALTER DATABASE {} OWNER TO {owner}", db.name),
    )
    .await;
    let (code, out) = run_binary(&["migrate"], &owner_url).await;
    assert_eq!(code, Some(0), "{out}");
    let target =
        lease_sweeper::testing::config::DbTarget::from_url("LOCKDB_URL", &owner_url).unwrap();
    let report = lease_sweeper::testing::check::preflight(&target, &statsd.target()).await;
    let line = report
        .lines
        .iter()
        .find(|l| l.what == "definer functions' owner")
        .unwrap();
    assert_eq!(line.status, Status::Ok, "{line:?}");
    assert_eq!(line.detail, format!("owned by {owner}, not a superuser"));
}
