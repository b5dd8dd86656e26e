//! `gates` and `jobs` print aligned tables for people and, with `--json`,
//! the SQL functions' JSON unchanged for scripts.

use lease_sweeper::cli::{GatesCommand, JobsCommand, LimitArg};
use lease_sweeper::testing::jobs::{Format, run_gates, run_jobs};

use crate::jobs::support::dry_run;
use crate::support::{SUBSTRATE, TestDb, insert_stale_jobs, set_setting};

async fn print_gates(db: &TestDb, format: Format) -> String {
    let mut out = Vec::new();
    run_gates(&db.target(), None, &mut out, format)
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn gates_table_shows_settings_and_verdict() {
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
        lines[lines.len() - 2..],
        [
            "apply now: refused (queue.lease.reaper_enabled=false): stale job leases are left alone",
            "to open that gate: lease-sweeper gates set queue.lease.reaper_enabled true --actor NAME"
        ]
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

/// Following each refusal's advice, word for word, opens the gates one by
/// one until the apply runs.
#[tokio::test]
async fn refused_apply_names_opening_command() {
    let db = TestDb::new().await;
    let mut refusals = Vec::new();
    loop {
        let mut out = Vec::new();
        let apply = JobsCommand::Apply {
            actor: "ops".into(),
            limit: LimitArg { limit: 10 },
        };
        let code = run_jobs(&db.target(), apply, &mut out, Format::Table)
            .await
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        let Some(advice) = text
            .lines()
            .find_map(|l| l.strip_prefix("to open that gate: "))
        else {
            assert_eq!(code, std::process::ExitCode::SUCCESS, "{text}");
            break;
        };
        assert_eq!(code, std::process::ExitCode::from(1), "{text}");
        refusals.push(text.lines().next().unwrap().to_owned());
        let words: Vec<&str> = advice.split_whitespace().collect();
        let [
            "lease-sweeper",
            "gates",
            "set",
            key,
            value,
            "--actor",
            "NAME",
        ] = words[..]
        else {
            panic!("not a gates set command: {advice}");
        };
        let set = GatesCommand::Set {
            key: key.into(),
            value: value.into(),
            actor: "ops".into(),
        };
        let mut ignored = Vec::new();
        run_gates(&db.target(), Some(set), &mut ignored, Format::Table)
            .await
            .unwrap();
        assert!(refusals.len() <= 3, "{refusals:?}");
    }
    assert_eq!(
        refusals,
        [
            "refused: queue.job_substrate.enabled=false",
            "refused: queue.lease.reaper_enabled=false",
            "refused: queue.lease.reaper_dry_run_only=true"
        ]
    );
}

#[tokio::test]
async fn dry_run_table_row_per_job_escaped() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    insert_stale_jobs(&mut conn, "kind\nFORGED", 2, 0, 5, 60_000).await;
    insert_stale_jobs(&mut conn, "last", 1, 0, 1, 60_000).await;

    let mut out = Vec::new();
    let cmd = JobsCommand::DryRun(LimitArg { limit: 10 });
    let code = run_jobs(&db.target(), cmd, &mut out, Format::Table)
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
async fn json_flag_prints_function_json() {
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

/// Each way a login fails says what to check, not only whether the server
/// is up: a missing database, a missing role, TLS the server lacks, and a
/// port nobody listens on.
#[tokio::test]
async fn login_failure_says_what_to_check() {
    let db = TestDb::new().await;
    let url = url::Url::parse(&db.url).unwrap();
    let with = |f: &dyn Fn(&mut url::Url)| {
        let mut u = url.clone();
        f(&mut u);
        u.to_string()
    };
    let cases = [
        (
            with(&|u| u.set_path("/no_such_database")),
            "does not exist",
            "(check the database name (the URL's path or PGDATABASE): it must exist",
        ),
        (
            with(&|u| u.set_username("no_such_role").unwrap()),
            "role \"no_such_role\" does not exist",
            "(check the user name, and that pg_hba.conf lets it connect from this host)",
        ),
        (
            with(&|u| {
                u.query_pairs_mut().append_pair("sslmode", "require");
            }),
            "TLS",
            "(check TLS: sslmode, sslrootcert (the server's CA), and that the server has TLS on)",
        ),
        (
            "postgres://nobody@127.0.0.1:1/none".to_owned(),
            "Connection refused",
            "(is the server up, and do the host and port name it?)",
        ),
    ];
    for (target, cause, hint) in cases {
        let (code, out) = crate::support::run_binary(&["migrate"], &target).await;
        assert_eq!(code, Some(1), "{target}: {out}");
        let lines: Vec<String> = out.lines().map(str::to_owned).collect();
        let error = &crate::support::events(&lines, "failed")[0]["error"];
        assert!(
            error.contains(cause) && error.contains(hint),
            "{target}: wants {cause:?} and {hint:?} in: {error}"
        );
    }
}

/// A step of `migrate` that fails is named, with the server's words and
/// SQLSTATE, what it leaves behind and what to do next; the `failed` line
/// says which command it was. Here a half-made lock server (a lock_session
/// but no lock_entry) is neither adopted nor overwritten.
#[tokio::test]
async fn failed_migration_named_with_fix() {
    let db = TestDb::empty().await;
    let mut conn = db.connect().await;
    crate::support::exec(&mut conn, "CREATE TABLE lock_session (x int)").await;

    let (code, out) = crate::support::run_binary(&["migrate"], &db.url).await;
    assert_eq!(code, Some(1), "{out}");
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    let failed = &crate::support::events(&lines, "failed")[0];
    assert_eq!(failed["command"], "migrate");
    for part in [
        "creating the stand-in lock server (sql/lock_server.sql) failed",
        "relation \"lock_session\" already exists (SQLSTATE 42P07)",
        "versioned migrations and functions were rolled back together",
        "then run lease-sweeper migrate again",
    ] {
        assert!(failed["error"].contains(part), "{part:?} in {failed:?}");
    }
    assert_eq!(
        crate::support::count(
            &mut conn,
            "SELECT count(*) FROM pg_class WHERE relname IN ('lock_entry', 'lock_expiry_outbox')"
        )
        .await,
        0,
        "nothing was created"
    );
}

/// README.md's environment table, row by row: the backquoted names of the
/// first column, then the meaning and the default as plain text (links to
/// their text, backquotes dropped, whitespace collapsed).
fn readme_environment() -> Vec<(Vec<String>, String, String)> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n### ")
        .find(|s| s.starts_with("Environment"))
        .expect("README.md has its Environment section");
    let section = section.split("\n## ").next().unwrap();
    let plain = |cell: &str| -> String {
        let mut text = String::new();
        let mut rest = cell;
        // [text](target) -> text
        while let Some(open) = rest.find('[') {
            let Some(close) = rest[open..].find("](").map(|i| open + i) else {
                break;
            };
            let end = rest[close..].find(')').map(|i| close + i).unwrap();
            text.push_str(&rest[..open]);
            text.push_str(&rest[open + 1..close]);
            rest = &rest[end + 1..];
        }
        text.push_str(rest);
        text.replace('`', "")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|row| {
            let cells: Vec<&str> = row.split(" | ").collect();
            let names = cells[0]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            let default = cells[2].trim_end_matches(" |").trim_end_matches('|').trim();
            (names, plain(cells[1]), plain(default))
        })
        .collect()
}

#[test]
fn help_environment_is_readmes_table() {
    let help: Vec<(Vec<String>, String, String)> = lease_sweeper::cli::ENVIRONMENT_TABLE
        .iter()
        .map(|v| {
            (
                v.names.iter().map(|n| (*n).to_owned()).collect(),
                v.meaning.split_whitespace().collect::<Vec<_>>().join(" "),
                v.default.to_owned(),
            )
        })
        .collect();
    assert_eq!(
        help,
        readme_environment(),
        "src/cli.rs's ENVIRONMENT_TABLE (left) and README.md's table (right)"
    );
    // And every page shows what its command reads.
    let top = lease_sweeper::cli::environment(None);
    for var in lease_sweeper::cli::ENVIRONMENT_TABLE {
        for name in var.names {
            assert!(top.contains(name), "the top-level help lacks {name}");
        }
    }
}

#[test]
fn help_log_filter_is_readmes() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let filter = lease_sweeper::cli::LEASE_EXPIRED_FILTER;
    assert!(
        filter.starts_with('^'),
        "anchored on the line's start: {filter}"
    );
    assert!(
        readme.contains(&format!("`{filter}`")),
        "README.md shows the log-based metric filter as the help does: `{filter}`"
    );
    let mut cmd = <lease_sweeper::cli::Cli as clap::CommandFactory>::command();
    let run = cmd.find_subcommand_mut("run").unwrap();
    let help = run.render_long_help().to_string();
    assert!(help.contains(&format!("`{filter}`")), "{help}");
    assert!(!help.contains("filter is `level=warn"), "{help}");
}
