//! The shipped mtail program (`deploy/mtail/lease-sweeper.mtail`) against
//! the real daemon's stdout: every `lease_expired` and `job_lease_expired`
//! line counted once under the right labels, however hostile the lock keys,
//! owners and job kinds are; and a naive program shown to be fooled by the
//! same file, so the inputs really are hostile.
//!
//! mtail itself (Debian's `mtail`, 3.0) runs as a separate process in its
//! one-shot mode; this module does not test mtail's HTTP exporter or its
//! file tailing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sqlx::PgConnection;

use crate::support::{
    StatsdCapture, TempDir, TestDb, binary, daemon_env, events, insert_expired, open_gates,
    wait_until,
};

/// The directory of shipped mtail programs (mtail loads every `*.mtail` in it).
fn shipped_progs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/mtail")
}

/// The `prog` label mtail adds to each series of the shipped program.
const PROG: &str = "lease-sweeper.mtail";

/// Text meant to forge or hide a count in a line-oriented reader: whole
/// forged pairs and lines, quotes, escaped quotes, backslashes (a trailing
/// one too), `=`, line breaks the daemon escapes as `\n`/`\r`, and a value
/// long enough to span several kilobytes once escaped.
fn hostile_values() -> Vec<String> {
    let mut v: Vec<String> = [
        " level=warn message=lease_expired backend=forged reapedBy=forged",
        "x\" backend=forged reapedBy=forged action=forged \"",
        "\\\" backend=forged reapedBy=forged",
        "trailing\\",
        "\\",
        "\"",
        "a=b reapedBy=forged",
        "=",
        "say \"hi\" backend=\"forged\"",
        "line\nts=2026-01-01T00:00:00.000Z level=warn message=lease_expired lockKey=forged \
         token=1 expiredAtMillis=1 overdueMillis=1 backend=forged reapedBy=forged ownerId=forged",
        "crlf\r\nts=2026-01-01T00:00:00.000Z level=warn message=job_lease_expired jobId=forged \
         action=forged backend=forged",
        "tab\tbackend=forged",
        " ",
        "ünïcødé backend=forged ✓\u{2028}",
        "message=lease_expired",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.push("k\n\"=\\ backend=forged reapedBy=forged ".repeat(60));
    v
}

/// Plain leases beside the hostile ones, so the counts are not all hostile.
const PLAIN_LEASES: i64 = 20;
/// Hostile values also used as keys of leases taken over before any sweep.
const TAKEOVER_EVERY: usize = 3;

/// Inserts one expired lease per hostile value (key and owner both hostile)
/// and, for every `TAKEOVER_EVERY`th value, another whose key is stolen by
/// `lock_acquire` before any sweep (reported as `reapedBy=takeover`).
/// Returns (swept, taken over).
async fn insert_hostile_leases(conn: &mut PgConnection, values: &[String]) -> (usize, usize) {
    let mut takeovers = 0;
    for (i, key) in values.iter().enumerate() {
        let owner = &values[(i + 1) % values.len()];
        insert_lease(conn, key, owner).await;
        if i % TAKEOVER_EVERY == 0 {
            let stolen_key = format!("takeover:{key}");
            insert_lease(conn, &stolen_key, owner).await;
            let token: Option<i64> = sqlx::query_scalar("SELECT lock_acquire($1, $2, 600000)")
                .bind(&stolen_key)
                .bind(&values[(i + 2) % values.len()])
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert!(token.is_some(), "the expired lease is taken over");
            takeovers += 1;
        }
    }
    (values.len(), takeovers)
}

async fn insert_lease(conn: &mut PgConnection, key: &str, owner: &str) {
    sqlx::query(
        "INSERT INTO lock_entry (lock_key, owner_id, token, expires_at)
         VALUES ($1, $2, nextval('lock_fencing_token_seq'), now() - interval '1 s')",
    )
    .bind(key)
    .bind(owner)
    .execute(conn)
    .await
    .unwrap();
}

/// Inserts one stale job per hostile value (kind and owner hostile) on its
/// last attempt when `last_attempt`, else on its first.
async fn insert_hostile_jobs(conn: &mut PgConnection, values: &[String], last_attempt: bool) {
    let attempts = if last_attempt { 4 } else { 0 };
    for (i, kind) in values.iter().enumerate() {
        sqlx::query(
            "INSERT INTO job_queue (job_kind, state, attempts, max_attempts, lease_owner, lease_until)
             VALUES ($1, 'leased', $2, 5, $3, now() - interval '1 minute')",
        )
        .bind(kind)
        .bind(attempts)
        .bind(&values[(i + 3) % values.len()])
        .execute(&mut *conn)
        .await
        .unwrap();
    }
}

/// The whole lines of a log file still being written (a read can end in
/// the middle of the daemon's last write).
fn whole_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    match text.rfind('\n') {
        Some(end) => text[..end].lines().map(str::to_owned).collect(),
        None => Vec::new(),
    }
}

