//! The services' diagnostic lines, captured in a unit test: written in the
//! daemon's logfmt layout (`output::telemetry::Logfmt`) to memory and read
//! back by event. Test-only; it owns no layout of its own.

use std::collections::HashMap;

use tracing::subscriber::DefaultGuard;

use crate::output::events::MemoryLog;
use crate::output::logfmt::decode_line;
use crate::output::telemetry::Logfmt;

/// Every line logged on this thread while it lives (a `#[tokio::test]`
/// runs its futures on the test's own thread).
pub struct Captured {
    log: MemoryLog,
    _guard: DefaultGuard,
}

pub fn capture() -> Captured {
    let log = MemoryLog::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .event_format(Logfmt)
        .finish();
    Captured {
        log,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

impl Captured {
    /// The fields of every line whose event is `message`, in order.
    pub fn events(&self, message: &str) -> Vec<HashMap<String, String>> {
        self.log
            .lines()
            .iter()
            .filter_map(|line| decode_line(line))
            .map(|pairs| pairs.into_iter().collect::<HashMap<_, _>>())
            .filter(|fields| fields.get("message").map(String::as_str) == Some(message))
            .collect()
    }
}
