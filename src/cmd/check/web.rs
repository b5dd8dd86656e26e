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
/// all the same, as by Prometheus's toolkit), or `FAIL` with `run`'s error.
pub fn line(path: &Path) -> Line {
    match crate::output::web_config::load(path) {
        Err(e) => Line::fail(SUBJECT, e.to_string()),
        Ok(active) if active.expired => Line::warn(
            SUBJECT,
            format!(
                "{}: the server certificate expired at {}; clients that check it will refuse \
                 the endpoint: renew it (the endpoint takes the new one at the next connection)",
                path.display(),
                active.not_after.as_deref().unwrap_or("?")
            ),
        ),
        Ok(active) => Line::ok(SUBJECT, format!("{}: {}", path.display(), active.summary())),
    }
}
