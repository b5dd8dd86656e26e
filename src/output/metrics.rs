//! The metrics the services report, one call each, delivered to StatsD and,
//! when the scrape endpoint is on, to the Prometheus series.
//!
//! Owns the StatsD half of the metric contract (names without prefix,
//! DogStatsD tags in a fixed order, counters sent only when non-zero) and
//! keeps the two sinks in step: every call updates both, so a scrape and the
//! StatsD counts are the same numbers. Delivery is `output::statsd`'s;
//! the Prometheus names are `output::prometheus`'s. Metrics are best effort;
//! sweeping is not, so nothing here returns an error to the sweep.
//!
//! The one place the two differ is lateness: Prometheus observes every lease
//! and job (a histogram costs the same for any number), StatsD gets at most
//! `MAX_OVERDUE_SAMPLES` timer samples a batch per tag set, with their sample
//! rate, so a storm of 200,000 leases sends 4,000 timer lines, not 200,000;
//! a batch's lateness is gathered while its lines are written (`Lateness`)
//! and sampled once they all are. Counts are never sampled.

use std::time::Duration;

use cadence::{Counted, Gauged, Timed};

use crate::config::StatsdTarget;
use crate::model::{ACTION_DEAD_LETTER, ACTION_RESET, ExpiredLease, JobAction, ReapedBy};
use crate::output::prometheus::Exposition;
use crate::output::statsd::{FINISH_BOUND, Statsd};

/// Expired lock leases reaped (swept or taken over). Tags: `backend`.
pub const LEASE_EXPIRED: &str = "lock.lease.expired";
/// Revisions etcd compacted before the sidecar read them. Tags: `backend`.
pub const EVENTS_MISSED: &str = "lock.events.missed";
/// Lock batches taken row by row because their one set-based statement
/// failed. Tags: `backend`.
pub const BATCH_FALLBACK: &str = "lock.batch.fallback";
/// Leases held after a sweep. Tags: `backend`.
pub const HELD_CURRENT: &str = "lock.held.current";
/// Stale job leases acted on by the reaper. Tags: `backend`, `action`.
pub const JOB_LEASE_REAPED: &str = "queue.lease.reaped";
/// Stale job leases seen by the dry run. Tags: `backend`.
pub const JOB_STALE_CURRENT: &str = "queue.lease.stale.current";
/// How late reported lock leases were (`overdueMillis`), a timer in ms,
/// sampled (`MAX_OVERDUE_SAMPLES`). Tags: `backend`, `reaped_by`.
pub const LEASE_OVERDUE: &str = "lock.lease.overdue";
/// How late reaped job leases were (`overdueMillis`), a timer in ms, sampled
/// (`MAX_OVERDUE_SAMPLES`). Tags: `backend`, `action`.
pub const JOB_LEASE_OVERDUE: &str = "queue.lease.overdue";

