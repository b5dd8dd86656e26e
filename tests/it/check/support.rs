//! Helpers the `check` suites share (`schema`, `connection`,
//! `command`): the password every test URL carries, putting it in,
//! running the preflight in process, and finding one line of its report.
//! Helpers one suite alone uses stay in that suite; the gates and database
//! helpers every suite shares live in `support`.

use lease_sweeper::testing::check::{self, Report};
use lease_sweeper::testing::config::{DbTarget, StatsdTarget};

/// Put into every URL these tests hand to `check`; must never be printed.
pub const PASSWORD: &str = "Pre-Fl1ght-S3cret";

/// `url` with a password. Servers with trust authentication (the throwaway
/// cluster) ignore it; a URL that already carries one keeps it. Returns the
/// URL and the password to look for in the output. (A role of the test's
/// own gets its password from `LoginRole::with_password`.)
pub fn with_credentials(url: &str, password: &str) -> (String, String) {
    let mut url = url::Url::parse(url).expect("test URL parses");
    if url.password().is_none() {
        url.set_password(Some(password)).unwrap();
    }
    let secret = url.password().unwrap().to_owned();
    (url.to_string(), secret)
}

pub async fn preflight(url: &str, statsd: &StatsdTarget) -> Report {
    let target = DbTarget::from_url("LOCKDB_URL", url).expect("URL parses");
    check::preflight(&target, statsd).await
}

pub fn line<'a>(report: &'a Report, what: &str) -> &'a check::Line {
    report
        .lines
        .iter()
        .find(|l| l.what == what)
        .unwrap_or_else(|| panic!("no line for {what:?} in:\n{report}"))
}
