//! `lease-sweeper gates` and `gates set KEY VALUE --actor NAME`: the queue's
//! three gates and settings, shown or changed through the audited setter.

use std::io::{self, Write};
use std::process::ExitCode;

use serde_json::Value;
use tracing::error;

use crate::cli::{GatesArgs, GatesCommand};
use sqlx::Connection as _;

use crate::config::DbTarget;
use crate::output::table;
use crate::pg::conn::in_tx;
use crate::pg::job_queue as q;

use super::common::*;

/// `gates` / `gates set` against the database named by the environment.
pub async fn gates(args: GatesArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let format = Format::for_stdout(args.output.json);
    run_gates(&target, args.command, &mut io::stdout(), format).await
}

/// `gates …` against `target`, printing to `out` (the testable core).
pub async fn run_gates(
    target: &DbTarget,
    cmd: Option<GatesCommand>,
    out: &mut dyn Write,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let code = match cmd {
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

/// What `gates set` needs, said when the role lacks it.
const GATES_NEED: &str = "`gates set` needs EXECUTE on fn_queue_setting_set (which the owner grants to operators, \
     never to lease_sweeper); run it as an operator's role";

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
            Some(reason) => {
                let mut line = format!(
                    "\napply now: refused ({}): stale job leases are left alone\n",
                    table::printable(reason)
                );
                if let Some(open) = gate_opener(reason) {
                    line.push_str(&format!("to open that gate: {open}\n"));
                }
                line
            }
        },
    );
    out
}

fn setting_table(v: &Value) -> String {
    let row = ["key", "old_value", "value", "updated_by"]
        .iter()
        .map(|k| cell(v, k))
        .collect();
    table::render(&["SETTING", "OLD", "NEW", "BY"], &[row])
}