/// Most lateness timer samples one batch sends to StatsD per tag set (per
/// `reaped_by`, per `action`). A batch with more leases (or jobs) of one tag
/// set sends this many of them, spread evenly through them, each with the
/// sample rate `|@<this>/<their number>`, so the agent scales its counts
/// back and its percentiles come from a sample across the whole batch; each
/// tag set is sampled on its own, so a rare one is never crowded out. 100 a
/// batch is plenty for a median and a 95th percentile, and a storm's 40
/// batches give 4,000 samples for its p99, while a full lock batch (5,000)
/// costs 100 lines, about four datagrams, instead of 5,000 (about 190).
pub const MAX_OVERDUE_SAMPLES: usize = 100;
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

    /// Records how late each of a batch's reported leases was, and empties
    /// `lateness`: every one in Prometheus, a sample of at most
    /// `MAX_OVERDUE_SAMPLES` per `reaped_by` in StatsD.
    pub fn lease_overdue(&self, backend: &'static str, lateness: &mut Lateness<ReapedBy>) {
        for by in ReapedBy::ALL {
            let group = lateness.of(by);
            if group.is_empty() {
                continue;
            }
            self.overdue_timers(LEASE_OVERDUE, backend, ("reaped_by", by.as_str()), &group);
            if let Some(p) = &self.prometheus {
                p.lease_overdue(backend, by, group);
            }
        }
        lateness.0.clear();
    }

    /// Records how late each of a batch's reaped jobs was, by action, and
    /// empties `lateness`: every one in Prometheus, a sample of at most
    /// `MAX_OVERDUE_SAMPLES` per action in StatsD. An action apply does not
    /// report today is not recorded.
    pub fn job_lease_overdue(&self, backend: &'static str, lateness: &mut Lateness<&'static str>) {
        for action in [ACTION_RESET, ACTION_DEAD_LETTER] {
            let group = lateness.of(action);
            if group.is_empty() {
                continue;
            }
            self.overdue_timers(JOB_LEASE_OVERDUE, backend, ("action", action), &group);
            if let Some(p) = &self.prometheus {
                p.job_lease_overdue(backend, action, group);
            }
        }
        lateness.0.clear();
    }

    /// One tag set's StatsD timers (`sampled`), tagged `backend` and `tag`,
    /// each with the sample rate when it is a sample.
    fn overdue_timers(
        &self,
        metric: &str,
        backend: &'static str,
        tag: (&str, &str),
        overdue_millis: &[i64],
    ) {
        let (rate, sample) = sampled(overdue_millis, MAX_OVERDUE_SAMPLES);
        for &overdue in sample {
            let timer = self
                .statsd
                .client
                .time_with_tags(metric, millis(overdue))
                .with_tag("backend", backend)
                .with_tag(tag.0, tag.1);
            match rate {
                Some(rate) => timer.with_sampling_rate(rate).send(),
                None => timer.send(),
            }
        }
    }

    /// Adds `n` to `lock.events.missed`; nothing is sent for zero.
    pub fn events_missed(&self, backend: &'static str, n: u64) {
        if n > 0 {
            self.statsd
                .client
                .count_with_tags(EVENTS_MISSED, n)
                .with_tag("backend", backend)
                .send();
        }
        if let Some(p) = &self.prometheus {
            p.events_missed(backend, n);
        }
    }

    /// Adds `n` to `lock.batch.fallback`; nothing is sent for zero.
    pub fn batch_fallback(&self, backend: &'static str, n: u64) {
        if n > 0 {
            self.statsd
                .client
                .count_with_tags(BATCH_FALLBACK, n)
                .with_tag("backend", backend)
                .send();
        }
        if let Some(p) = &self.prometheus {
            p.batch_fallback(backend, n);
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

    /// Hands what StatsD has buffered to its sender, without waiting on DNS
    /// or the network (the Prometheus series need no flush: a scrape reads
    /// them as they are).
    pub fn flush(&self) {
        self.statsd.flush();
    }

    /// At shutdown, after the services stopped: lets StatsD's sender deliver
    /// what is left, blocking at most `statsd::FINISH_BOUND`. Returns whether
    /// everything was sent.
    pub fn finish(&self) -> bool {
        self.statsd.finish(FINISH_BOUND)
    }
}

/// How late the leases (or jobs) of one batch were, by tag set, gathered
/// while the batch's lines are written (in chunks, with other work between
/// them) and recorded once they all are (`Metrics::lease_overdue`,
/// `Metrics::job_lease_overdue`), so StatsD's sample spreads over the whole
/// batch. A pass that fails drops what it gathered: a batch that is not
/// committed records nothing, as it counts nothing.
#[derive(Debug)]
pub struct Lateness<K>(Vec<(K, i64)>);

impl<K> Default for Lateness<K> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl Lateness<ReapedBy> {
    pub fn add_leases(&mut self, leases: &[ExpiredLease]) {
        self.0
            .extend(leases.iter().map(|l| (l.reaped_by, l.overdue_millis)));
    }
}

impl Lateness<&'static str> {
    /// Jobs of an action `Metrics::job_lease_overdue` does not record are
    /// left out.
    pub fn add_jobs(&mut self, actions: &[JobAction]) {
        for a in actions {
            if let Some(action) = [ACTION_RESET, ACTION_DEAD_LETTER]
                .into_iter()
                .find(|&known| a.action == known)
            {
                self.0.push((action, a.overdue_millis));
            }
        }
    }
}

impl<K> Lateness<K> {
    /// How many leases (or jobs) were gathered since it was last recorded.
    pub fn count(&self) -> u64 {
        self.0.len() as u64
    }
}

impl<K: Copy + PartialEq> Lateness<K> {
    /// The lateness of one tag set, in the order added.
    fn of(&self, key: K) -> Vec<i64> {
        self.0
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|&(_, ms)| ms)
            .collect()
    }
}

/// The items of a batch StatsD gets: all of them when there are at most
/// `max`, else `max` spread evenly through the batch (so the sample spans
/// all of it, not its first items), with the rate the agent scales them by.
fn sampled<T>(items: &[T], max: usize) -> (Option<f64>, impl Iterator<Item = &T>) {
    let n = items.len();
    let take = n.min(max);
    let rate = (n > max).then(|| take as f64 / n as f64);
    (rate, (0..take).map(move |i| &items[i * n / take]))
}

