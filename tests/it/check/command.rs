//! The real `lease-sweeper check` binary: exits 0 or 1 (2 for a
//! configuration error), prints its list on stdout and no password, and its
//! `--help` sample counts the migrations and checks it really runs. What the
//! checks find is `check::schema` and `check::connection`.

use std::time::{Duration, Instant};

use lease_sweeper::testing::check::{EXPECTED, GRANTS};

use crate::check::support::{PASSWORD, with_credentials};
use crate::support::{Daemon, StatsdCapture, TestDb, binary};

#[tokio::test]
async fn exit_codes_stdout_and_no_password() {
    let migrated = TestDb::new().await;
    let empty = TestDb::empty().await;
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    for (db, expected) in [(&migrated, 0), (&empty, 1)] {
        let (url, secret) = with_credentials(&db.url, PASSWORD);
        let started = Instant::now();
        let out = tokio::process::Command::new(binary())
            .arg("check")
            .env_clear()
            .env("LOCKDB_URL", &url)
            .env("STATSD_PORT", &port)
            .output()
            .await
            .expect("running lease-sweeper check");
        let took = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(expected), "{stdout}{stderr}");
        // The superuser's warnings leave the exit status alone.
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("warn  ")).count(),
            if expected == 0 { 2 } else { 1 },
            "{stdout}"
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert!(!stdout.contains(&secret) && !stderr.contains(&secret));
        let verdict = if expected == 0 {
            "check passed"
        } else {
            "check FAILED"
        };
        assert!(
            stdout
                .trim_end()
                .lines()
                .last()
                .unwrap_or("")
                .starts_with(verdict),
            "{stdout}"
        );
        // One line per check on a migrated database; an unmigrated one gets
        // a single schema line instead of one per object and grant.
        let lines = stdout.lines().count();
        if expected == 0 {
            assert!(lines > EXPECTED.len() + GRANTS.len(), "{stdout}");
        } else {
            assert!(lines < 10, "{stdout}");
            assert_eq!(
                stdout.lines().filter(|l| l.starts_with("FAIL")).count(),
                1,
                "{stdout}"
            );
        }
        assert!(
            stderr.trim().is_empty(),
            "diagnostics only on trouble: {stderr}"
        );
    }
    // A configuration error stays exit 2, as for every command.
    let mut d = Daemon::spawn_args(
        &["check"],
        &[("LOCKDB_URL", "postgres://u:hunter2@host:notaport/db")],
    );
    let (code, _) = d.wait_exit(Duration::from_secs(10)).await;
    let all = d.lines().join("\n");
    assert_eq!(code, Some(2), "{all}");
    assert!(!all.contains("hunter2"), "{all}");
}

/// `check --help` shows a sample of the output; its numbers must be what
/// `check` prints on a freshly migrated database today, or a reader is told
/// of migrations and checks that do not exist. Both sides are the real
/// binary's output.
#[tokio::test]
async fn help_sample_counts_what_check_runs() {
    let db = TestDb::new().await;
    let statsd = StatsdCapture::start().await;
    let run = |args: &'static [&'static str]| {
        let url = db.url.clone();
        let port = statsd.port.to_string();
        async move {
            let out = tokio::process::Command::new(binary())
                .args(args)
                .env_clear()
                .env("LOCKDB_URL", url)
                .env("STATSD_PORT", port)
                .output()
                .await
                .expect("running lease-sweeper");
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let help = run(&["check", "--help"]).await;
    let report = run(&["check"]).await;

    let migrations = report
        .lines()
        .find(|l| l.starts_with("ok    migrations: "))
        .unwrap_or_else(|| panic!("no migrations line in:\n{report}"));
    let migrations = migrations.trim_start_matches("ok    migrations: ");
    let verdict = report.trim_end().lines().last().unwrap();
    // Every check prints one status line; the tests migrate as a superuser,
    // so some are `warn` (the verdict then counts them apart).
    let checks = report
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("warn ") || l.starts_with("FAIL "))
        .count();
    let warned = report.lines().filter(|l| l.starts_with("warn ")).count();
    let expected = if warned == 0 {
        format!("check passed: all {checks} checks ok")
    } else {
        format!(
            "check passed: {} of {checks} checks ok, {warned} warning{}",
            checks - warned,
            if warned == 1 { "" } else { "s" }
        )
    };
    assert!(
        verdict.starts_with(&expected),
        "{verdict} vs {expected}:\n{report}"
    );
    let fix = "update the OUTPUT sample of CHECK_HEAD in src/cli/pages.rs (then refresh man/: \
               LEASE_SWEEPER_WRITE_MAN=1 cargo test --test it cli::man::)";
    assert!(
        help.contains(&format!("migrations: {migrations}\n")),
        "check prints `migrations: {migrations}`, its help does not; {fix}:\n{help}"
    );
    assert!(
        help.contains(&format!("check passed: all {checks} checks ok"))
            && help.contains(&format!(" of {checks} checks failed")),
        "check runs {checks} checks (`{verdict}`), its help says otherwise; {fix}:\n{help}"
    );
}
