//! Diagnostics: the `tracing` subscriber that writes every non-signal line.
//!
//! Owns the logfmt layout of diagnostic lines (`ts`, lower-case `level`, the
//! event name as `message`, then the event's fields, escaped by `logfmt`), the
//! level filter (`RUST_LOG`, default `info` with sqlx's per-query chatter
//! held at `warn`) and the timestamp format shared with `events`. The signal
//! lines themselves (`lease_expired`, `job_lease_expired`) are written by
//! `events` and are out of this filter's reach.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::output::logfmt::push_pair;

/// Used when `RUST_LOG` is unset: operational events at INFO, and sqlx's
/// per-statement DEBUG lines off (they would log every sweep's query).
pub const DEFAULT_FILTER: &str = "info,sqlx=warn";

/// `RUST_LOG` holds a directive `tracing` cannot parse.
#[derive(Debug, thiserror::Error)]
#[error("RUST_LOG is not a valid filter ({0}); try RUST_LOG=info or RUST_LOG=lease_sweeper=debug")]
pub struct FilterError(String);

/// Where diagnostics go: stdout for the daemon and the demo (one stream for
/// the log pipeline), stderr for one-shot commands whose stdout is a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Stdout,
    Stderr,
}

/// Installs the global subscriber writing logfmt lines.
pub fn init(output: Output) -> Result<(), FilterError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => {
            EnvFilter::try_new(spec).map_err(|e| FilterError(e.to_string()))?
        }
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    let writer = match output {
        Output::Stdout => BoxMakeWriter::new(std::io::stdout),
        Output::Stderr => BoxMakeWriter::new(std::io::stderr),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .event_format(Logfmt)
        .init();
    Ok(())
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T20:45:58.123Z`.
pub fn timestamp_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.millisecond()
    )
}

/// The event formatter: one logfmt line per event.
pub struct Logfmt;

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut line = String::with_capacity(160);
        push_pair(&mut line, "ts", &timestamp_now());
        push_pair(&mut line, "level", level_name(*meta.level()));
        push_pair(
            &mut line,
            "message",
            fields.message.as_deref().unwrap_or(""),
        );
        for (key, value) in &fields.rest {
            push_pair(&mut line, key, value);
        }
        // Events from dependencies (sqlx, tokio) say where they came from.
        if !meta.target().starts_with("lease_sweeper") {
            push_pair(&mut line, "target", meta.target());
        }
        writeln!(writer, "{line}")
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string());
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = Some(value);
        } else {
            self.rest.push((field.name(), value));
        }
    }
}
