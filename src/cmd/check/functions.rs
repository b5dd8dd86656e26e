//! `check`'s line on the sidecar's functions: whether the database has each
//! one this binary ships, with this binary's text (`lease_sweeper_sql`
//! records the SHA-256 of the text `migrate` applied), and none it no longer
//! ships. The versioned migrations are another line (`schema::migrations`):
//! a database can have every migration and stale functions.

use sqlx::PgConnection;

use super::report::Line;
use crate::pg::catalog::{self, FunctionText};

pub(super) const FUNCTIONS: &str = "functions";

/// What to do about any difference: `migrate` applies exactly the
/// functions whose text differs, and drops the ones no longer shipped.
const FIX: &str = "run `lease-sweeper migrate` with this binary";

/// Compares the database's functions with the binary's. A shipped function
/// missing, or installed with other text, FAILs: the daemon would call what
/// is not there, or run SQL its binary was not built with. Only a warning
/// while `newer_schema` (the database has migrations this binary lacks: an
/// upgrade rolling out, whose newer functions this host still runs until it
/// is upgraded too), and for functions the database has that the binary no
/// longer ships.
pub(super) async fn function_texts(
    conn: &mut PgConnection,
    newer_schema: bool,
) -> Result<Line, sqlx::Error> {
    Ok(judge(&catalog::function_texts(conn).await?, newer_schema))
}

fn judge(rows: &[FunctionText], newer_schema: bool) -> Line {
    let names = |pick: &dyn Fn(&FunctionText) -> bool| -> Vec<&str> {
        rows.iter()
            .filter(|r| pick(r))
            .map(|r| r.name.as_str())
            .collect()
    };
    let missing = names(&|r| r.shipped && !r.present);
    let differs = names(&|r| r.shipped && r.present && r.recorded && !r.same);
    let unrecorded = names(&|r| r.shipped && r.present && !r.recorded);
    let retired = crate::pg::sql::RETIRED;
    let unshipped = names(&|r| !r.shipped && !retired.contains(&r.name.as_str()));
    let shipped = rows.iter().filter(|r| r.shipped).count();

    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "{} missing from the database (a daemon's call of it fails)",
            missing.join(", ")
        ));
    }
    if !differs.is_empty() {
        problems.push(format!(
            "{} installed with other text than this binary's (a daemon runs SQL its binary was not built with)",
            differs.join(", ")
        ));
    }
    if !unrecorded.is_empty() {
        problems.push(format!(
            "{} installed but not recorded in lease_sweeper_sql, so its text is unknown",
            unrecorded.join(", ")
        ));
    }
    if !problems.is_empty() {
        let detail = format!("{}; {FIX}", problems.join("; "));
        return if newer_schema && missing.is_empty() {
            Line::warn(
                FUNCTIONS,
                format!(
                    "{detail} (or, while an upgrade rolls out and the database is newer than this \
                     binary, upgrade this host)"
                ),
            )
        } else {
            Line::fail(FUNCTIONS, detail)
        };
    }
    if !unshipped.is_empty() {
        return Line::warn(
            FUNCTIONS,
            format!(
                "all {shipped} of this binary's functions are installed with its text; the \
                 database also has {}, which this binary does not ship: fine while an upgrade \
                 rolls out, else {FIX} (it drops them)",
                unshipped.join(", ")
            ),
        );
    }
    Line::ok(
        FUNCTIONS,
        format!("all {shipped} of this binary's functions are installed with its text"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::check::Status;

    fn row(name: &str, shipped: bool, recorded: bool, same: bool, present: bool) -> FunctionText {
        FunctionText {
            name: name.to_owned(),
            shipped,
            recorded,
            same,
            present,
        }
    }

    #[test]
    fn every_function_current_is_ok() {
        let line = judge(
            &[
                row("a", true, true, true, true),
                row("b", true, true, true, true),
            ],
            false,
        );
        assert_eq!(line.status, Status::Ok);
        assert_eq!(
            line.detail,
            "all 2 of this binary's functions are installed with its text"
        );
    }

    #[test]
    fn stale_missing_and_unrecorded_functions_fail_by_name() {
        let line = judge(
            &[
                row("a", true, true, false, true),
                row("b", true, true, true, false),
                row("c", true, false, false, true),
            ],
            false,
        );
        assert_eq!(line.status, Status::Fail);
        assert_eq!(
            line.detail,
            "b missing from the database (a daemon's call of it fails); a installed with other \
             text than this binary's (a daemon runs SQL its binary was not built with); c \
             installed but not recorded in lease_sweeper_sql, so its text is unknown; run \
             `lease-sweeper migrate` with this binary"
        );
    }

    #[test]
    fn stale_text_under_a_newer_schema_warns() {
        let line = judge(&[row("a", true, true, false, true)], true);
        assert_eq!(line.status, Status::Warn);
    }

    #[test]
    fn a_function_no_longer_shipped_warns_by_name() {
        let line = judge(
            &[
                row("a", true, true, true, true),
                row("gone", false, true, false, true),
            ],
            false,
        );
        assert_eq!(line.status, Status::Warn);
        assert!(
            line.detail
                .contains("the database also has gone, which this binary does not ship")
        );
    }
}
