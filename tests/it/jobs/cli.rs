//! The job-queue CLI: `jobs apply` / `jobs dry-run` and `gates` in process
//! (`run_jobs`, `run_gates`) and through the real binary: exit codes, the
//! refusal JSON, one line on a pipe, and no password in an error.

use std::process::ExitCode;

use lease_sweeper::cli::{GatesCommand, JobsCommand, LimitArg};
use lease_sweeper::testing::jobs::{Format, run_gates, run_jobs};
use serde_json::{Value, json};

use crate::jobs::support::refusal;
use crate::support::{DRY_ONLY, REAPER, SUBSTRATE, TestDb, count, insert_stale_jobs};

async fn cli_jobs(db: &TestDb, cmd: JobsCommand) -> (ExitCode, Value) {
    let mut out = Vec::new();
    let code = run_jobs(&db.target(), cmd, &mut out, Format::Json)
        .await
        .expect("the command runs");
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text.lines().count(),
        1,
        "one JSON line when not a terminal: {text}"
    );
    (code, serde_json::from_str(&text).unwrap())
}

async fn cli_gates(db: &TestDb, command: Option<GatesCommand>) -> (ExitCode, Value) {
    let mut out = Vec::new();
    let code = run_gates(&db.target(), command, &mut out, Format::Json)
        .await
        .expect("the command runs");
    (
        code,
        serde_json::from_str(&String::from_utf8(out).unwrap()).unwrap(),
    )
}

fn gate_set(key: &str, value: &str) -> Option<GatesCommand> {
    Some(GatesCommand::Set {
        key: key.into(),
        value: value.into(),
        actor: "cli-operator".into(),
    })
}

fn cli_apply() -> JobsCommand {
    JobsCommand::Apply {
        actor: "cli-operator".into(),
        limit: LimitArg { limit: 100 },
    }
}

#[tokio::test]
async fn apply_exits_1_gated_0_opened() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "phase2_proof_retryable", 1, 0, 5, 2_000).await;
    insert_stale_jobs(&mut conn, "phase2_proof_dlq_bound", 1, 4, 5, 1_000).await;

    assert_eq!(
        cli_jobs(&db, cli_apply()).await,
        (
            ExitCode::from(1),
            refusal("queue.job_substrate.enabled=false")
        )
    );
    for (key, value) in [(SUBSTRATE, "true"), (REAPER, "true")] {
        assert_eq!(
            cli_gates(&db, gate_set(key, value)).await.0,
            ExitCode::SUCCESS
        );
    }
    assert_eq!(
        cli_jobs(&db, cli_apply()).await,
        (
            ExitCode::from(1),
            refusal("queue.lease.reaper_dry_run_only=true")
        )
    );
    let (code, dry) = cli_jobs(&db, JobsCommand::DryRun(LimitArg { limit: 10 })).await;
    assert_eq!(
        (
            code,
            dry["stale_lease_count"].clone(),
            dry["mutation"].clone()
        ),
        (ExitCode::SUCCESS, json!(2), json!(false))
    );

    let (code, set) = cli_gates(&db, gate_set(DRY_ONLY, "false")).await;
    assert_eq!(
        (code, set["value"].clone(), set["updated_by"].clone()),
        (ExitCode::SUCCESS, json!("false"), json!("cli-operator"))
    );
    let (code, shown) = cli_gates(&db, None).await;
    assert_eq!(
        (
            code,
            shown["apply_allowed"].clone(),
            shown["apply_refusal"].clone()
        ),
        (ExitCode::SUCCESS, json!(true), Value::Null)
    );
    assert_eq!(shown["settings"].as_array().unwrap().len(), 5);
    let (code, out) = cli_jobs(&db, cli_apply()).await;

    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        (out["reset_count"].clone(), out["dead_letter_count"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(out["actions"][0]["action"], "reset_to_retry_waiting");
    assert_eq!(out["actions"][0]["backoff_sec"], 10);
    assert_eq!(out["actions"][1]["action"], "moved_to_dead_letter");
    assert_eq!(out["actions"][1]["attempts"], 5);
}

#[tokio::test]
async fn gates_set_bad_key_exits_1() {
    let db = TestDb::new().await;

    let (code, out) = cli_gates(&db, gate_set("queue.lease.reaper_enabeld", "true")).await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(out["refused"], true);
    let reason = out["reason"].as_str().unwrap();
    assert!(
        reason.contains("unknown setting key \"queue.lease.reaper_enabeld\""),
        "{reason}"
    );
    assert!(
        reason.contains("queue.lease.reaper_enabled"),
        "lists the known keys: {reason}"
    );

    let (code, out) = cli_gates(&db, gate_set(REAPER, "on")).await;
    assert_eq!(code, ExitCode::from(1));
    assert!(
        out["reason"]
            .as_str()
            .unwrap()
            .contains("must be true or false"),
        "{out}"
    );

    let (_, shown) = cli_gates(&db, None).await;
    assert_eq!(
        shown["apply_refusal"],
        refusal("queue.job_substrate.enabled=false")
    );
    let mut conn = db.connect().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM queue_setting_audit").await,
        0
    );
}

