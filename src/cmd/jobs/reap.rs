//! `lease-sweeper jobs dry-run` and `jobs apply`: what the job reaper would
//! do now, and doing it now if the gates allow, as a table or the function's
//! JSON.

use std::io::{self, Write};
use std::process::ExitCode;

use tracing::info;

use crate::cli::{JobsArgs, JobsCommand};
use sqlx::Connection as _;

use crate::config::DbTarget;
use crate::model::{ApplyReport, DryRunJob, DryRunReport, JobAction};
use crate::output::table;
use crate::pg::conn::in_tx;
use crate::pg::job_queue as q;

use super::common::*;

/// `jobs dry-run` / `jobs apply` against the database named by the environment.
pub async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let format = Format::for_stdout(args.output.json);
    run_jobs(&target, args.command, &mut io::stdout(), format).await
}

/// `jobs …` against `target`, printing to `out` (the testable core).
pub async fn run_jobs(
    target: &DbTarget,
    cmd: JobsCommand,
    out: &mut dyn Write,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let (what, result) = match &cmd {
        // In a transaction, as everything sent: PgBouncer-safe (pg::conn::in_tx).
        JobsCommand::DryRun(limit) => (
            "fn_job_reap_stale_leases_dry_run",
            in_tx(&mut conn, async |c| q::dry_run(c, limit.limit).await).await,
        ),
        JobsCommand::Apply { actor, limit } => (
            "fn_job_reap_stale_leases_apply",
            in_tx(&mut conn, async |c| q::apply(c, actor, limit.limit).await).await,
        ),
    };
    let text = result.map_err(|e| db_error(target, what, &e))?;
    // Decoded once, into the model: the table and the exit status read it.
    let refusal = match &cmd {
        JobsCommand::DryRun(_) => {
            let report: DryRunReport = decode(&text)?;
            let leases = records_leases(&text);
            print(out, &text, format, || Ok(dry_run_table(&report, leases)))?;
            report.refused.then_some(report.reason)
        }
        JobsCommand::Apply { .. } => {
            let report: ApplyReport = decode(&text)?;
            print(out, &text, format, || Ok(apply_table(&report)))?;
            report.refused.then_some(report.reason)
        }
    };
    conn.close().await.ok();
    if let Some(reason) = refusal {
        info!(function = what, reason = %reason.unwrap_or_default(), "refused");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    Ok(ExitCode::SUCCESS)
}

/// The cells a dry-run row and an apply row share: JOB, KIND, OWNER, ATTEMPTS.
fn job_cells(
    job_id: &str,
    job_kind: &str,
    lease_owner: Option<&str>,
    attempts: i64,
    max_attempts: i64,
) -> Vec<String> {
    vec![
        job_id.to_owned(),
        job_kind.to_owned(),
        or_dash(lease_owner),
        format!("{attempts}/{max_attempts}"),
    ]
}

/// Whether the dry run's jobs carry the lease their claim gave: a queue
/// that records it (the stand-in) names both fields in every job; a queue
/// without those columns leaves them out, and so does the table. True with
/// no jobs, which have no rows to say it in.
fn records_leases(text: &str) -> bool {
    let Ok(report) = serde_json::from_str::<serde_json::Value>(text) else {
        return true;
    };
    match report.get("jobs").and_then(|jobs| jobs.as_array()) {
        Some(jobs) if !jobs.is_empty() => {
            jobs.iter().any(|j| j.get("lease_duration_sec").is_some())
        }
        _ => true,
    }
}

/// The lease a dry-run job was last given and where it came from
/// (`30s kind`), or `-` when no claim or heartbeat recorded one.
fn lease_cell(j: &DryRunJob) -> String {
    match (j.lease_duration_sec, &j.lease_duration_source) {
        (Some(sec), Some(source)) => format!("{sec}s {source}"),
        _ => "-".to_owned(),
    }
}

/// The dry run for a person; the LEASE column only where the queue
/// records leases (`leases`).
fn dry_run_table(report: &DryRunReport, leases: bool) -> String {
    if report.refused {
        return refusal_table(report.reason.as_deref());
    }
    let rows: Vec<Vec<String>> = report
        .jobs
        .iter()
        .map(|j| {
            let mut row = job_cells(
                &j.job_id,
                &j.job_kind,
                j.lease_owner.as_deref(),
                j.attempts,
                j.max_attempts,
            );
            if leases {
                row.push(lease_cell(j));
            }
            row.extend([j.overdue_seconds.to_string(), j.would_action.clone()]);
            row
        })
        .collect();
    let headers: &[&str] = if leases {
        &[
            "JOB",
            "KIND",
            "OWNER",
            "ATTEMPTS",
            "LEASE",
            "OVERDUE_S",
            "WOULD",
        ]
    } else {
        &["JOB", "KIND", "OWNER", "ATTEMPTS", "OVERDUE_S", "WOULD"]
    };
    let mut out = table::render(headers, &rows);
    out.push_str(&format!(
        "\n{} stale job lease(s); showing {} (--limit {}); dry run: nothing was changed{}\n",
        report.stale_lease_count,
        report.jobs.len(),
        report.limit.map_or("-".to_owned(), |l| l.to_string()),
        if leases {
            ""
        } else {
            "; this queue does not record the lease each claim gave"
        },
    ));
    out
}

/// What became of an applied job: its backoff, or its dead-letter row.
fn detail_cell(a: &JobAction) -> String {
    match (a.backoff_sec, &a.dead_letter) {
        (Some(backoff), _) => format!("retry in {backoff} s"),
        (None, Some(dead)) => format!("dead letter {}", dead.dead_letter_id),
        (None, None) => "-".to_owned(),
    }
}

fn apply_table(report: &ApplyReport) -> String {
    if report.refused {
        return refusal_table(report.reason.as_deref());
    }
    let rows: Vec<Vec<String>> = report
        .actions
        .iter()
        .map(|a| {
            let mut row = job_cells(
                &a.job_id,
                &a.job_kind,
                a.lease_owner.as_deref(),
                a.attempts,
                a.max_attempts,
            );
            row.extend([a.action.clone(), detail_cell(a)]);
            row
        })
        .collect();
    let mut out = table::render(
        &["JOB", "KIND", "OWNER", "ATTEMPTS", "ACTION", "DETAIL"],
        &rows,
    );
    out.push_str(&format!(
        "\n{} reset to retry_waiting, {} moved to the dead-letter table, by {}\n",
        report.reset_count,
        report.dead_letter_count,
        or_dash(report.actor.as_deref()),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// An apply report as the function writes it: one reset, one dead letter.
    const APPLIED: &str = r#"{"actor": "ops@host", "actions": [{"action": "reset_to_retry_waiting", "job_id": "j-1", "attempts": 2, "job_kind": "email", "backoff_sec": 20, "lease_owner": "w-7", "max_attempts": 5, "overdue_millis": 1500}, {"action": "moved_to_dead_letter", "job_id": "j-2", "attempts": 1, "job_kind": "render", "dead_letter": {"dead_letter_id": "d-9", "job_id": "j-2"}, "lease_owner": null, "max_attempts": 1, "overdue_millis": 10}], "refused": false, "reset_count": 1, "dead_letter_count": 1}"#;

    fn printed(text: &str, format: Format, table: impl FnOnce() -> String) -> String {
        let mut out = Vec::new();
        print(&mut out, text, format, || Ok(table())).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_apply_table_has_one_row_per_action_with_its_backoff_or_dead_letter() {
        let report: ApplyReport = decode(APPLIED).unwrap();
        let table = apply_table(&report);
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[..3],
            [
                vec!["JOB", "KIND", "OWNER", "ATTEMPTS", "ACTION", "DETAIL"],
                vec![
                    "j-1",
                    "email",
                    "w-7",
                    "2/5",
                    "reset_to_retry_waiting",
                    "retry",
                    "in",
                    "20",
                    "s"
                ],
                vec![
                    "j-2",
                    "render",
                    "-",
                    "1/1",
                    "moved_to_dead_letter",
                    "dead",
                    "letter",
                    "d-9"
                ],
            ],
            "{table}"
        );
        assert_eq!(
            table.lines().last().unwrap(),
            "1 reset to retry_waiting, 1 moved to the dead-letter table, by ops@host"
        );
    }

    #[test]
    fn a_refused_report_prints_its_reason_and_the_command_that_opens_the_gate() {
        let refused = r#"{"reason": "queue.lease.reaper_enabled=false", "refused": true}"#;
        let apply: ApplyReport = decode(refused).unwrap();
        let dry: DryRunReport = decode(refused).unwrap();
        let want = "refused: queue.lease.reaper_enabled=false\n\
                    to open that gate: lease-sweeper gates set queue.lease.reaper_enabled true --actor NAME\n";
        assert_eq!(
            (apply_table(&apply), dry_run_table(&dry, true)),
            (want.into(), want.into())
        );
    }

    #[test]
    fn the_dry_run_table_says_each_jobs_lease_and_the_total() {
        let text = r#"{"jobs": [{"job_id": "j-1", "job_kind": "k\nFORGED", "attempts": 0, "lease_owner": "w", "lease_until": "2026-01-01T00:00:00+00:00", "max_attempts": 5, "would_action": "reset_to_retry_waiting", "overdue_seconds": 61, "lease_duration_sec": 30, "lease_duration_source": "kind"}], "limit": 10, "mutation": false, "evaluated_at": "2026-01-01T00:01:01+00:00", "stale_lease_count": 4}"#;
        assert!(records_leases(text));
        let table = dry_run_table(&decode(text).unwrap(), records_leases(text));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "j-1",
                "k\\nFORGED",
                "w",
                "0/5",
                "30s",
                "kind",
                "61",
                "reset_to_retry_waiting"
            ],
            "{table}"
        );
        assert_eq!(
            lines[3],
            "4 stale job lease(s); showing 1 (--limit 10); dry run: nothing was changed"
        );
    }

    #[test]
    fn on_a_queue_that_records_no_lease_the_dry_run_table_has_no_lease_column() {
        let text = r#"{"jobs": [{"job_id": "j-1", "job_kind": "k", "attempts": 4, "lease_owner": "w", "lease_until": "2026-01-01T00:00:00+00:00", "max_attempts": 5, "would_action": "move_to_dead_letter", "overdue_seconds": 7}], "limit": 10, "mutation": false, "evaluated_at": "2026-01-01T00:00:07+00:00", "stale_lease_count": 1}"#;
        assert!(!records_leases(text));
        let table = dry_run_table(&decode(text).unwrap(), records_leases(text));
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[..2],
            [
                vec!["JOB", "KIND", "OWNER", "ATTEMPTS", "OVERDUE_S", "WOULD"],
                vec!["j-1", "k", "w", "4/5", "7", "move_to_dead_letter"],
            ],
            "{table}"
        );
        assert_eq!(
            table.lines().last().unwrap(),
            "1 stale job lease(s); showing 1 (--limit 10); dry run: nothing was changed; \
             this queue does not record the lease each claim gave"
        );
    }

    #[test]
    fn json_on_a_pipe_is_the_functions_text_and_on_a_terminal_the_same_value_indented() {
        let plain = printed(APPLIED, Format::Json, || unreachable!());
        assert_eq!(plain, format!("{APPLIED}\n"));
        let pretty = printed(APPLIED, Format::PrettyJson, || unreachable!());
        assert!(pretty.lines().count() > 10, "{pretty}");
        assert_eq!(
            serde_json::from_str::<Value>(&pretty).unwrap(),
            serde_json::from_str::<Value>(APPLIED).unwrap()
        );
    }
}
