//! The one `Reporter` the reaping services hand their store: it writes a
//! batch's signal lines and, once the batch commits, sends its lateness and
//! counts and adds them to the pass's outcome. What differs between a lease
//! and a job action (its line, its lateness tag, what it counts as) is the
//! row's own `Reaped` impl, beside its service. Not when a batch runs
//! (`Drain`) nor how it is made durable (the store).

use std::io;

use crate::output::events::EventLog;
use crate::output::metrics::{Lateness, Metrics};
use crate::store::Reporter;

/// A row a reaping service reports: an expired lease, or a job action.
pub trait Reaped: Sized + Sync {
    /// The tag its lateness is recorded under (`reaped_by`, `action`).
    type Tag: Send;
    /// The pass's outcome, which holds what these rows count.
    type Outcome: Default + Send;

    /// Writes the rows' lines and flushes them; an error means "do not
    /// commit".
    fn write(events: &mut EventLog, backend: &'static str, rows: &[Self]) -> io::Result<()>;

    /// Adds the rows' lateness and counts to their batch's.
    fn gather(rows: &[Self], lateness: &mut Lateness<Self::Tag>, batch: &mut Self::Outcome);

    /// Sends a committed batch's lateness (emptying it) and counts.
    fn send(
        metrics: &Metrics,
        backend: &'static str,
        lateness: &mut Lateness<Self::Tag>,
        batch: &Self::Outcome,
    );

    /// Adds a committed batch's counts to the pass's.
    fn add(pass: &mut Self::Outcome, batch: &Self::Outcome);
}

/// The store's `Reporter` for one call of a pass: writes each batch's lines
/// and gathers what they count; as the batch commits, sends that, flushes
/// the metrics and adds it to the pass's outcome. As each batch commits, not
/// when the pass ends: a long drain must not hold committed counts, where a
/// crash would lose them. What it gathered for a batch that never commits
/// is dropped with it: an uncommitted batch counts nothing.
pub struct LineReporter<'a, R: Reaped> {
    events: &'a mut EventLog,
    metrics: &'a Metrics,
    backend: &'static str,
    pass: &'a mut R::Outcome,
    /// Lines written since the last commit: whether there is anything to
    /// send when it comes.
    written: usize,
    /// Their lateness, sampled for StatsD only once the whole batch is in.
    lateness: Lateness<R::Tag>,
    /// Their counts, added to `pass` at the commit.
    batch: R::Outcome,
}

impl<'a, R: Reaped> LineReporter<'a, R> {
    pub fn new(
        events: &'a mut EventLog,
        metrics: &'a Metrics,
        backend: &'static str,
        pass: &'a mut R::Outcome,
    ) -> Self {
        Self {
            events,
            metrics,
            backend,
            pass,
            written: 0,
            lateness: Lateness::default(),
            batch: R::Outcome::default(),
        }
    }
}

impl<R: Reaped> Reporter<R> for LineReporter<'_, R> {
    fn lines(&mut self, rows: &[R]) -> io::Result<()> {
        R::write(self.events, self.backend, rows)?;
        R::gather(rows, &mut self.lateness, &mut self.batch);
        self.written += rows.len();
        Ok(())
    }

    fn committed(&mut self) {
        if std::mem::take(&mut self.written) == 0 {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        R::send(self.metrics, self.backend, &mut self.lateness, &batch);
        self.metrics.flush();
        R::add(self.pass, &batch);
    }
}

/// What the services' unit tests share: a stub store's batch, and metrics
/// nobody reads.
#[cfg(test)]
pub mod testing {
    use crate::config::StatsdTarget;
    use crate::output::metrics::Metrics;
    use crate::store::{Reporter, StoreError, Work};

    /// A stub store's batch of `rows`, as a real store makes it: their lines
    /// through `report`, a failed write returned as the store returns it,
    /// then the commit.
    pub fn written<T>(
        report: &mut dyn Reporter<T>,
        rows: &[T],
        work: Work,
    ) -> Result<(), StoreError> {
        report
            .lines(rows)
            .map_err(|source| StoreError::Report { work, source })?;
        report.committed();
        Ok(())
    }

    /// Metrics sent to port 9 (discard) on loopback, for a test that does
    /// not check them.
    pub fn discarded_metrics() -> Metrics {
        Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ExpiredLease, ReapedBy};
    use crate::output::test_agent::Agent;
    use crate::sweep::lock_sweeper::SweepOutcome;

    /// `n` leases, each 5 ms late.
    fn leases(n: usize, reaped_by: ReapedBy) -> Vec<ExpiredLease> {
        crate::model::testing::leases(n, reaped_by, |_| 5)
    }

    #[test]
    fn a_batch_is_counted_and_sent_as_it_commits_and_an_uncommitted_one_not_at_all() {
        let agent = Agent::bind();
        let metrics = Metrics::new(agent.target());
        let (mut events, lines) = EventLog::in_memory();
        let mut pass = SweepOutcome::default();
        let mut report = LineReporter::new(&mut events, &metrics, "pg", &mut pass);

        report.lines(&leases(2, ReapedBy::Sweep)).unwrap();
        report.lines(&leases(1, ReapedBy::Takeover)).unwrap();
        report.committed();
        // Written, then the batch failed: never committed.
        report.lines(&leases(4, ReapedBy::Sweep)).unwrap();
        drop(report);
        // Whatever arrives before this line was sent by the reporter.
        metrics.events_missed("end", 1);
        assert!(metrics.finish(), "delivered to loopback");

        assert_eq!((pass.swept, pass.taken_over), (2, 1));
        assert_eq!(lines.lines().len(), 7, "every line is written at once");
        assert_eq!(
            agent.receive(5),
            [
                "lock.lease.overdue:5|ms|#backend:pg,reaped_by:sweep",
                "lock.lease.overdue:5|ms|#backend:pg,reaped_by:sweep",
                "lock.lease.overdue:5|ms|#backend:pg,reaped_by:takeover",
                "lock.lease.expired:3|c|#backend:pg",
                "lock.events.missed:1|c|#backend:end",
            ]
        );
    }
}