/// `overdueMillis` as a timer value; a lease the database's clock saw as not
/// yet due (a clock step) counts as on time.
fn millis(overdue_millis: i64) -> u64 {
    overdue_millis.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::test_agent::Agent;

    /// `n` leases, lease `i` `i` ms late.
    fn leases(n: usize, reaped_by: ReapedBy) -> Vec<ExpiredLease> {
        crate::model::testing::leases(n, reaped_by, |i| i as i64)
    }

    /// Metrics sending to a StatsD agent on loopback, and that agent.
    fn metrics_to_agent() -> (Metrics, Agent) {
        let agent = Agent::bind();
        (Metrics::new(agent.target()), agent)
    }

    #[test]
    fn a_storm_of_200000_leases_is_sampled_to_the_bound_per_batch() {
        let storm = leases(200_000, ReapedBy::Sweep);
        let mut lines = 0;
        for batch in storm.chunks(5_000) {
            let (rate, sample) = sampled(batch, MAX_OVERDUE_SAMPLES);
            let sample: Vec<_> = sample.collect();
            assert_eq!(rate, Some(0.02));
            assert_eq!(sample.len(), MAX_OVERDUE_SAMPLES);
            // Spread through the batch, its first lease included.
            assert_eq!(sample[0].token, batch[0].token);
            assert_eq!(sample[99].token, batch[4_950].token);
            lines += sample.len();
        }
        assert_eq!(lines, 4_000);

        let (rate, sample) = sampled(&storm[..MAX_OVERDUE_SAMPLES], MAX_OVERDUE_SAMPLES);
        assert_eq!((rate, sample.count()), (None, MAX_OVERDUE_SAMPLES));
        let (rate, sample) = sampled(&storm[..0], MAX_OVERDUE_SAMPLES);
        assert_eq!((rate, sample.count()), (None, 0));
    }

    #[test]
    fn a_full_batch_sends_sampled_timers_with_their_rate_and_its_exact_count() {
        let (metrics, agent) = metrics_to_agent();
        let mut lateness = Lateness::default();
        // Added in chunks, as a batch's lines are written; sampled whole.
        for chunk in leases(5_000, ReapedBy::Sweep).chunks(500) {
            lateness.add_leases(chunk);
        }
        metrics.lease_overdue("pg", &mut lateness);
        metrics.lease_expired("pg", 5_000);
        lateness.add_leases(&leases(2, ReapedBy::Takeover));
        metrics.lease_overdue("pg", &mut lateness);
        metrics.lease_expired("pg", 2);
        assert!(metrics.finish(), "delivered to loopback");

        let lines = agent.receive(MAX_OVERDUE_SAMPLES + 4);
        let expected: Vec<String> = (0..MAX_OVERDUE_SAMPLES)
            .map(|i| {
                format!(
                    "lock.lease.overdue:{}|ms|@0.02|#backend:pg,reaped_by:sweep",
                    i * 50
                )
            })
            .chain([
                "lock.lease.expired:5000|c|#backend:pg".to_owned(),
                "lock.lease.overdue:0|ms|#backend:pg,reaped_by:takeover".to_owned(),
                "lock.lease.overdue:1|ms|#backend:pg,reaped_by:takeover".to_owned(),
                "lock.lease.expired:2|c|#backend:pg".to_owned(),
            ])
            .collect();
        assert_eq!(lines, expected);
    }

    #[test]
    fn a_full_job_batch_sends_sampled_timers_tagged_by_action() {
        let (metrics, agent) = metrics_to_agent();
        let actions: Vec<JobAction> = (0..10_000)
            .map(|i| JobAction {
                action: if i % 2 == 0 {
                    ACTION_RESET
                } else {
                    ACTION_DEAD_LETTER
                }
                .into(),
                job_id: format!("j{i}"),
                attempts: 1,
                job_kind: "mail".into(),
                lease_owner: None,
                max_attempts: 5,
                overdue_millis: i,
                backoff_sec: None,
                dead_letter: None,
            })
            .collect();
        let mut lateness = Lateness::default();
        lateness.add_jobs(&actions);
        metrics.job_lease_overdue("pg", &mut lateness);
        assert!(metrics.finish(), "delivered to loopback");

        let lines = agent.receive(2 * MAX_OVERDUE_SAMPLES);
        // Each action sampled on its own: 100 of its 5,000 (every 50th of
        // them), though the actions alternate.
        let expected: Vec<String> = [(ACTION_RESET, 0), (ACTION_DEAD_LETTER, 1)]
            .into_iter()
            .flat_map(|(action, first)| {
                (0..MAX_OVERDUE_SAMPLES).map(move |i| {
                    format!(
                        "queue.lease.overdue:{}|ms|@0.02|#backend:pg,action:{action}",
                        first + i * 100
                    )
                })
            })
            .collect();
        assert_eq!(lines, expected);
    }
}
