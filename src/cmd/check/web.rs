//! `check`'s line about the metrics endpoint's web configuration file: the
//! file read and built exactly as `run` reads it at start, so the line
//! fails where `run` would refuse to start, with the same words.
//!
//! It does not serve, and says nothing when the file is not configured.

use std::path::Path;

use super::report::Line;

/// The line's subject.
pub const SUBJECT: &str = "metrics endpoint web config";

/// `ok` with a summary, `warn` for an expired server certificate (served
/// all the same, as by Prometheus's toolkit) or client certificates checked
/// against no CA or every public one, or `FAIL` with `run`'s error.
pub fn line(path: &Path) -> Line {
    let active = match crate::output::web_config::load(path) {
        Err(e) => return Line::fail(SUBJECT, e.to_string()),
        Ok(active) => active,
    };
    let mut warnings = Vec::new();
    if active.expired {
        warnings.push(format!(
            "the server certificate expired at {}; clients that check it will refuse the \
             endpoint: renew it (the endpoint takes the new one at the next connection)",
            active.not_after.as_deref().unwrap_or("?")
        ));
    }
    warnings.extend(active.warnings.iter().cloned());
    if warnings.is_empty() {
        Line::ok(SUBJECT, format!("{}: {}", path.display(), active.summary()))
    } else {
        Line::warn(
            SUBJECT,
            format!("{}: {}", path.display(), warnings.join("; ")),
        )
    }
}
