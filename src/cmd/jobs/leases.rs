//! `lease-sweeper leases` and `leases set|clear KIND`: each job kind's lease
//! duration, shown or changed through the audited setter.

use std::io::{self, Write};
use std::process::ExitCode;

use serde_json::Value;
use tracing::error;

use crate::cli::{LeasesArgs, LeasesCommand};
use sqlx::Connection as _;

use crate::config::DbTarget;
use crate::output::table;
use crate::pg::conn::in_tx;
use crate::pg::job_queue as q;

use super::common::*;

/// `leases` / `leases set` / `leases clear` against the database named by
/// the environment.
pub async fn leases(args: LeasesArgs) -> anyhow::Result<ExitCode> {
    let target = DbTarget::from_env()?;
    let format = Format::for_stdout(args.output.json);
    run_leases(&target, args.command, &mut io::stdout(), format).await
}

/// `leases …` against `target`, printing to `out` (the testable core).
pub async fn run_leases(
    target: &DbTarget,
    cmd: Option<LeasesCommand>,
    out: &mut dyn Write,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let mut conn = open(target).await?;
    let has = in_tx(&mut conn, async |c| q::has_kind_leases(c).await)
        .await
        .map_err(|e| db_error(target, "looking for job_kind_lease", &e))?;
    if !has {
        conn.close().await.ok();
        anyhow::bail!(NO_KIND_LEASES);
    }
    let (kind, seconds, actor) = match cmd {
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

/// Said on a queue without per-kind lease durations (one adopted as its own
/// tool made it, with no `job_kind_lease`).
pub(crate) const NO_KIND_LEASES: &str = "the adopted job queue has no per-kind lease durations \
     (no table job_kind_lease on this role's search path): its own claims decide how long a job is \
     leased, and the reaper reaps whatever passed its lease_until all the same; `leases` shows and \
     changes per-kind durations only on a queue that has them, such as the stand-in `migrate` \
     creates where there is no job queue";

/// What the `leases` commands need, said when the role lacks it: the
/// daemon's own role may run `gates` but holds nothing on kind durations.
const LEASES_NEED: &str = "`leases` needs SELECT on job_kind_lease and queue_setting, `leases set`/`clear` EXECUTE on \
     fn_job_kind_lease_set (which the owner grants to operators, never to lease_sweeper); run it as an operator's role";

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
