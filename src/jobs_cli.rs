//! `lease-sweeper jobs dry-run|apply` and `lease-sweeper gates [set]`: the
//! operator's hands on the job reaper.
//!
//! Owns connecting for one command, calling the SQL function, printing its
//! JSON on stdout (indented on a terminal, one line otherwise, so scripts can
//! pipe it to `jq`) and the exit status: 0 when the function did what was
//! asked, 1 when it refused (apply with a gate closed, a limit out of range)
//! or the setter rejected the change. It owns no reaping rules and no SQL
//! text (`queries::jobs`); diagnostics go to stderr through `tracing`, and no
//! database error text is printed without passing the target's redactor.

use std::io::{self, IsTerminal as _, Write};
use std::process::ExitCode;

use anyhow::Context as _;
use sqlx::{Connection as _, PgConnection};
use tracing::{error, info};

use crate::cli::{GatesArgs, GatesCommand, JobsCommand};
use crate::config::DbTarget;
use crate::db::in_tx;
use crate::queries::jobs as q;

/// Exit status of a refused apply or a rejected setting (SPEC §2: 1 is a
/// runtime failure; the JSON on stdout says why).
const EXIT_REFUSED: u8 = 1;

/// `jobs dry-run` / `jobs apply` against the database named by the environment.
pub async fn jobs(cmd: JobsCommand) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let mut out = io::stdout();
    let pretty = out.is_terminal();
    run_jobs(&target, cmd, &mut out, pretty).await
}

/// `gates` / `gates set` against the database named by the environment.
pub async fn gates(args: GatesArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let mut out = io::stdout();
    let pretty = out.is_terminal();
    run_gates(&target, args, &mut out, pretty).await
}

/// `jobs …` against `target`, printing to `out` (the testable core).
pub async fn run_jobs(
    target: &DbTarget,
    cmd: JobsCommand,
    out: &mut dyn Write,
    pretty: bool,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let (what, result) = match &cmd {
        // In a transaction, as everything sent: PgBouncer-safe (crate::db::in_tx).
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
    let value = print_json(out, &text, pretty)?;
    conn.close().await.ok();
    if value.get("refused").and_then(serde_json::Value::as_bool) == Some(true) {
        let reason = value.get("reason").and_then(|r| r.as_str()).unwrap_or("");
        info!(function = what, reason = %reason, "refused");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    Ok(ExitCode::SUCCESS)
}

/// `gates …` against `target`, printing to `out` (the testable core).
pub async fn run_gates(
    target: &DbTarget,
    args: GatesArgs,
    out: &mut dyn Write,
    pretty: bool,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let code = match args.command {
        None => {
            let text = in_tx(&mut conn, async |c| q::show_gates(c).await)
                .await
                .map_err(|e| db_error(target, "queue_setting", &e))?;
            print_json(out, &text, pretty)?;
            ExitCode::SUCCESS
        }
        Some(GatesCommand::Set { key, value, actor }) => {
            match in_tx(&mut conn, async |c| {
                q::set_gate(c, &key, &value, &actor).await
            })
            .await
            {
                Ok(text) => {
                    print_json(out, &text, pretty)?;
                    ExitCode::SUCCESS
                }
                Err(sqlx::Error::Database(db))
                    if db.code().as_deref() == Some(q::REJECTED_SQLSTATE) =>
                {
                    let message = target.redactor().redact(db.message());
                    let refusal = serde_json::json!({
                        "key": key,
                        "reason": message,
                        "refused": true,
                    });
                    print_json(out, &refusal.to_string(), pretty)?;
                    error!(key = %key, reason = %message, "setting_rejected");
                    ExitCode::from(EXIT_REFUSED)
                }
                Err(e) => return Err(db_error(target, "fn_queue_setting_set", &e)),
            }
        }
    };
    conn.close().await.ok();
    Ok(code)
}

async fn open(target: &DbTarget) -> anyhow::Result<PgConnection> {
    // StoreError's text is already redacted and names the target safely.
    Ok(crate::db::connect(target).await?)
}

/// A database error as an `anyhow` error, its text scrubbed of secrets.
fn db_error(target: &DbTarget, what: &str, err: &sqlx::Error) -> anyhow::Error {
    let cause = target.redactor().redact(&crate::db::describe(err));
    anyhow::anyhow!("{what} on {} failed: {cause}", target.display())
}

/// Prints the function's JSON: indented for a person, one line for a pipe.
fn print_json(out: &mut dyn Write, text: &str, pretty: bool) -> anyhow::Result<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(text)
        .with_context(|| format!("the database returned non-JSON: {text}"))?;
    let rendered = if pretty {
        serde_json::to_string_pretty(&value)?
    } else {
        serde_json::to_string(&value)?
    };
    writeln!(out, "{rendered}")
        .and_then(|()| out.flush())
        .context("writing the result to stdout")?;
    Ok(value)
}
