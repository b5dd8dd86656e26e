//! `gates` and `jobs` print aligned tables for people and, with `--json`,
//! the SQL functions' JSON unchanged for scripts.

use lease_sweeper::cli::{GatesArgs, JobsCommand, LimitArg, OutputArgs};
use lease_sweeper::cmd::jobs::{Format, run_gates_as, run_jobs_as};

use crate::jobs_support::dry_run;
use crate::support::{SUBSTRATE, TestDb, insert_stale_jobs, set_setting};

async fn print_gates(db: &TestDb, format: Format) -> String {
    let mut out = Vec::new();
    let args = GatesArgs {
        command: None,
        output: OutputArgs::default(),
    };
    run_gates_as(&db.target(), args, &mut out, format)
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn gates_table_shows_every_setting_who_changed_it_and_what_an_apply_would_do() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    set_setting(&mut conn, SUBSTRATE, "true").await;

    let table = print_gates(&db, Format::Table).await;

    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["SETTING", "VALUE", "CHANGED", "BY"]
    );
    let substrate = lines.iter().find(|l| l.starts_with(SUBSTRATE)).unwrap();
    assert!(substrate.ends_with("   test-operator"), "{table}");
    assert!(substrate.contains("   true   "), "{table}");
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("queue.")).count(),
        5,
        "{table}"
    );
    assert_eq!(
        *lines.last().unwrap(),
        "apply now: refused (queue.lease.reaper_enabled=false): stale job leases are left alone"
    );
    // Columns line up: every row's VALUE starts where the header's does.
    let column = lines[0].find("VALUE").unwrap();
    for row in lines[1..6].iter() {
        assert_ne!(&row[column..=column], " ", "{row:?} misaligned in\n{table}");
        assert_eq!(
            &row[column - 3..column],
            "   ",
            "{row:?} misaligned in\n{table}"
        );
    }
}

#[tokio::test]
async fn dry_run_table_has_one_row_per_job_with_its_would_be_action_and_hostile_text_escaped() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "kind\nFORGED", 2, 0, 5, 60_000).await;
    insert_stale_jobs(&mut conn, "last", 1, 0, 1, 60_000).await;

    let mut out = Vec::new();
    let cmd = JobsCommand::DryRun(LimitArg { limit: 10 });
    let code = run_jobs_as(&db.target(), cmd, &mut out, Format::Table)
        .await
        .unwrap();
    let table = String::from_utf8(out).unwrap();

    assert_eq!(code, std::process::ExitCode::SUCCESS);
    let rows: Vec<&str> = table
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(
        rows.iter()
            .filter(|r| r.ends_with("reset_to_retry_waiting"))
            .count(),
        2
    );
    assert_eq!(
        rows.iter()
            .filter(|r| r.ends_with("move_to_dead_letter"))
            .count(),
        1
    );
    assert_eq!(
        rows.iter().filter(|r| r.contains("kind\\nFORGED")).count(),
        2,
        "{table}"
    );
    assert!(
        !table.lines().any(|l| l.starts_with("FORGED")),
        "a cell broke its row:\n{table}"
    );
    assert_eq!(
        table.lines().last().unwrap(),
        "3 stale job lease(s); showing 3 (--limit 10); dry run: nothing was changed"
    );
}

#[tokio::test]
async fn json_flag_prints_the_functions_json_unchanged() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "k", 2, 0, 5, 60_000).await;
    let expected = dry_run(&mut conn, Some(5)).await;

    let daemon_env = [("LOCKDB_URL", db.url.as_str())];
    let out = std::process::Command::new(crate::support::binary())
        .args(["jobs", "dry-run", "--limit", "5", "--json"])
        .envs(daemon_env)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line for a pipe: {stdout}");
    let mut printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // Only the clock differs between the two calls: the evaluation instant
    // and how overdue each job is (which may straddle a second).
    printed["evaluated_at"] = expected["evaluated_at"].clone();
    for (job, want) in printed["jobs"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .zip(expected["jobs"].as_array().unwrap())
    {
        job["overdue_seconds"] = want["overdue_seconds"].clone();
    }
    assert_eq!(printed, expected);
}
