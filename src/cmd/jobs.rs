//! `lease-sweeper jobs dry-run|apply`, `lease-sweeper gates [set]` and
//! `lease-sweeper leases [set|clear]`: the operator's hands on the job
//! reaper and on how long jobs lease for.
//!
//! Owns connecting for one command, calling the SQL function, printing the
//! result on stdout (an aligned table for people; with `--json` the
//! function's JSON unchanged, indented on a terminal and one line otherwise,
//! so scripts can pipe it to `jq`) and the exit status: 0 when the function did what was
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
    /// The function's JSON on one line, for pipes.
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

/// `leases …` printing the JSON to `out`, indented when `pretty`.
pub async fn run_leases(
    target: &DbTarget,
    args: LeasesArgs,
    out: &mut dyn Write,
    pretty: bool,
) -> anyhow::Result<ExitCode> {
    run_leases_as(target, args, out, Format::json(pretty)).await
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
    let value = print(out, &text, format, |v| match &cmd {
        JobsCommand::DryRun(_) => dry_run_table(v),
        JobsCommand::Apply { .. } => apply_table(v),
    })?;
    conn.close().await.ok();
    if value.get("refused").and_then(serde_json::Value::as_bool) == Some(true) {
        let reason = value.get("reason").and_then(|r| r.as_str()).unwrap_or("");
        info!(function = what, reason = %reason, "refused");
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
            print(out, &text, format, gates_table)?;
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
            print(out, &text, format, leases_table)?;
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
            print(out, &text, format, set.table)?;
            Ok(None)
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(q::REJECTED_SQLSTATE) => {
            let message = target.redactor().redact(db.message());
            let mut refusal = set.refusal;
            refusal["reason"] = Value::String(message.clone());
            refusal["refused"] = Value::Bool(true);
            print(out, &refusal.to_string(), format, refusal_table)?;
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

/// Prints the function's JSON as `format` asks (`table` renders it for a
/// person) and returns it parsed.
fn print(
    out: &mut dyn Write,
    text: &str,
    format: Format,
    table: impl FnOnce(&Value) -> String,
) -> anyhow::Result<Value> {
    let value: Value = serde_json::from_str(text)
        .with_context(|| format!("the database returned non-JSON: {text}"))?;
    let rendered = match format {
        Format::Table => table(&value),
        Format::Json => serde_json::to_string(&value)? + "\n",
        Format::PrettyJson => serde_json::to_string_pretty(&value)? + "\n",
    };
    out.write_all(rendered.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the result to stdout")?;
    Ok(value)
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
fn refusal_table(v: &Value) -> String {
    format!("refused: {}\n", table::printable(&cell(v, "reason")))
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
fn job_cells(j: &Value) -> Vec<String> {
    vec![
        cell(j, "job_id"),
        cell(j, "job_kind"),
        cell(j, "lease_owner"),
        format!("{}/{}", cell(j, "attempts"), cell(j, "max_attempts")),
    ]
}

/// The lease a dry-run job was last given and where it came from
/// (`30s kind`), or `-` when no claim or heartbeat recorded one.
fn lease_cell(j: &Value) -> String {
    match (
        j.get("lease_duration_sec").and_then(Value::as_i64),
        j.get("lease_duration_source").and_then(Value::as_str),
    ) {
        (Some(sec), Some(source)) => format!("{sec}s {source}"),
        _ => "-".to_owned(),
    }
}

fn dry_run_table(v: &Value) -> String {
    if v["refused"] == Value::Bool(true) {
        return refusal_table(v);
    }
    let empty = Vec::new();
    let jobs = v["jobs"].as_array().unwrap_or(&empty);
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let mut row = job_cells(j);
            row.extend([
                lease_cell(j),
                cell(j, "overdue_seconds"),
                cell(j, "would_action"),
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
        cell(v, "stale_lease_count"),
        jobs.len(),
        cell(v, "limit"),
    ));
    out
}

fn apply_table(v: &Value) -> String {
    if v["refused"] == Value::Bool(true) {
        return refusal_table(v);
    }
    let empty = Vec::new();
    let actions = v["actions"].as_array().unwrap_or(&empty);
    let rows: Vec<Vec<String>> = actions
        .iter()
        .map(|a| {
            let detail = match a.get("backoff_sec") {
                Some(b) if !b.is_null() => format!("retry in {b} s"),
                _ => a["dead_letter"]
                    .get("dead_letter_id")
                    .map_or("-".to_owned(), |d| {
                        format!("dead letter {}", d.as_str().unwrap_or("?"))
                    }),
            };
            let mut row = job_cells(a);
            row.extend([cell(a, "action"), detail]);
            row
        })
        .collect();
    let mut out = table::render(
        &["JOB", "KIND", "OWNER", "ATTEMPTS", "ACTION", "DETAIL"],
        &rows,
    );
    out.push_str(&format!(
        "\n{} reset to retry_waiting, {} moved to the dead-letter table, by {}\n",
        cell(v, "reset_count"),
        cell(v, "dead_letter_count"),
        cell(v, "actor"),
    ));
    out
}
