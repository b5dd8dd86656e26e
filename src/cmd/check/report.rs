//! `check`'s output: one line per check with its status (`ok`, `warn`,
//! `FAIL`), aligned, the verdict that counts them, and the wording the
//! checks share. It decides nothing about what is checked, and imports no
//! other part of `check`.

use std::fmt;

use crate::config::Redactor;

/// Said whenever part of the schema is missing.
pub(super) const MIGRATE_HINT: &str =
    "run `lease-sweeper migrate` with a role that may create objects";

/// How a FAIL line about a missing privilege starts.
pub(super) const LACKS: &str = "this role lacks ";

/// Added to the verdict when privileges are missing: the migrations ship a
/// role holding exactly what `run` and `check` need.
const ROLE_HINT: &str = "; the migrated role lease_sweeper holds every privilege listed: GRANT lease_sweeper TO <this role>";

/// The FAIL line of a catalog question that itself failed, in the
/// server's words (scrubbed of secrets).
pub(super) fn query_failed(what: String, redactor: &Redactor, err: &sqlx::Error) -> Line {
    Line::fail(what, redactor.redact(&crate::pg::conn::describe(err)))
}

/// What a check found: the first word of its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// As the daemon needs it.
    Ok,
    /// Works, but worth acting on (a superuser, an unset target, a schema
    /// newer than this binary): the exit status stays 0.
    Warn,
    /// The daemon would fail or lack something: the line says what to do.
    Fail,
}

impl Status {
    /// The word that starts the line; `STATUS_WIDTH` wide at most.
    pub fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// Every status word is padded to this width, so the checks line up.
const STATUS_WIDTH: usize = 4;

/// One check's result: one output line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub status: Status,
    /// What was checked, e.g. `table lock_entry`.
    pub what: String,
    /// What was found, or what to do about it.
    pub detail: String,
}

impl Line {
    pub(super) fn new(status: Status, what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status,
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub(super) fn ok(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Status::Ok, what, detail)
    }

    pub(super) fn warn(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Status::Warn, what, detail)
    }

    pub(super) fn fail(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(Status::Fail, what, detail)
    }

    pub fn failed(&self) -> bool {
        self.status == Status::Fail
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<STATUS_WIDTH$}  {}: {}",
            self.status.word(),
            self.what,
            self.detail
        )
    }
}

/// Every check's line, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    /// No line is `FAIL` (warnings pass): what decides the exit status.
    pub fn passed(&self) -> bool {
        self.failed() == 0
    }

    pub fn failed(&self) -> usize {
        self.count(Status::Fail)
    }

    pub fn warned(&self) -> usize {
        self.count(Status::Warn)
    }

    fn count(&self, status: Status) -> usize {
        self.lines.iter().filter(|l| l.status == status).count()
    }

    /// The last line: a verdict an operator can read without scrolling.
    pub fn summary(&self) -> String {
        let total = self.lines.len();
        let warned = self.warned();
        let warnings = match warned {
            1 => "1 warning".to_owned(),
            n => format!("{n} warnings"),
        };
        if self.passed() {
            if warned == 0 {
                format!("check passed: all {total} checks ok")
            } else {
                format!(
                    "check passed: {} of {total} checks ok, {warnings} (see the warn lines above)",
                    total - warned
                )
            }
        } else {
            let grants_missing = self
                .lines
                .iter()
                .any(|l| l.failed() && l.detail.starts_with(LACKS));
            let (also, see) = if warned == 0 {
                (String::new(), "the FAIL lines")
            } else {
                (format!(", {warnings}"), "the FAIL and warn lines")
            };
            format!(
                "check FAILED: {} of {total} checks failed{also} (see {see} above){}",
                self.failed(),
                if grants_missing { ROLE_HINT } else { "" }
            )
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "{}", self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status]) -> Report {
        Report {
            lines: statuses
                .iter()
                .enumerate()
                .map(|(i, s)| Line::new(*s, format!("check {i}"), "found"))
                .collect(),
        }
    }

    #[test]
    fn the_three_statuses_line_up() {
        let lines: Vec<String> = [Status::Ok, Status::Warn, Status::Fail]
            .into_iter()
            .map(|s| Line::new(s, "x", "y").to_string())
            .collect();
        assert_eq!(lines, ["ok    x: y", "warn  x: y", "FAIL  x: y"]);
    }

    #[test]
    fn warnings_pass_and_are_counted_in_the_summary() {
        use Status::*;
        let clean = report(&[Ok, Ok]);
        assert!(clean.passed());
        assert_eq!(clean.summary(), "check passed: all 2 checks ok");

        let warned = report(&[Ok, Warn, Ok]);
        assert!(warned.passed(), "a warning does not fail the check");
        assert_eq!(
            warned.summary(),
            "check passed: 2 of 3 checks ok, 1 warning (see the warn lines above)"
        );

        let failed = report(&[Fail, Warn, Warn, Ok]);
        assert!(!failed.passed());
        assert_eq!((failed.failed(), failed.warned()), (1, 2));
        assert_eq!(
            failed.summary(),
            "check FAILED: 1 of 4 checks failed, 2 warnings (see the FAIL and warn lines above)"
        );
        assert_eq!(
            report(&[Fail, Ok]).summary(),
            "check FAILED: 1 of 2 checks failed (see the FAIL lines above)"
        );
    }
}
