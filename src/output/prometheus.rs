//! The Prometheus series: their names, help texts, labels and values, and
//! their rendering in the text exposition format that `GET /metrics` serves.
//!
//! Owns the Prometheus half of the metric contract: the signal series carry
//! the StatsD names and tag sets in Prometheus's spelling, the health series
//! follow Prometheus's conventions, and every label value is a fixed string,
//! so no key, owner or token becomes a series. It does not listen
//! (`output::scrape` serves what `render` returns) nor decide when a value
//! changes (`output::metrics` does). Why metrics-exporter-prometheus, as a
//! recorder the daemon owns: docs/decisions.md, section 13.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::model::ReapedBy;
use metrics::{Key, Label, Level, Metadata, Recorder as _, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

/// Expired lock leases reaped (swept or taken over); one per `lease_expired`
/// line. Labels: `backend`.
pub const LEASE_EXPIRED: &str = "lock_lease_expired_total";
/// Revisions etcd compacted before the sidecar read them: expiries among
/// them go unreported. Labels: `backend`.
pub const EVENTS_MISSED: &str = "lock_events_missed_total";
/// Lock batches taken row by row because their one set-based statement
/// failed. Labels: `backend`.
pub const BATCH_FALLBACK: &str = "lock_batch_fallback_total";
/// Leases held after the last sweep. Labels: `backend`.
pub const HELD_CURRENT: &str = "lock_held_current";
/// Stale job leases acted on; one per `job_lease_expired` line. Labels:
/// `backend`, `action`.
pub const JOB_LEASE_REAPED: &str = "queue_lease_reaped_total";
/// Stale job leases seen after the last job pass. Labels: `backend`.
pub const JOB_STALE_CURRENT: &str = "queue_lease_stale_current";
/// How late each reported lease was: its `overdueMillis`, in seconds, one
/// observation per `lease_expired` line. Labels: `backend`, `reaped_by`
/// (`sweep` or `takeover`).
pub const LEASE_OVERDUE: &str = "lock_lease_overdue_seconds";
/// How late each reaped job lease was: its `overdueMillis`, in seconds, one
/// observation per `job_lease_expired` line. Labels: `backend`, `action`.
pub const JOB_LEASE_OVERDUE: &str = "queue_lease_overdue_seconds";
/// How long the oldest holder of the xmin horizon has held it, in seconds
/// (`output::metrics::XMIN_HORIZON_AGE`, same name). No labels.
pub const XMIN_HORIZON_AGE: &str = "pg_xmin_horizon_age_seconds";
/// Dead rows of a swept table. Labels: `table`, one of two fixed names
/// (`lock_entry`, `job_queue`), like the other labels' values.
pub const DEAD_ROWS_CURRENT: &str = "pg_dead_rows_current";
/// Always 1; the label says which build is running. Labels: `version`.
pub const BUILD_INFO: &str = "lease_sweeper_build_info";
/// Passes that failed (the database was down, a statement failed). Labels:
/// `service`.
pub const PASS_FAILURES: &str = "lease_sweeper_pass_failures_total";
/// When a pass last succeeded, in seconds since the Unix epoch. Labels:
/// `service`.
pub const LAST_SUCCESS: &str = "lease_sweeper_last_success_timestamp_seconds";
/// How long passes take, failed ones included. Labels: `service`.
pub const PASS_DURATION: &str = "lease_sweeper_pass_duration_seconds";

/// Buckets of `PASS_DURATION`, in seconds: an idle pass is about a
/// millisecond; a backlog drain can take seconds; past 30 s the watchdog and
/// the "no successful pass" alert speak first.
const PASS_DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of `LEASE_OVERDUE` and `JOB_LEASE_OVERDUE`, in seconds. A healthy
/// signal is late by up to one sweep delay (1 s) plus the pass in flight, so
/// 0-1.1 s: 0.1-1 split that range (a p50 near 0.5 s is health), 1.25 and 1.5
/// tell a busy sweep from one held up (the lateness alert fires above 1.5 s),
/// 2-10 s measure a storm or a stall (a drain of 200,000 leases, a lookup or
/// a lock wait on the sweep's path), and 30-300 s a sweeper that was down
/// (a restart, an outage) or a job lease reaped only once its gates opened.
const OVERDUE_BUCKETS: [f64; 14] = [
    0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Where a series was registered from, as the `metrics` crate asks to know.
const METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The daemon's Prometheus series. Cloning shares them.
#[derive(Clone)]
pub struct Exposition {
    recorder: std::sync::Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
}

impl Exposition {
    /// The series, described, with the build-info series already at 1.
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(PASS_DURATION.into()), &PASS_DURATION_BUCKETS)
            .expect("the pass-duration buckets are a non-empty constant")
            .set_buckets_for_metric(Matcher::Full(LEASE_OVERDUE.into()), &OVERDUE_BUCKETS)
            .expect("the lateness buckets are a non-empty constant")
            .set_buckets_for_metric(Matcher::Full(JOB_LEASE_OVERDUE.into()), &OVERDUE_BUCKETS)
            .expect("the lateness buckets are a non-empty constant")
            .build_recorder();
        for (name, unit, help) in [
            (
                LEASE_EXPIRED,
                None,
                "Expired lock leases reaped, swept or taken over: one per lease_expired line.",
            ),
            (
                EVENTS_MISSED,
                None,
                "Revisions etcd compacted before the sidecar read them (each a change to one or more keys; expiries among them go unreported); each run also logged as etcd_events_missed.",
            ),
            (
                BATCH_FALLBACK,
                None,
                "Lock batches taken row by row because their one set-based statement failed; the first of each cause also logged as lock_batch_fallback.",
            ),
            (
                HELD_CURRENT,
                None,
                "Lock leases held after the last sweep (expired but unswept ones included).",
            ),
            (
                JOB_LEASE_REAPED,
                None,
                "Stale job leases acted on by the reaper: one per job_lease_expired line.",
            ),
            (
                JOB_STALE_CURRENT,
                None,
                "Stale job leases seen after the last job pass.",
            ),
            (
                LEASE_OVERDUE,
                Some(Unit::Seconds),
                "How late each reported lock lease was (its overdueMillis), by how it was reaped: one observation per lease_expired line.",
            ),
            (
                JOB_LEASE_OVERDUE,
                Some(Unit::Seconds),
                "How late each reaped job lease was (its overdueMillis), by action: one observation per job_lease_expired line.",
            ),
            (
                XMIN_HORIZON_AGE,
                Some(Unit::Seconds),
                "How long the oldest holder of the database's xmin horizon has held it (0: none); see xmin_horizon_held.",
            ),
            (
                DEAD_ROWS_CURRENT,
                None,
                "Dead rows of a swept table (n_dead_tup: deleted, not yet vacuumed; after a vacuum, those it could not remove).",
            ),
            (
                BUILD_INFO,
                None,
                "Always 1; the version label names the running build.",
            ),
            (
                PASS_FAILURES,
                None,
                "Passes that failed, per service (each also logged as <work>_failed, at most once a minute while it persists).",
            ),
            (
                LAST_SUCCESS,
                Some(Unit::Seconds),
                "When a pass last succeeded, per service, in seconds since the Unix epoch.",
            ),
            (
                PASS_DURATION,
                Some(Unit::Seconds),
                "How long passes take, per service, failed ones included.",
            ),
        ] {
            // describe_* differ only in the type they document; the
            // exposition's TYPE line comes from how a series is registered.
            recorder.describe_counter(name.into(), unit, help.into());
        }
        let handle = recorder.handle();
        let exposition = Self {
            recorder: std::sync::Arc::new(recorder),
            handle,
        };
        exposition
            .gauge(BUILD_INFO, &[("version", env!("CARGO_PKG_VERSION"))])
            .set(1.0);
        exposition
    }

    fn counter(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> metrics::Counter {
        self.recorder
            .register_counter(&key(name, labels), &METADATA)
    }

    fn gauge(&self, name: &'static str, labels: &[(&'static str, &'static str)]) -> metrics::Gauge {
        self.recorder.register_gauge(&key(name, labels), &METADATA)
    }

    fn histogram(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> metrics::Histogram {
        self.recorder
            .register_histogram(&key(name, labels), &METADATA)
    }

    /// Adds `n` (zero included: the series then exists from the first
    /// scrape, which `rate` and `increase` need) to `lock_lease_expired_total`.
    /// Zero also registers the lateness histograms of both ways of reaping.
    pub fn lease_expired(&self, backend: &'static str, n: u64) {
        self.counter(LEASE_EXPIRED, &[("backend", backend)])
            .increment(n);
        if n == 0 {
            for &by in ReapedBy::of_backend(backend) {
                // Registered is enough: it renders with count 0.
                let _ = self.lease_overdue_histogram(backend, by);
            }
        }
    }

    /// Adds `n` (zero included) to `queue_lease_reaped_total` for one action;
    /// zero also registers that action's lateness histogram.
    pub fn job_lease_reaped(&self, backend: &'static str, action: &'static str, n: u64) {
        self.counter(
            JOB_LEASE_REAPED,
            &[("backend", backend), ("action", action)],
        )
        .increment(n);
        if n == 0 {
            let _ = self.histogram(
                JOB_LEASE_OVERDUE,
                &[("backend", backend), ("action", action)],
            );
        }
    }

    fn lease_overdue_histogram(&self, backend: &'static str, by: ReapedBy) -> metrics::Histogram {
        self.histogram(
            LEASE_OVERDUE,
            &[("backend", backend), ("reaped_by", by.as_str())],
        )
    }

    /// Observes the lateness of leases reaped one way in
    /// `lock_lease_overdue_seconds`.
    pub fn lease_overdue(
        &self,
        backend: &'static str,
        by: ReapedBy,
        overdue_millis: impl IntoIterator<Item = i64>,
    ) {
        let histogram = self.lease_overdue_histogram(backend, by);
        for millis in overdue_millis {
            histogram.record(seconds(millis));
        }
        // A drain observes 5,000 a batch: fold them into the buckets now,
        // not at the end of the pass, so memory stays flat however long it is.
        self.handle.run_upkeep();
    }

    /// Observes the lateness of one action's jobs in
    /// `queue_lease_overdue_seconds`.
    pub fn job_lease_overdue(
        &self,
        backend: &'static str,
        action: &'static str,
        overdue_millis: impl IntoIterator<Item = i64>,
    ) {
        let histogram = self.histogram(
            JOB_LEASE_OVERDUE,
            &[("backend", backend), ("action", action)],
        );
        for millis in overdue_millis {
            histogram.record(seconds(millis));
        }
        self.handle.run_upkeep();
    }

    /// Adds `n` (zero included, which registers it) to
    /// `lock_events_missed_total`.
    pub fn events_missed(&self, backend: &'static str, n: u64) {
        self.counter(EVENTS_MISSED, &[("backend", backend)])
            .increment(n);
    }

    /// Adds `n` (zero included, which registers it) to
    /// `lock_batch_fallback_total`.
    pub fn batch_fallback(&self, backend: &'static str, n: u64) {
        self.counter(BATCH_FALLBACK, &[("backend", backend)])
            .increment(n);
    }

    pub fn held_current(&self, backend: &'static str, held: u64) {
        self.gauge(HELD_CURRENT, &[("backend", backend)])
            .set(held as f64);
    }

    pub fn stale_jobs_current(&self, backend: &'static str, stale: u64) {
        self.gauge(JOB_STALE_CURRENT, &[("backend", backend)])
            .set(stale as f64);
    }

    /// The horizon check's gauges.
    pub fn horizon(&self, age: Duration, dead: &[(&'static str, u64)]) {
        self.gauge(XMIN_HORIZON_AGE, &[]).set(age.as_secs() as f64);
        for &(table, rows) in dead {
            self.gauge(DEAD_ROWS_CURRENT, &[("table", table)])
                .set(rows as f64);
        }
    }

    /// Registers a service's failure counter at zero, so an alert on its
    /// increase has a starting point before the first failure.
    pub fn service_started(&self, service: &'static str) {
        self.counter(PASS_FAILURES, &[("service", service)])
            .increment(0);
    }

    /// Records one finished pass of `service`.
    pub fn pass_finished(&self, service: &'static str, succeeded: bool, took: Duration) {
        let labels = [("service", service)];
        self.recorder
            .register_histogram(&key(PASS_DURATION, &labels), &METADATA)
            .record(took.as_secs_f64());
        if succeeded {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            self.gauge(LAST_SUCCESS, &labels).set(now.as_secs_f64());
        } else {
            self.counter(PASS_FAILURES, &labels).increment(1);
        }
        // Samples wait in the recorder until folded into the buckets; fold
        // them now, so memory stays bounded when nobody scrapes.
        self.handle.run_upkeep();
    }

    /// The exposition, in the text format (version 0.0.4).
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

impl Default for Exposition {
    fn default() -> Self {
        Self::new()
    }
}

/// Milliseconds late as seconds; a lease the database's clock saw as not yet
/// due (a clock step) counts as on time.
fn seconds(overdue_millis: i64) -> f64 {
    overdue_millis.max(0) as f64 / 1_000.0
}

fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
    Key::from_parts(
        name,
        labels
            .iter()
            .map(|&(k, v)| Label::new(k, v))
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_typed_described_and_labelled_by_the_fixed_sets() {
        let e = Exposition::new();
        e.lease_expired("pg", 0);
        e.lease_expired("pg", 3);
        e.job_lease_reaped("pg", "moved_to_dead_letter", 0);
        e.job_lease_reaped("pg", "moved_to_dead_letter", 2);
        e.held_current("pg", 4);
        e.stale_jobs_current("pg", 0);
        e.service_started("lock_sweeper");
        e.pass_finished("lock_sweeper", true, Duration::from_millis(3));
        e.pass_finished("lock_sweeper", false, Duration::from_millis(7));
        let text = e.render();

        for line in [
            "# TYPE lock_lease_expired_total counter",
            "lock_lease_expired_total{backend=\"pg\"} 3",
            "queue_lease_reaped_total{backend=\"pg\",action=\"moved_to_dead_letter\"} 2",
            "# TYPE lock_held_current gauge",
            "lock_held_current{backend=\"pg\"} 4",
            "queue_lease_stale_current{backend=\"pg\"} 0",
            concat!(
                "lease_sweeper_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
            "lease_sweeper_pass_failures_total{service=\"lock_sweeper\"} 1",
            "# TYPE lease_sweeper_pass_duration_seconds histogram",
            "lease_sweeper_pass_duration_seconds_count{service=\"lock_sweeper\"} 2",
            "lease_sweeper_pass_duration_seconds_bucket{service=\"lock_sweeper\",le=\"0.005\"} 1",
            "# TYPE lock_lease_overdue_seconds histogram",
            "lock_lease_overdue_seconds_count{backend=\"pg\",reaped_by=\"sweep\"} 0",
            "lock_lease_overdue_seconds_count{backend=\"pg\",reaped_by=\"takeover\"} 0",
            "# TYPE queue_lease_overdue_seconds histogram",
            "queue_lease_overdue_seconds_count{backend=\"pg\",action=\"moved_to_dead_letter\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        let help = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!((help, types), (10, 10), "{text}");
    }

    #[test]
    fn lateness_is_observed_per_lease_in_the_buckets_of_its_way_of_reaping() {
        let e = Exposition::new();
        e.lease_overdue("pg", ReapedBy::Sweep, [40, 600, 1_400]);
        e.lease_overdue("pg", ReapedBy::Takeover, [-3]);
        e.job_lease_overdue("pg", "reset_to_retry_waiting", [2_500, 70_000]);
        let text = e.render();

        for line in [
            "lock_lease_overdue_seconds_bucket{backend=\"pg\",reaped_by=\"sweep\",le=\"0.1\"} 1",
            "lock_lease_overdue_seconds_bucket{backend=\"pg\",reaped_by=\"sweep\",le=\"0.75\"} 2",
            "lock_lease_overdue_seconds_bucket{backend=\"pg\",reaped_by=\"sweep\",le=\"1.25\"} 2",
            "lock_lease_overdue_seconds_bucket{backend=\"pg\",reaped_by=\"sweep\",le=\"1.5\"} 3",
            "lock_lease_overdue_seconds_bucket{backend=\"pg\",reaped_by=\"sweep\",le=\"300\"} 3",
            "lock_lease_overdue_seconds_bucket{backend=\"pg\",reaped_by=\"sweep\",le=\"+Inf\"} 3",
            "lock_lease_overdue_seconds_sum{backend=\"pg\",reaped_by=\"sweep\"} 2.04",
            "lock_lease_overdue_seconds_count{backend=\"pg\",reaped_by=\"takeover\"} 1",
            "lock_lease_overdue_seconds_sum{backend=\"pg\",reaped_by=\"takeover\"} 0",
            "queue_lease_overdue_seconds_bucket{backend=\"pg\",action=\"reset_to_retry_waiting\",le=\"3\"} 1",
            "queue_lease_overdue_seconds_bucket{backend=\"pg\",action=\"reset_to_retry_waiting\",le=\"60\"} 1",
            "queue_lease_overdue_seconds_count{backend=\"pg\",action=\"reset_to_retry_waiting\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }

    #[test]
    fn zero_registers_a_counter_without_counting() {
        let e = Exposition::new();
        e.lease_expired("pg", 0);
        assert!(
            e.render()
                .lines()
                .any(|l| l == "lock_lease_expired_total{backend=\"pg\"} 0")
        );
    }
}
