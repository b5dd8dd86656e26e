//! The metrics the services report, one call each, delivered to StatsD and,
//! when the scrape endpoint is on, to the Prometheus series.
//!
//! Owns the StatsD half of the metric contract (names without prefix,
//! DogStatsD tags in a fixed order, counters sent only when non-zero) and
//! keeps the two sinks in step: every call updates both, so a scrape and the
//! StatsD counts are the same numbers. Delivery is `output::statsd`'s;
//! the Prometheus names are `output::prometheus`'s. Metrics are best effort;
//! sweeping is not, so nothing here returns an error to the sweep.

use std::time::Duration;

use cadence::{Counted, Gauged};

use crate::config::StatsdTarget;
use crate::output::prometheus::Exposition;
use crate::output::statsd::Statsd;

/// Expired lock leases reaped (swept or taken over). Tags: `backend`.
pub const LEASE_EXPIRED: &str = "lock.lease.expired";
/// Leases held after a sweep. Tags: `backend`.
pub const HELD_CURRENT: &str = "lock.held.current";
/// Stale job leases acted on by the reaper. Tags: `backend`, `action`.
pub const JOB_LEASE_REAPED: &str = "queue.lease.reaped";
/// Stale job leases seen by the dry run. Tags: `backend`.
pub const JOB_STALE_CURRENT: &str = "queue.lease.stale.current";
/// How long the oldest holder of the database's xmin horizon has held it,
/// in seconds (0 when nothing does). No tags.
pub const XMIN_HORIZON_AGE: &str = "pg.xmin_horizon.age_seconds";
/// Dead rows (`n_dead_tup`) of a swept table. Tags: `table`.
pub const DEAD_ROWS_CURRENT: &str = "pg.dead_rows.current";

/// The daemon's metrics. Cloning shares them.
#[derive(Clone)]
pub struct Metrics {
    statsd: Statsd,
    prometheus: Option<Exposition>,
}

impl Metrics {
    /// StatsD only.
    pub fn new(target: StatsdTarget) -> Self {
        Self {
            statsd: Statsd::new(target),
            prometheus: None,
        }
    }

    /// StatsD and the Prometheus series `exposition` renders.
    pub fn with_prometheus(target: StatsdTarget, exposition: Exposition) -> Self {
        Self {
            statsd: Statsd::new(target),
            prometheus: Some(exposition),
        }
    }

    /// Adds `n` to `lock.lease.expired`; nothing is sent for zero (the
    /// Prometheus counter is registered at zero).
    pub fn lease_expired(&self, backend: &'static str, n: u64) {
        if n > 0 {
            self.statsd
                .client
                .count_with_tags(LEASE_EXPIRED, n)
                .with_tag("backend", backend)
                .send();
        }
        if let Some(p) = &self.prometheus {
            p.lease_expired(backend, n);
        }
    }

    /// Adds `n` to `queue.lease.reaped` for one action; nothing is sent for
    /// zero (the Prometheus counter is registered at zero).
    pub fn job_lease_reaped(&self, backend: &'static str, action: &'static str, n: u64) {
        if n > 0 {
            self.statsd
                .client
                .count_with_tags(JOB_LEASE_REAPED, n)
                .with_tag("backend", backend)
                .with_tag("action", action)
                .send();
        }
        if let Some(p) = &self.prometheus {
            p.job_lease_reaped(backend, action, n);
        }
    }

    pub fn held_current(&self, backend: &'static str, held: u64) {
        self.statsd
            .client
            .gauge_with_tags(HELD_CURRENT, held)
            .with_tag("backend", backend)
            .send();
        if let Some(p) = &self.prometheus {
            p.held_current(backend, held);
        }
    }

    pub fn stale_jobs_current(&self, backend: &'static str, stale: u64) {
        self.statsd
            .client
            .gauge_with_tags(JOB_STALE_CURRENT, stale)
            .with_tag("backend", backend)
            .send();
        if let Some(p) = &self.prometheus {
            p.stale_jobs_current(backend, stale);
        }
    }

    /// The horizon check's answer: the oldest holder's age (whole seconds in
    /// both sinks) and each table's dead rows (`table` is `lock_entry` or
    /// `job_queue`).
    pub fn horizon(&self, age: Duration, dead: &[(&'static str, u64)]) {
        self.statsd
            .client
            .gauge_with_tags(XMIN_HORIZON_AGE, age.as_secs())
            .send();
        for &(table, rows) in dead {
            self.statsd
                .client
                .gauge_with_tags(DEAD_ROWS_CURRENT, rows)
                .with_tag("table", table)
                .send();
        }
        if let Some(p) = &self.prometheus {
            p.horizon(age, dead);
        }
    }

    /// A service's loop started (Prometheus only: its failure counter
    /// starts at zero).
    pub fn service_started(&self, service: &'static str) {
        if let Some(p) = &self.prometheus {
            p.service_started(service);
        }
    }

    /// A pass of `service` finished (Prometheus only: the daemon's health).
    pub fn pass_finished(&self, service: &'static str, succeeded: bool, took: Duration) {
        if let Some(p) = &self.prometheus {
            p.pass_finished(service, succeeded, took);
        }
    }

    /// Sends what StatsD has buffered (the Prometheus series need no flush:
    /// a scrape reads them as they are).
    pub async fn flush(&self) {
        self.statsd.flush().await;
    }
}
