//! `lease-sweeper jobs dry-run|apply`, `lease-sweeper gates [set]` and
//! `lease-sweeper leases [set|clear]`: the operator's hands on the job
//! reaper and on how long jobs lease for.
//!
//! Owns connecting for one command, calling the SQL function, printing the
//! result on stdout (an aligned table for people; with `--json` the
//! function's JSON unchanged, indented on a terminal and as the database
//! wrote it (one line) otherwise, so scripts can pipe it to `jq`) and the
//! exit status: 0 when the function did what was
//! asked, 1 when it refused (apply with a gate closed, a limit out of range)
//! or a setter rejected the change. It owns no reaping or lease rules and no
//! SQL text (`pg::job_queue`); diagnostics go to stderr through `tracing`, and no
//! database error text is printed without passing the target's redactor.

use std::io::{self, IsTerminal as _, Write};
use std::process::ExitCode;

use anyhow::Context as _;
use serde_json::Value;
use sqlx::{Connection as _, PgConnection};
use tracing::{error, info};

use crate::cli::{GatesArgs, GatesCommand, JobsArgs, JobsCommand, LeasesArgs, LeasesCommand};
use crate::config::DbTarget;
use crate::model::{ApplyReport, DryRunJob, DryRunReport, JobAction};
use crate::output::table;
use crate::pg::conn::in_tx;
use crate::pg::job_queue as q;

/// Exit status of a refused apply or a rejected setting: 1, as for a runtime
/// failure (2 is kept for usage and configuration errors); stdout says why.
const EXIT_REFUSED: u8 = 1;

/// How the result is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An aligned table and a summary line, for people.
    Table,
    /// The function's JSON as the database wrote it (one line), for pipes.
    Json,
    /// The function's JSON indented, for `--json` on a terminal.
    PrettyJson,
}

impl Format {
    /// `--json` or not, for stdout: a table, else JSON indented on a terminal.
    fn for_stdout(json: bool) -> Self {
        if json {
            Self::json(io::stdout().is_terminal())
        } else {
            Format::Table
        }
    }

    /// The JSON, indented when `pretty`.
    fn json(pretty: bool) -> Self {
        if pretty {
            Format::PrettyJson
        } else {
            Format::Json
        }
    }
}

/// `jobs dry-run` / `jobs apply` against the database named by the environment.
pub async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let format = Format::for_stdout(args.output.json);
    run_jobs_as(&target, args.command, &mut io::stdout(), format).await
}

/// `gates` / `gates set` against the database named by the environment.
pub async fn gates(args: GatesArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let format = Format::for_stdout(args.output.json);
    run_gates_as(&target, args, &mut io::stdout(), format).await
}

/// `leases` / `leases set` / `leases clear` against the database named by
/// the environment.
pub async fn leases(args: LeasesArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let format = Format::for_stdout(args.output.json);
    run_leases_as(&target, args, &mut io::stdout(), format).await
}

/// `jobs …` printing the JSON to `out`, indented when `pretty`.
pub async fn run_jobs(
    target: &DbTarget,
    cmd: JobsCommand,
    out: &mut dyn Write,
    pretty: bool,
) -> anyhow::Result<ExitCode> {
    run_jobs_as(target, cmd, out, Format::json(pretty)).await
}

/// `gates …` printing the JSON to `out`, indented when `pretty`.
pub async fn run_gates(
    target: &DbTarget,
    args: GatesArgs,
    out: &mut dyn Write,
    pretty: bool,
) -> anyhow::Result<ExitCode> {
    run_gates_as(target, args, out, Format::json(pretty)).await
}