/// Runs `mtail --one_shot` with the programs in `progs` over `log`; returns
/// each series (`name{labels}`) with its value.
fn mtail_one_shot(progs: &Path, log: &Path) -> BTreeMap<String, f64> {
    let out = std::process::Command::new("mtail")
        .args([
            "--one_shot",
            "--one_shot_format=prometheus",
            "--logtostderr",
        ])
        .arg("--progs")
        .arg(progs)
        .arg("--logs")
        .arg(log)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run mtail ({e}), so the log-based metrics cannot be checked: \
                 install it (apt-get install mtail)"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mtail failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            let value = value.parse().unwrap_or_else(|_| panic!("{l:?}"));
            (series.to_owned(), value)
        })
        .collect()
}

/// The series of metric `name`, each with its value.
fn series_of<'a>(all: &'a BTreeMap<String, f64>, name: &str) -> BTreeMap<&'a str, f64> {
    all.iter()
        .filter(|(s, _)| s.split('{').next() == Some(name))
        .map(|(s, v)| (s.as_str(), *v))
        .collect()
}

#[tokio::test]
async fn counts_each_line_once_unforgeable() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let values = hostile_values();
    insert_expired(&mut conn, "mtail:plain:", PLAIN_LEASES, 1_000).await;
    let (hostile_swept, takeovers) = insert_hostile_leases(&mut conn, &values).await;
    let swept = PLAIN_LEASES as usize + hostile_swept;
    let leases = swept + takeovers;
    let resets = values.len();
    let dead = values.len();
    insert_hostile_jobs(&mut conn, &values, false).await;
    insert_hostile_jobs(&mut conn, &values, true).await;
    open_gates(&mut conn).await;

    // The daemon's stdout goes to a file, as a log shipper would see it.
    let dir = TempDir::new("mtail");
    let log = dir.join("lease-sweeper.log");
    let stderr_log = dir.join("stderr.log");
    let statsd = StatsdCapture::start().await;
    let port = statsd.port.to_string();
    let mut cmd = tokio::process::Command::new(binary());
    cmd.arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(daemon_env(&db.url, &port))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&stderr_log).unwrap())
        .kill_on_drop(true);
    let mut daemon = cmd.spawn().expect("spawning lease-sweeper");
    wait_until(Duration::from_secs(20), "every signal line", || async {
        let lines = whole_lines(&log);
        events(&lines, "lease_expired").len() >= leases
            && events(&lines, "job_lease_expired").len() >= resets + dead
    })
    .await;
    statsd
        .wait_counter("lock.lease.expired", "#backend:pg", leases as u64)
        .await;
    let pid = Pid::from_raw(daemon.id().expect("daemon running") as i32);
    kill(pid, Signal::SIGTERM).expect("signalling the daemon");
    let status = tokio::time::timeout(Duration::from_secs(10), daemon.wait())
        .await
        .expect("the daemon stops within 10 s of SIGTERM")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&stderr_log).unwrap_or_default()
    );

    // What the reference decoder reads in the file: the truth to match.
    let lines = whole_lines(&log);
    let lease_lines = events(&lines, "lease_expired");
    let job_lines = events(&lines, "job_lease_expired");
    assert_eq!(lease_lines.len(), leases, "one line per lease");
    assert_eq!(job_lines.len(), resets + dead, "one line per job");
    let by: HashMap<&str, usize> = lease_lines.iter().fold(HashMap::new(), |mut m, f| {
        *m.entry(f["reapedBy"].as_str()).or_default() += 1;
        m
    });
    assert_eq!(
        (by.get("sweep").copied(), by.get("takeover").copied()),
        (Some(swept), Some(takeovers))
    );

    let metrics = mtail_one_shot(&shipped_progs(), &log);
    let expired = series_of(&metrics, "lease_sweeper_log_lease_expired_total");
    let want: BTreeMap<String, f64> = [("sweep", swept), ("takeover", takeovers)]
        .into_iter()
        .map(|(by, n)| {
            (
                format!(
                    "lease_sweeper_log_lease_expired_total{{backend=\"pg\",prog=\"{PROG}\",reaped_by=\"{by}\"}}"
                ),
                n as f64,
            )
        })
        .collect();
    let got: BTreeMap<String, f64> = expired.iter().map(|(s, v)| ((*s).to_owned(), *v)).collect();
    assert_eq!(got, want, "lease_expired by backend and reapedBy");
    let jobs = series_of(&metrics, "lease_sweeper_log_job_lease_expired_total");
    let want: BTreeMap<String, f64> = [("moved_to_dead_letter", dead), ("reset_to_retry_waiting", resets)]
        .into_iter()
        .map(|(action, n)| {
            (
                format!(
                    "lease_sweeper_log_job_lease_expired_total{{action=\"{action}\",backend=\"pg\",prog=\"{PROG}\"}}"
                ),
                n as f64,
            )
        })
        .collect();
    let got: BTreeMap<String, f64> = jobs.iter().map(|(s, v)| ((*s).to_owned(), *v)).collect();
    assert_eq!(got, want, "job_lease_expired by backend and action");
    for unparsed in [
        "lease_sweeper_log_lease_expired_unparsed_total",
        "lease_sweeper_log_job_lease_expired_unparsed_total",
    ] {
        assert_eq!(
            metrics.get(&format!("{unparsed}{{prog=\"{PROG}\"}}")),
            Some(&0.0),
            "{unparsed}: {metrics:#?}"
        );
    }
    let forged: Vec<&String> = metrics.keys().filter(|s| s.contains("forged")).collect();
    assert!(forged.is_empty(), "forged labels: {forged:?}");
    // The daemon's own counter agrees with the log-based one.
    assert_eq!(
        statsd.counter("lock.lease.expired", "#backend:pg"),
        leases as u64
    );

    // Control: a program that searches the line instead of parsing it is
    // fooled by this very file, so the counts above prove the parsing.
    let naive = TempDir::new("mtail-naive");
    std::fs::write(naive.join("naive.mtail"), NAIVE_PROGRAM).unwrap();
    let fooled = mtail_one_shot(&naive, &log);
    let naive_series = series_of(&fooled, "naive_lease_expired_total");
    let naive_total: f64 = naive_series.values().sum();
    assert!(
        naive_series.keys().any(|s| s.contains("forged")) && naive_total > leases as f64,
        "the hostile values no longer fool a naive program: {fooled:#?}"
    );
    eprintln!(
        "FIGURES mtail: lease_lines={leases} (swept={swept} takeover={takeovers}, \
         hostile_values={}) job_lines={} (reset={resets} dead_letter={dead}) \
         mtail_lease_expired={} mtail_job_lease_expired={} forged=0 unparsed=0 \
         naive_program_total={naive_total} naive_forged_series={}",
        values.len(),
        resets + dead,
        expired.values().sum::<f64>(),
        jobs.values().sum::<f64>(),
        naive_series.keys().filter(|s| s.contains("forged")).count()
    );
}

/// What a log-based metric often looks like: a substring filter, then the
/// first `backend=` and `reapedBy=` anywhere in the line.
const NAIVE_PROGRAM: &str = r#"counter naive_lease_expired_total by backend, reaped_by
/level=warn message=lease_expired/ {
  /backend=(?P<backend>[a-z]+)/ {
    /reapedBy=(?P<reaped_by>[a-z]+)/ {
      naive_lease_expired_total[$backend][$reaped_by]++
    }
  }
}
"#;
