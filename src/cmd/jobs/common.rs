//! What the job-queue commands share: connecting for one command, the
//! output format, printing a result as a table or the function's JSON,
//! calling an audited setter, and wording a database error with what the
//! role needs. It knows no subcommand.

use std::io::{self, IsTerminal as _, Write};

use anyhow::Context as _;
use serde_json::Value;
use sqlx::PgConnection;

use crate::config::DbTarget;
use crate::output::table;
use crate::pg::conn::in_tx;
use crate::pg::job_queue as q;

/// Exit status of a refused apply or a rejected setting: 1, as for a runtime
/// failure (2 is kept for usage and configuration errors); stdout says why.
pub(super) const EXIT_REFUSED: u8 = 1;

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
    pub(super) fn for_stdout(json: bool) -> Self {
        if json {
            Self::json(io::stdout().is_terminal())
        } else {
            Format::Table
        }
    }

    /// The JSON, indented when `pretty`.
    pub(super) fn json(pretty: bool) -> Self {
        if pretty {
            Format::PrettyJson
        } else {
            Format::Json
        }
    }
}

/// How to report one call of an audited setter.
pub(super) struct SetCall {
    /// The SQL function, for error messages.
    pub(super) what: &'static str,
    /// What the refusal JSON names (the key or the kind); `reason` and
    /// `refused` are added.
    pub(super) refusal: Value,
    /// Renders the setter's JSON for a person.
    pub(super) table: fn(&Value) -> String,
    /// What the role needs, said when it lacks a privilege.
    pub(super) need: &'static str,
}

/// Runs `call` in a transaction and prints its JSON; a rejection
/// (SQLSTATE 22023: the setter changed nothing) is printed as the refusal
/// instead and its reason returned, for the caller to log and exit 1 on.
pub(super) async fn set_audited(
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

pub(super) async fn open(target: &DbTarget) -> anyhow::Result<PgConnection> {
    // StoreError's text is already redacted and names the target safely.
    Ok(crate::pg::conn::connect(target).await?)
}

/// A database error as an `anyhow` error, its text scrubbed of secrets.
pub(super) fn db_error(target: &DbTarget, what: &str, err: &sqlx::Error) -> anyhow::Error {
    let cause = target.redactor().redact(&crate::pg::conn::describe(err));
    anyhow::anyhow!("{what} on {} failed: {cause}", target.display())
}

/// SQLSTATE `insufficient_privilege`.
pub(super) const DENIED_SQLSTATE: &str = "42501";

/// `db_error`, plus `need` when the database said the role lacks a privilege.
pub(super) fn db_error_needing(
    target: &DbTarget,
    what: &str,
    err: &sqlx::Error,
    need: &str,
) -> anyhow::Error {
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
pub(super) fn print(
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
pub(super) fn decode<T: serde::de::DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    serde_json::from_str(text)
        .with_context(|| format!("the database returned unexpected JSON: {text}"))
}

/// An optional text as a cell: `-` when absent.
pub(super) fn or_dash(text: Option<&str>) -> String {
    text.unwrap_or("-").to_owned()
}

/// A JSON field as a cell: strings bare, null as `-`, the rest as JSON.
pub(super) fn cell(v: &Value, key: &str) -> String {
    match v.get(key) {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// `2026-11-30T09:37:41.115685+00:00` as `2026-11-30 09:37:41+00:00`: a
/// person reads seconds; the offset stays so the zone is never guessed.
pub(super) fn short_time(ts: &str) -> String {
    match (ts.get(..19), ts.rfind(['+', '-']).filter(|&i| i > 19)) {
        (Some(head), Some(zone)) => format!("{} {}{}", &head[..10], &head[11..], &ts[zone..]),
        _ => ts.to_owned(),
    }
}

/// A refusal (gates closed, limit out of range, setting rejected): the
/// reason exactly as the SQL function gave it (scripts match it), then, for a
/// closed gate, the command that opens it.
pub(super) fn refusal_table(reason: Option<&str>) -> String {
    let mut out = format!("refused: {}\n", table::printable(&or_dash(reason)));
    if let Some(open) = reason.and_then(gate_opener) {
        out.push_str(&format!("to open that gate: {open}\n"));
    }
    out
}

/// For a closed gate's refusal reason (`queue.lease.reaper_enabled=false`,
/// the gate and the boolean value that closes it), the command that opens
/// it; `None` for any other reason (a limit, an unknown key, a bad value).
pub(super) fn gate_opener(reason: &str) -> Option<String> {
    let (key, closed) = reason.split_once('=')?;
    let open = match closed {
        "true" => "false",
        "false" => "true",
        _ => return None,
    };
    let is_key = key.starts_with("queue.")
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_');
    is_key.then(|| format!("lease-sweeper gates set {key} {open} --actor NAME"))
}

#[cfg(test)]
mod tests {
    use super::gate_opener;

    #[test]
    fn a_closed_gate_names_the_command_that_opens_it_and_nothing_else_does() {
        assert_eq!(
            gate_opener("queue.job_substrate.enabled=false").as_deref(),
            Some("lease-sweeper gates set queue.job_substrate.enabled true --actor NAME")
        );
        assert_eq!(
            gate_opener("queue.lease.reaper_dry_run_only=true").as_deref(),
            Some("lease-sweeper gates set queue.lease.reaper_dry_run_only false --actor NAME")
        );
        for other in [
            "actor_required",
            "limit_out_of_range",
            "queue.retry.backoff_base_sec_invalid",
            "fn_queue_setting_set: unknown setting key \"x=true\"",
        ] {
            assert_eq!(gate_opener(other), None, "{other}");
        }
    }
}