/// `jobs …` against `target`, printing to `out` (the testable core).
pub async fn run_jobs_as(
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
            print(out, &text, format, || Ok(dry_run_table(&report)))?;
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

/// `gates …` against `target`, printing to `out` (the testable core).
pub async fn run_gates_as(
    target: &DbTarget,
    args: GatesArgs,
    out: &mut dyn Write,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let code = match args.command {
        None => {
            let text = in_tx(&mut conn, async |c| q::show_gates(c).await)
                .await
                .map_err(|e| db_error(target, "queue_setting", &e))?;
            print(out, &text, format, || Ok(gates_table(&decode(&text)?)))?;
            ExitCode::SUCCESS
        }
        Some(GatesCommand::Set { key, value, actor }) => {
            let refusal = serde_json::json!({ "key": key });
            let set = SetCall {
                what: "fn_queue_setting_set",
                refusal,
                table: setting_table,
                need: GATES_NEED,
            };
            let outcome = set_audited(&mut conn, target, out, format, set, async |c| {
                q::set_gate(c, &key, &value, &actor).await
            })
            .await?;
            match outcome {
                None => ExitCode::SUCCESS,
                Some(reason) => {
                    error!(key = %key, reason = %reason, "setting_rejected");
                    ExitCode::from(EXIT_REFUSED)
                }
            }
        }
    };
    conn.close().await.ok();
    Ok(code)
}

/// `leases …` against `target`, printing to `out` (the testable core).
pub async fn run_leases_as(
    target: &DbTarget,
    args: LeasesArgs,
    out: &mut dyn Write,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let (kind, seconds, actor) = match args.command {
        None => {
            let text = in_tx(&mut conn, async |c| q::show_leases(c).await)
                .await
                .map_err(|e| db_error_needing(target, "job_kind_lease", &e, LEASES_NEED))?;
            print(out, &text, format, || Ok(leases_table(&decode(&text)?)))?;
            conn.close().await.ok();
            return Ok(ExitCode::SUCCESS);
        }
        Some(LeasesCommand::Set {
            kind,
            seconds,
            actor,
        }) => (kind, Some(seconds), actor),
        Some(LeasesCommand::Clear { kind, actor }) => (kind, None, actor),
    };
    let refusal = serde_json::json!({ "job_kind": kind });
    let set = SetCall {
        what: "fn_job_kind_lease_set",
        refusal,
        table: kind_lease_table,
        need: LEASES_NEED,
    };
    let outcome = set_audited(&mut conn, target, out, format, set, async |c| {
        q::set_kind_lease(c, &kind, seconds, &actor).await
    })
    .await?;
    conn.close().await.ok();
    Ok(match outcome {
        None => ExitCode::SUCCESS,
        Some(reason) => {
            error!(jobKind = %kind, reason = %reason, "kind_lease_rejected");
            ExitCode::from(EXIT_REFUSED)
        }
    })
}

/// How to report one call of an audited setter.
struct SetCall {
    /// The SQL function, for error messages.
    what: &'static str,
    /// What the refusal JSON names (the key or the kind); `reason` and
    /// `refused` are added.
    refusal: Value,
    /// Renders the setter's JSON for a person.
    table: fn(&Value) -> String,
    /// What the role needs, said when it lacks a privilege.
    need: &'static str,
}

/// Runs `call` in a transaction and prints its JSON; a rejection
/// (SQLSTATE 22023: the setter changed nothing) is printed as the refusal
/// instead and its reason returned, for the caller to log and exit 1 on.
async fn set_audited(
    conn: &mut PgConnection,
    target: &DbTarget,
    out: &mut dyn Write,
    format: Format,
    set: SetCall,
    call: impl AsyncFnOnce(&mut PgConnection) -> Result<String, sqlx::Error>,
) -> anyhow::Result<Option<String>> {
    match in_tx(conn, call).await {
        Ok(text) => {
            print(out, &text, format, || Ok((set.table)(&decode(&text)?)))?;
            Ok(None)
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(q::REJECTED_SQLSTATE) => {
            let message = target.redactor().redact(db.message());
            let mut refusal = set.refusal;
            refusal["reason"] = Value::String(message.clone());
            refusal["refused"] = Value::Bool(true);
            print(out, &refusal.to_string(), format, || {
                Ok(refusal_table(Some(&message)))
            })?;
            Ok(Some(message))
        }
        Err(e) => Err(db_error_needing(target, set.what, &e, set.need)),
    }
}

async fn open(target: &DbTarget) -> anyhow::Result<PgConnection> {
    // StoreError's text is already redacted and names the target safely.
    Ok(crate::pg::conn::connect(target).await?)
}

/// A database error as an `anyhow` error, its text scrubbed of secrets.
fn db_error(target: &DbTarget, what: &str, err: &sqlx::Error) -> anyhow::Error {
    let cause = target.redactor().redact(&crate::pg::conn::describe(err));
    anyhow::anyhow!("{what} on {} failed: {cause}", target.display())
}

/// SQLSTATE `insufficient_privilege`.
const DENIED_SQLSTATE: &str = "42501";

/// What `gates set` needs, said when the role lacks it.
const GATES_NEED: &str = "`gates set` needs EXECUTE on fn_queue_setting_set (which the owner grants to operators, \
     never to lease_sweeper); run it as an operator's role";

/// What the `leases` commands need, said when the role lacks it: the
/// daemon's own role may run `gates` but holds nothing on kind durations.
const LEASES_NEED: &str = "`leases` needs SELECT on job_kind_lease and queue_setting, `leases set`/`clear` EXECUTE on \
     fn_job_kind_lease_set (which the owner grants to operators, never to lease_sweeper); run it as an operator's role";

/// `db_error`, plus `need` when the database said the role lacks a privilege.
fn db_error_needing(target: &DbTarget, what: &str, err: &sqlx::Error, need: &str) -> anyhow::Error {
    let denied = err
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == DENIED_SQLSTATE);
    let base = db_error(target, what, err);
    if denied {
        anyhow::anyhow!("{base}; {need}")
    } else {
        base
    }
}

/// Prints the function's JSON `text` as `format` asks: `table` renders it
/// for a person; `Json` is the text itself (jsonb's text form is one line);
/// `PrettyJson` parses it only to indent it.
fn print(
    out: &mut dyn Write,
    text: &str,
    format: Format,
    table: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<()> {
    let rendered = match format {
        Format::Table => table()?,
        Format::Json => format!("{}\n", text.trim_end()),
        Format::PrettyJson => serde_json::to_string_pretty(&decode::<Value>(text)?)? + "\n",
    };
    out.write_all(rendered.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the result to stdout")
}

/// A function's JSON as `T`: the model's shape for the job reports, a
/// `Value` for the settings (only this table reads them).
fn decode<T: serde::de::DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    serde_json::from_str(text)
        .with_context(|| format!("the database returned unexpected JSON: {text}"))
}

/// An optional text as a cell: `-` when absent.
fn or_dash(text: Option<&str>) -> String {
    text.unwrap_or("-").to_owned()
}

/// A JSON field as a cell: strings bare, null as `-`, the rest as JSON.
fn cell(v: &Value, key: &str) -> String {
    match v.get(key) {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// `2026-11-30T09:37:41.115685+00:00` as `2026-11-30 09:37:41+00:00`: a
/// person reads seconds; the offset stays so the zone is never guessed.
fn short_time(ts: &str) -> String {
    match (ts.get(..19), ts.rfind(['+', '-']).filter(|&i| i > 19)) {
        (Some(head), Some(zone)) => format!("{} {}{}", &head[..10], &head[11..], &ts[zone..]),
        _ => ts.to_owned(),
    }
}

/// A refusal (gates closed, limit out of range, setting rejected).
fn refusal_table(reason: Option<&str>) -> String {
    format!("refused: {}\n", table::printable(&or_dash(reason)))
}

fn gates_table(v: &Value) -> String {
    let empty = Vec::new();
    let rows: Vec<Vec<String>> = v["settings"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|s| {
            vec![
                cell(s, "key"),
                cell(s, "value"),
                short_time(&cell(s, "updated_at")),
                cell(s, "updated_by"),
            ]
        })
        .collect();
    let mut out = table::render(&["SETTING", "VALUE", "CHANGED", "BY"], &rows);
    out.push_str(
        &match v["apply_refusal"].get("reason").and_then(Value::as_str) {
            None => {
                "\napply now: allowed (stale job leases are reaped on the next sweep)\n".to_owned()
            }
            Some(reason) => format!(
                "\napply now: refused ({}): stale job leases are left alone\n",
                table::printable(reason)
            ),
        },
    );
    out
}

fn leases_table(v: &Value) -> String {
    let empty = Vec::new();
    let rows: Vec<Vec<String>> = v["kinds"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|k| {
            vec![
                cell(k, "job_kind"),
                cell(k, "lease_sec"),
                short_time(&cell(k, "updated_at")),
                cell(k, "updated_by"),
            ]
        })
        .collect();
    let mut out = table::render(&["KIND", "LEASE_S", "CHANGED", "BY"], &rows);
    let default = &v["default"];
    out.push_str(&format!(
        "\nevery other kind: {} s ({}, changed {} by {}); a job's metadata.lease_override_sec wins over both\n",
        cell(default, "lease_sec"),
        cell(default, "setting"),
        short_time(&cell(default, "updated_at")),
        table::printable(&cell(default, "updated_by")),
    ));
    out
}

fn kind_lease_table(v: &Value) -> String {
    let row = ["job_kind", "old_lease_sec", "lease_sec", "updated_by"]
        .iter()
        .map(|k| cell(v, k))
        .collect();
    let mut out = table::render(&["KIND", "OLD_S", "NEW_S", "BY"], &[row]);
    let kind = table::printable(&cell(v, "job_kind"));
    out.push_str(&match v.get("lease_sec").and_then(Value::as_i64) {
        Some(sec) => format!(
            "\nnew claims and heartbeats of {kind} lease for {sec} s; a lease in flight keeps its deadline until its next heartbeat\n"
        ),
        None => format!(
            "\n{kind} leases for the default: {} s (queue.lease.duration_sec)\n",
            cell(v, "default_sec")
        ),
    });
    out
}

fn setting_table(v: &Value) -> String {
    let row = ["key", "old_value", "value", "updated_by"]
        .iter()
        .map(|k| cell(v, k))
        .collect();
    table::render(&["SETTING", "OLD", "NEW", "BY"], &[row])
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

/// The lease a dry-run job was last given and where it came from
/// (`30s kind`), or `-` when no claim or heartbeat recorded one.
fn lease_cell(j: &DryRunJob) -> String {
    match (j.lease_duration_sec, &j.lease_duration_source) {
        (Some(sec), Some(source)) => format!("{sec}s {source}"),
        _ => "-".to_owned(),
    }
}

fn dry_run_table(report: &DryRunReport) -> String {
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
            row.extend([
                lease_cell(j),
                j.overdue_seconds.to_string(),
                j.would_action.clone(),
            ]);
            row
        })
        .collect();
    let mut out = table::render(
        &[
            "JOB",
            "KIND",
            "OWNER",
            "ATTEMPTS",
            "LEASE",
            "OVERDUE_S",
            "WOULD",
        ],
        &rows,
    );
    out.push_str(&format!(
        "\n{} stale job lease(s); showing {} (--limit {}); dry run: nothing was changed\n",
        report.stale_lease_count,
        report.jobs.len(),
        report.limit.map_or("-".to_owned(), |l| l.to_string()),
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
    fn a_refused_report_prints_its_reason_alone() {
        let refused = r#"{"reason": "queue.lease.reaper_enabled=false", "refused": true}"#;
        let apply: ApplyReport = decode(refused).unwrap();
        let dry: DryRunReport = decode(refused).unwrap();
        let want = "refused: queue.lease.reaper_enabled=false\n";
        assert_eq!(
            (apply_table(&apply), dry_run_table(&dry)),
            (want.into(), want.into())
        );
    }

    #[test]
    fn the_dry_run_table_says_each_jobs_lease_and_the_total() {
        let text = r#"{"jobs": [{"job_id": "j-1", "job_kind": "k\nFORGED", "attempts": 0, "lease_owner": "w", "lease_until": "2026-01-01T00:00:00+00:00", "max_attempts": 5, "would_action": "reset_to_retry_waiting", "overdue_seconds": 61, "lease_duration_sec": 30, "lease_duration_source": "kind"}], "limit": 10, "mutation": false, "evaluated_at": "2026-01-01T00:01:01+00:00", "stale_lease_count": 4}"#;
        let table = dry_run_table(&decode(text).unwrap());
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