#[tokio::test]
async fn database_errors_carry_no_password() {
    let dir = std::env::temp_dir().join(format!("ls-jobs-nodb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = lease_sweeper::testing::config::DbTarget::from_url(
        "LOCKDB_URL",
        &format!(
            "postgres://reaper:Hunter2-S3cret@localhost/locks?host={}",
            dir.display()
        ),
    )
    .unwrap();
    let mut out = Vec::new();

    let err = run_jobs(&target, cli_apply(), &mut out, Format::Json)
        .await
        .unwrap_err();

    let msg = format!("{err:#}");
    assert!(!msg.contains("Hunter2-S3cret"), "{msg}");
    assert!(
        msg.contains("postgres://reaper@/locks?host="),
        "names the target: {msg}"
    );
    assert!(out.is_empty());
}

/// Runs the real binary with only `LOCKDB_URL` (and PATH) set; returns the
/// exit code, stdout and stderr.
/// It runs as a script does: with `--json`.
async fn binary(db: &TestDb, args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(crate::support::binary())
        .args(args)
        .arg("--json")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("LOCKDB_URL", &db.url)
        .output()
        .await
        .expect("running lease-sweeper");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn binary_reproduces_refusals_and_proof() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "phase2_proof_retryable", 1, 0, 5, 2_000).await;
    insert_stale_jobs(&mut conn, "phase2_proof_dlq_bound", 1, 4, 5, 1_000).await;
    let json =
        |s: &str| -> Value { serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s:?}")) };

    let (code, out, _) = binary(&db, &["jobs", "apply", "--actor", "ops"]).await;
    assert_eq!(
        (code, json(&out)),
        (Some(1), refusal("queue.job_substrate.enabled=false"))
    );
    assert_eq!(out.lines().count(), 1, "one line on a pipe: {out:?}");

    let (code, out, err) = binary(
        &db,
        &["gates", "set", "queue.bogus", "true", "--actor", "ops"],
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(json(&out)["refused"], true);
    assert!(
        err.contains("unknown setting key"),
        "a clear message on stderr: {err}"
    );

    for (key, value, reason) in [
        (SUBSTRATE, "true", "queue.lease.reaper_enabled=false"),
        (REAPER, "true", "queue.lease.reaper_dry_run_only=true"),
    ] {
        let (code, out, err) = binary(&db, &["gates", "set", key, value, "--actor", "ops"]).await;
        assert_eq!(
            (code, json(&out)["value"].clone()),
            (Some(0), json!(value)),
            "{err}"
        );
        let (code, out, _) = binary(&db, &["jobs", "apply", "--actor", "ops"]).await;
        assert_eq!((code, json(&out)), (Some(1), refusal(reason)));
    }
    let (code, out, _) = binary(&db, &["jobs", "dry-run", "--limit", "1"]).await;
    let dry = json(&out);
    assert_eq!(
        (code, dry["stale_lease_count"].clone(), dry["limit"].clone()),
        (Some(0), json!(2), json!(1))
    );
    binary(&db, &["gates", "set", DRY_ONLY, "false", "--actor", "ops"]).await;
    let (code, out, _) = binary(&db, &["gates"]).await;
    assert_eq!(
        (code, json(&out)["apply_allowed"].clone()),
        (Some(0), json!(true))
    );

    let (code, out, _) = binary(&db, &["jobs", "apply", "--actor", "phase2_proof_reaper"]).await;

    let applied = json(&out);
    assert_eq!(code, Some(0));
    assert_eq!(applied["actor"], "phase2_proof_reaper");
    assert_eq!(
        (
            applied["reset_count"].clone(),
            applied["dead_letter_count"].clone()
        ),
        (json!(1), json!(1))
    );
    assert_eq!(applied["actions"][0]["backoff_sec"], 10);
    assert_eq!(applied["actions"][1]["attempts"], 5);
    // Usage errors are clap's: exit 2.
    assert_eq!(
        binary(&db, &["jobs", "apply"]).await.0,
        Some(2),
        "--actor is required"
    );
    assert_eq!(
        binary(&db, &["jobs", "dry-run", "--limit", "0"]).await.0,
        Some(2)
    );
}

#[tokio::test]
async fn json_indented_on_terminal_one_line_otherwise() {
    let db = TestDb::new().await;
    let dry = || JobsCommand::DryRun(LimitArg { limit: 5 });
    let mut pretty = Vec::new();
    let mut plain = Vec::new();

    run_jobs(&db.target(), dry(), &mut pretty, Format::PrettyJson)
        .await
        .unwrap();
    run_jobs(&db.target(), dry(), &mut plain, Format::Json)
        .await
        .unwrap();

    let (pretty, plain) = (
        String::from_utf8(pretty).unwrap(),
        String::from_utf8(plain).unwrap(),
    );
    assert!(pretty.lines().count() > 3, "{pretty}");
    assert_eq!(plain.lines().count(), 1, "{plain}");
    let mut a: Value = serde_json::from_str(&pretty).unwrap();
    let mut b: Value = serde_json::from_str(&plain).unwrap();
    a["evaluated_at"].take();
    b["evaluated_at"].take();
    assert_eq!(a, b);
}
