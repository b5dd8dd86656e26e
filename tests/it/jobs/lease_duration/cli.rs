//! The `leases` command: in process, it shows each kind's duration and who
//! set it as a table and as JSON, and sets and clears; as the real binary,
//! it exits 0, 1 or 2 and prints refusals, and JSON for scripts.
//!
//! Owns none of the setter's own refusals and audit
//! (jobs::lease_duration::setter).

use std::process::ExitCode;

use lease_sweeper::cli::LeasesCommand;
use lease_sweeper::testing::jobs::{Format, run_leases};
use serde_json::{Value, json};

use crate::jobs::support::kind_snapshot;
use crate::support::{TestDb, run_binary};

/// `leases …` in process: exit code and what was printed.
async fn leases(db: &TestDb, command: Option<LeasesCommand>, format: Format) -> (ExitCode, String) {
    let mut out = Vec::new();
    let code = run_leases(&db.target(), command, &mut out, format)
        .await
        .expect("the command runs");
    (code, String::from_utf8(out).unwrap())
}

fn set(kind: &str, seconds: i32) -> Option<LeasesCommand> {
    Some(LeasesCommand::Set {
        kind: kind.into(),
        seconds,
        actor: "cli-operator".into(),
    })
}

#[tokio::test]
async fn shows_sets_and_clears() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;

    let (code, out) = leases(&db, set("report.render", 3600), Format::Table).await;
    assert_eq!(code, ExitCode::SUCCESS, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["KIND", "OLD_S", "NEW_S", "BY"]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["report.render", "-", "3600", "cli-operator"]
    );
    assert_eq!(
        *lines.last().unwrap(),
        "new claims and heartbeats of report.render lease for 3600 s; a lease in flight keeps its deadline until its next heartbeat"
    );
    leases(&db, set("email", 60), Format::Json).await;

    let (code, out) = leases(&db, None, Format::Table).await;
    assert_eq!(code, ExitCode::SUCCESS);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["KIND", "LEASE_S", "CHANGED", "BY"]
    );
    let rows: Vec<Vec<&str>> = lines[1..3]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows.iter().map(|r| (r[0], r[1], r[4])).collect::<Vec<_>>(),
        [
            ("email", "60", "cli-operator"),
            ("report.render", "3600", "cli-operator")
        ],
        "{out}"
    );
    assert_eq!(lines[3], "");
    assert!(
        lines[4].starts_with("every other kind: 300 s (queue.lease.duration_sec, changed ")
            && lines[4]
                .ends_with(" by migration); a job's metadata.lease_override_sec wins over both"),
        "{out}"
    );
    assert_eq!(lines.len(), 5, "{out}");

    let (code, out) = leases(&db, None, Format::Json).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(out.lines().count(), 1, "one line for a pipe: {out}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    let kinds: Vec<(Value, Value, Value)> = shown["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["job_kind"].clone(),
                k["lease_sec"].clone(),
                k["updated_by"].clone(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (json!("email"), json!(60), json!("cli-operator")),
            (json!("report.render"), json!(3600), json!("cli-operator"))
        ]
    );
    assert_eq!(
        (
            shown["default"]["setting"].clone(),
            shown["default"]["lease_sec"].clone(),
            shown["default"]["updated_by"].clone()
        ),
        (
            json!("queue.lease.duration_sec"),
            json!(300),
            json!("migration")
        )
    );

    // Clear: back to the default, said so.
    let clear = Some(LeasesCommand::Clear {
        kind: "email".into(),
        actor: "cli-operator".into(),
    });
    let (code, out) = leases(&db, clear, Format::Table).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(
        out.lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["email", "60", "-", "cli-operator"]
    );
    assert_eq!(
        out.lines().last().unwrap(),
        "email leases for the default: 300 s (queue.lease.duration_sec)"
    );

    // A rejected change: exit 1, `refused: …` (JSON with --json), nothing changed.
    let before = kind_snapshot(&mut conn).await;
    let (code, out) = leases(&db, set("email", 0), Format::Table).await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(
        out,
        "refused: fn_job_kind_lease_set: the lease duration of kind 'email' is a whole number of seconds from 1 to 86400 (NULL clears it), got 0\n"
    );
    let (code, out) = leases(&db, set("", 60), Format::Json).await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({
            "job_kind": "",
            "reason": "fn_job_kind_lease_set: job kind must be a non-empty string, got ''",
            "refused": true
        })
    );
    assert_eq!(kind_snapshot(&mut conn).await, before);
}

#[tokio::test]
async fn binary_exit_codes_and_json() {
    let db = TestDb::new().await;
    let json =
        |s: &str| -> Value { serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s:?}")) };
    let run = |args: &'static [&'static str]| {
        let url = db.url.clone();
        async move {
            let out = tokio::process::Command::new(crate::support::binary())
                .args(args)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("LOCKDB_URL", url)
                .output()
                .await
                .expect("running lease-sweeper");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };

    let (code, out, err) = run(&["leases", "set", "email", "60", "--actor", "ops", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let set = json(&out);
    assert_eq!(
        (
            set["job_kind"].clone(),
            set["lease_sec"].clone(),
            set["old_lease_sec"].clone()
        ),
        (json!("email"), json!(60), Value::Null)
    );
    let (code, out, _) = run(&["leases", "--json"]).await;
    assert_eq!(
        (code, json(&out)["kinds"][0]["lease_sec"].clone()),
        (Some(0), json!(60))
    );

    let (code, out, err) = run(&["leases", "set", "email", "-5", "--actor", "ops"]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(out.starts_with("refused: fn_job_kind_lease_set: "), "{out}");
    assert!(
        err.contains("message=kind_lease_rejected jobKind=email"),
        "{err}"
    );
    let (code, out, _) = run(&["leases", "clear", "email", "--actor", "", "--json"]).await;
    assert_eq!(
        (code, json(&out)["refused"].clone()),
        (Some(1), json!(true))
    );

    // Usage errors are clap's: exit 2, nothing sent.
    for args in [
        &["leases", "set", "email", "sixty", "--actor", "ops"][..],
        &["leases", "set", "email", "60"][..],
        &["leases", "clear", "email"][..],
        &["leases", "set", "email", "99999999999", "--actor", "ops"][..],
    ] {
        let out = std::process::Command::new(crate::support::binary())
            .args(args)
            .env("LOCKDB_URL", &db.url)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let (code, out, _) = run(&["leases", "--json"]).await;
    assert_eq!(
        (code, json(&out)["kinds"][0]["lease_sec"].clone()),
        (Some(0), json!(60))
    );
    let (code, out) = run_binary(&["leases", "clear", "email", "--actor", "ops"], &db.url).await;
    assert_eq!(code, Some(0), "{out}");
}
