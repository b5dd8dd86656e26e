//! The job reaper: a pass reports abandoned hand-offs, then returns stale
//! job leases to the queue (or the dead-letter table) batch by batch while
//! the gates allow, and sets the stale-lease gauge. Owns logging a change of
//! the gates' answer once, the `job_lease_expired` lines and the counts sent
//! with each batch. Not the reaping rules (SQL, behind a `JobQueue`), timing
//! or error logging (`sweep::run`), nor the CLI (`cmd::jobs`).

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::model::{ACTION_DEAD_LETTER, ACTION_RESET, JobAction};
use crate::output::events::EventLog;
use crate::output::metrics::{Lateness, Metrics};
use crate::store::{ApplyBatch, Gates, JobQueue, Reporter, StoreError};
use crate::sweep::{Drain, FailedPasses, Outcome, SWEEP_DELAY, Service};

/// Most stale jobs one apply transaction handles: the row locks it holds
/// (a worker's heartbeat or completion of one of them waits for that
/// transaction, which commits before the lines are written) and the report
/// it carries. The pass loops until a short batch, so a backlog still
/// drains in one pass; large enough that 100,000 stale jobs are reaped
/// within 10 s beside the workers (docs/performance.md has the figures).
pub const JOB_BATCH_SIZE: usize = 1_000;

/// The event name of the per-action WARN line.
pub const JOB_LEASE_EXPIRED: &str = "job_lease_expired";

/// What one reaper pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReapOutcome {
    pub reset: u64,
    pub dead_lettered: u64,
    /// Stale leases left after the pass (the gauge's value).
    pub stale: u64,
    /// Why apply was refused, when it was.
    pub refused: Option<String>,
    /// The pass stopped early because shutdown was requested.
    pub interrupted: bool,
}

impl Outcome for ReapOutcome {
    fn log_done(&self) {
        tracing::debug!(
            reset = self.reset,
            deadLettered = self.dead_lettered,
            stale = self.stale,
            refused = self.refused.as_deref(),
            interrupted = self.interrupted,
            "job_reap_done"
        );
    }
}

/// The gates' answer as last logged, so a change is logged once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GateState {
    /// Nothing read yet (start, or only failures so far).
    Unknown,
    Refused(String),
    Armed,
}

/// The job-lease service.
pub struct JobReaper<Q: JobQueue> {
    queue: Q,
    events: EventLog,
    metrics: Metrics,
    actor: String,
    gate: GateState,
}

impl<Q: JobQueue> JobReaper<Q> {
    /// `actor` is recorded on every dead letter and in apply's report; the
    /// daemon uses `lease-sweeper@<hostname>`.
    pub fn new(queue: Q, events: EventLog, metrics: Metrics, actor: String) -> Self {
        // Both actions' counters exist from the first scrape, at zero.
        for action in [ACTION_RESET, ACTION_DEAD_LETTER] {
            metrics.job_lease_reaped(queue.backend_id(), action, 0);
        }
        Self {
            queue,
            events,
            metrics,
            actor,
            gate: GateState::Unknown,
        }
    }

    /// One pass: if the gates allow, reap batch by batch until a short batch
    /// (or until `cancel` fires, checked between batches); then report the
    /// stale-lease gauge. An error leaves the batch in flight recorded (its
    /// jobs are reaped, and their lines written, by a later pass). A batch a
    /// reaper handed off but did not report (it died, or its output failed)
    /// is reported first, whatever the gates say now: its jobs were reaped
    /// while they allowed it.
    pub async fn reap_once(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<ReapOutcome, StoreError> {
        let mut outcome = ReapOutcome::default();
        // One statement when the gates refuse: their reason and the gauge.
        let start = self.queue.gates().await?;
        if start.abandoned {
            self.recover(&mut outcome).await?;
        }
        let (mut refusal, stale) = match start.gates {
            Gates::Allow => (None, None),
            Gates::Refuse { reason, stale } => (Some(reason), Some(stale)),
        };
        let backend = self.queue.backend_id();
        let mut drain = Drain::new(JOB_BATCH_SIZE);
        while refusal.is_none() && drain.go_on(cancel) {
            self.note_gate(None);
            let mut report =
                ActionReporter::new(&mut self.events, &self.metrics, backend, &mut outcome);
            match self
                .queue
                .apply_batch(&self.actor, JOB_BATCH_SIZE, &mut report)
                .await?
            {
                ApplyBatch::Refused(reason) => {
                    // Closed since they were read: the gauge is read below.
                    refusal = Some(reason);
                    drain.stop();
                }
                ApplyBatch::Applied { n } => drain.took(n),
            }
        }
        if drain.interrupted {
            outcome.interrupted = true;
            return Ok(outcome);
        }
        if let Some(reason) = &refusal {
            self.note_gate(Some(reason));
        }
        outcome.refused = refusal;
        outcome.stale = match stale {
            Some(stale) => stale,
            None => self.queue.stale_count().await?,
        };
        self.metrics.stale_jobs_current(backend, outcome.stale);
        Ok(outcome)
    }

    /// Reports every abandoned hand-off, one transaction each.
    async fn recover(&mut self, outcome: &mut ReapOutcome) -> Result<(), StoreError> {
        let backend = self.queue.backend_id();
        loop {
            let mut report = ActionReporter::new(&mut self.events, &self.metrics, backend, outcome);
            if self.queue.recover(&mut report).await? == 0 {
                return Ok(());
            }
        }
    }

    /// Logs the gates' answer when it differs from the last one logged.
    fn note_gate(&mut self, refusal: Option<&str>) {
        let state = match refusal {
            Some(reason) => GateState::Refused(reason.to_owned()),
            None => GateState::Armed,
        };
        if self.gate == state {
            return;
        }
        match &state {
            GateState::Refused(reason) => {
                info!(reason = %reason, actor = %self.actor, "job_reaper_gated");
            }
            GateState::Armed => {
                info!(actor = %self.actor, batchSize = JOB_BATCH_SIZE, "job_reaper_armed");
            }
            GateState::Unknown => {}
        }
        self.gate = state;
    }
}

/// Where a batch's actions go, applied or recovered alike: it writes their
/// `job_lease_expired` lines and gathers their lateness and counts, which it
/// sends, and adds to the pass's outcome, as the batch commits. What it
/// gathered for a batch that never commits is dropped with it.
struct ActionReporter<'a> {
    events: &'a mut EventLog,
    metrics: &'a Metrics,
    backend: &'static str,
    outcome: &'a mut ReapOutcome,
    lateness: Lateness<&'static str>,
    reset: u64,
    dead_lettered: u64,
}

impl<'a> ActionReporter<'a> {
    fn new(
        events: &'a mut EventLog,
        metrics: &'a Metrics,
        backend: &'static str,
        outcome: &'a mut ReapOutcome,
    ) -> Self {
        Self {
            events,
            metrics,
            backend,
            outcome,
            lateness: Lateness::default(),
            reset: 0,
            dead_lettered: 0,
        }
    }
}

impl Reporter<JobAction> for ActionReporter<'_> {
    fn lines(&mut self, actions: &[JobAction]) -> std::io::Result<()> {
        self.events.warn_lines(
            JOB_LEASE_EXPIRED,
            actions.iter().map(|a| line_fields(a, self.backend)),
        )?;
        self.lateness.add_jobs(actions);
        for a in actions {
            if a.action == ACTION_DEAD_LETTER {
                self.dead_lettered += 1;
            } else {
                self.reset += 1;
            }
        }
        Ok(())
    }

    fn committed(&mut self) {
        let (reset, dead) = (
            std::mem::take(&mut self.reset),
            std::mem::take(&mut self.dead_lettered),
        );
        if reset + dead == 0 {
            return;
        }
        self.metrics
            .job_lease_overdue(self.backend, &mut self.lateness);
        self.metrics
            .job_lease_reaped(self.backend, ACTION_RESET, reset);
        self.metrics
            .job_lease_reaped(self.backend, ACTION_DEAD_LETTER, dead);
        self.metrics.flush();
        self.outcome.reset += reset;
        self.outcome.dead_lettered += dead;
    }
}

impl<Q: JobQueue> Service for JobReaper<Q> {
    type Outcome = ReapOutcome;
    const SERVICE: &'static str = "job_reaper";
    const NAME: &'static str = "job_reaper";
    const WORK: &'static str = "job_reap";
    const FAILED_PASSES: FailedPasses = FailedPasses::Reaps;

    fn log_started(&self) {
        info!(
            actor = %self.actor,
            delayMillis = SWEEP_DELAY.as_millis() as u64,
            batchSize = JOB_BATCH_SIZE,
            "job_reaper_started"
        );
    }

    async fn pass(&mut self, cancel: &CancellationToken) -> Result<ReapOutcome, StoreError> {
        self.reap_once(cancel).await
    }
}

/// The fields of one `job_lease_expired` line, in a fixed order. `jobId` +
/// `attempts` is the dedupe key: after a crash between writing and
/// committing, the same pair can be reported again by the next pass, while
/// one job expiring on two attempts is two events.
fn line_fields(a: &JobAction, backend: &str) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("jobId", a.job_id.clone()),
        ("jobKind", a.job_kind.clone()),
        ("leaseOwner", a.lease_owner.clone().unwrap_or_default()),
        ("attempts", a.attempts.to_string()),
        ("maxAttempts", a.max_attempts.to_string()),
        ("overdueMillis", a.overdue_millis.to_string()),
        ("action", a.action.clone()),
    ];
    if let Some(backoff) = a.backoff_sec {
        pairs.push(("backoffSec", backoff.to_string()));
    }
    if let Some(dead) = &a.dead_letter {
        pairs.push(("deadLetterId", dead.dead_letter_id.clone()));
    }
    pairs.push(("backend", backend.to_owned()));
    pairs
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::config::StatsdTarget;
    use crate::model::DeadLetter;
    use crate::store::{PassStart, Report, Work};
    use crate::sweep::test_log;

    /// What the stub's next `apply_batch` call does.
    enum Apply {
        /// Reaps this many: resets, then dead letters.
        Reap(usize, usize),
        /// Reaps this many resets, then fires the token (a signal mid-drain).
        ReapThenCancel(usize, CancellationToken),
        /// The gates closed since they were read.
        Refuse(&'static str),
        /// Takes this long (the database's time), then reaps this many resets.
        ReapTaking(usize, Duration),
    }

    #[derive(Clone, Default)]
    struct Stub {
        /// What `gates` answers, one per pass (then: allow, none abandoned).
        starts: Arc<Mutex<VecDeque<PassStart>>>,
        /// What each `apply_batch` does, in order (then: an empty batch).
        applies: Arc<Mutex<VecDeque<Apply>>>,
        /// The abandoned hand-offs `recover` finds, each as (resets, dead letters).
        abandoned: Arc<Mutex<VecDeque<(usize, usize)>>>,
        /// Every call, in order: `gates`, `recover`, `apply`, `stale`.
        calls: Arc<Mutex<Vec<&'static str>>>,
        /// How many `gates` calls fail before they answer (a database down).
        down_for: Arc<Mutex<u32>>,
    }

    /// The stale-lease count the stub's `stale_count` answers.
    const STALE_AFTER_APPLY: u64 = 4;

    impl Stub {
        fn called(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }
        fn calls(&self) -> Vec<&'static str> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
        fn starts(&self, starts: impl IntoIterator<Item = PassStart>) {
            self.starts.lock().unwrap().extend(starts);
        }
        fn applies(&self, applies: impl IntoIterator<Item = Apply>) {
            self.applies.lock().unwrap().extend(applies);
        }
    }

    fn refuse(reason: &str, stale: u64) -> PassStart {
        PassStart {
            gates: Gates::Refuse {
                reason: reason.into(),
                stale,
            },
            abandoned: false,
        }
    }

    const ALLOW: PassStart = PassStart {
        gates: Gates::Allow,
        abandoned: false,
    };

    fn actions(reset: usize, dead: usize) -> Vec<JobAction> {
        (0..reset + dead)
            .map(|i| JobAction {
                action: if i < reset {
                    ACTION_RESET
                } else {
                    ACTION_DEAD_LETTER
                }
                .into(),
                job_id: format!("j{i}"),
                attempts: 1,
                job_kind: "k".into(),
                lease_owner: Some("w".into()),
                max_attempts: 3,
                overdue_millis: 5,
                backoff_sec: (i < reset).then_some(2),
                dead_letter: (i >= reset).then(|| DeadLetter {
                    dead_letter_id: format!("d{i}"),
                }),
            })
            .collect()
    }

    fn written(report: Report<'_, JobAction>, batch: &[JobAction]) -> Result<(), StoreError> {
        report.lines(batch).map_err(|source| StoreError::Report {
            work: Work::JobQueue,
            source,
        })?;
        report.committed();
        Ok(())
    }

    impl JobQueue for Stub {
        fn backend_id(&self) -> &'static str {
            "stub"
        }

        async fn gates(&mut self) -> Result<PassStart, StoreError> {
            self.called("gates");
            let mut down_for = self.down_for.lock().unwrap();
            if *down_for > 0 {
                *down_for -= 1;
                return Err(StoreError::Query {
                    work: Work::JobQueue,
                    query: "gates",
                    cause: "down".into(),
                    source: None,
                });
            }
            Ok(self.starts.lock().unwrap().pop_front().unwrap_or(ALLOW))
        }

        async fn recover(&mut self, report: Report<'_, JobAction>) -> Result<usize, StoreError> {
            self.called("recover");
            let Some((reset, dead)) = self.abandoned.lock().unwrap().pop_front() else {
                return Ok(0);
            };
            written(report, &actions(reset, dead))?;
            Ok(reset + dead)
        }

        async fn apply_batch(
            &mut self,
            actor: &str,
            limit: usize,
            report: Report<'_, JobAction>,
        ) -> Result<ApplyBatch, StoreError> {
            self.called("apply");
            assert_eq!((actor, limit), ("tester", JOB_BATCH_SIZE));
            let next = self.applies.lock().unwrap().pop_front();
            let (reset, dead) = match next.unwrap_or(Apply::Reap(0, 0)) {
                Apply::Reap(reset, dead) => (reset, dead),
                Apply::ReapThenCancel(reset, token) => {
                    token.cancel();
                    (reset, 0)
                }
                Apply::Refuse(reason) => return Ok(ApplyBatch::Refused(reason.into())),
                Apply::ReapTaking(reset, took) => {
                    tokio::time::sleep(took).await;
                    (reset, 0)
                }
            };
            written(report, &actions(reset, dead))?;
            Ok(ApplyBatch::Applied { n: reset + dead })
        }

        async fn stale_count(&mut self) -> Result<u64, StoreError> {
            self.called("stale");
            Ok(STALE_AFTER_APPLY)
        }
    }

    fn reaper(stub: &Stub) -> (JobReaper<Stub>, crate::output::events::MemoryLog) {
        let (log, lines) = EventLog::in_memory();
        // Port 9 (discard) on loopback: metrics are not what these tests check.
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        let reaper = JobReaper::new(stub.clone(), log, metrics, "tester".into());
        (reaper, lines)
    }

    fn reasons(log: &test_log::Captured) -> Vec<String> {
        log.events("job_reaper_gated")
            .into_iter()
            .map(|fields| fields["reason"].clone())
            .collect()
    }

    #[tokio::test]
    async fn closed_gates_apply_nothing_and_each_change_is_logged_once() {
        let log = test_log::capture();
        let stub = Stub::default();
        stub.starts([
            refuse("a=false", 7),
            refuse("a=false", 7),
            refuse("b=true", 7),
            ALLOW,
            ALLOW,
            refuse("a=false", 7),
        ]);
        let (mut reaper, lines) = reaper(&stub);
        let cancel = CancellationToken::new();

        let gated = reaper.reap_once(&cancel).await.unwrap();
        assert_eq!(
            gated,
            ReapOutcome {
                stale: 7,
                refused: Some("a=false".into()),
                ..ReapOutcome::default()
            },
            "the gauge comes with the refusal"
        );
        assert_eq!(stub.calls(), ["gates"], "one call, no apply");
        for _ in 0..5 {
            reaper.reap_once(&cancel).await.unwrap();
        }

        assert_eq!(
            stub.calls(),
            [
                "gates", "gates", "gates", "apply", "stale", "gates", "apply", "stale", "gates"
            ]
        );
        assert_eq!(reasons(&log), ["a=false", "b=true", "a=false"]);
        assert_eq!(log.events("job_reaper_armed").len(), 1);
        assert!(lines.lines().is_empty());
    }

    #[tokio::test]
    async fn gates_closing_mid_pass_stop_the_batches_and_the_gauge_is_read() {
        let log = test_log::capture();
        let stub = Stub::default();
        stub.applies([Apply::Reap(JOB_BATCH_SIZE, 0), Apply::Refuse("c=false")]);
        let (mut reaper, lines) = reaper(&stub);

        let outcome = reaper.reap_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            outcome,
            ReapOutcome {
                reset: JOB_BATCH_SIZE as u64,
                stale: STALE_AFTER_APPLY,
                refused: Some("c=false".into()),
                ..ReapOutcome::default()
            }
        );
        assert_eq!(stub.calls(), ["gates", "apply", "apply", "stale"]);
        assert_eq!(lines.lines().len(), JOB_BATCH_SIZE);
        assert_eq!(log.events("job_reaper_armed").len(), 1);
        assert_eq!(reasons(&log), ["c=false"]);
    }

    #[tokio::test]
    async fn full_batches_are_followed_by_more_until_a_short_one() {
        let stub = Stub::default();
        stub.applies([
            Apply::Reap(JOB_BATCH_SIZE - 1, 1),
            Apply::Reap(JOB_BATCH_SIZE, 0),
            Apply::Reap(2, 1),
            Apply::Reap(50, 0),
        ]);
        let (mut reaper, lines) = reaper(&stub);

        let outcome = reaper.reap_once(&CancellationToken::new()).await.unwrap();

        assert_eq!(
            (outcome.reset, outcome.dead_lettered, outcome.stale),
            (2 * JOB_BATCH_SIZE as u64 + 1, 2, STALE_AFTER_APPLY)
        );
        assert_eq!(stub.calls(), ["gates", "apply", "apply", "apply", "stale"]);
        let lines = lines.lines();
        assert_eq!(lines.len(), 2 * JOB_BATCH_SIZE + 3);
        assert!(
            lines[0].contains(" message=job_lease_expired jobId=j0 ")
                && lines[0].ends_with(" action=reset_to_retry_waiting backoffSec=2 backend=stub"),
            "{}",
            lines[0]
        );
    }

    #[tokio::test]
    async fn a_shutdown_mid_drain_stops_between_batches() {
        let token = CancellationToken::new();
        let stub = Stub::default();
        stub.applies([
            Apply::ReapThenCancel(JOB_BATCH_SIZE, token.clone()),
            Apply::Reap(JOB_BATCH_SIZE, 0),
        ]);
        let (mut reaper, lines) = reaper(&stub);

        let outcome = reaper.reap_once(&token).await.unwrap();

        assert!(outcome.interrupted);
        assert_eq!(outcome.reset, JOB_BATCH_SIZE as u64);
        assert_eq!(
            stub.calls(),
            ["gates", "apply"],
            "no second batch, no gauge"
        );
        assert_eq!(lines.lines().len(), JOB_BATCH_SIZE);
    }

    #[tokio::test]
    async fn abandoned_hand_offs_are_reported_first_even_while_the_gates_refuse() {
        let stub = Stub::default();
        stub.starts([PassStart {
            abandoned: true,
            ..refuse("a=false", 0)
        }]);
        stub.abandoned.lock().unwrap().extend([(2, 1), (1, 0)]);
        let (mut reaper, lines) = reaper(&stub);

        let outcome = reaper.reap_once(&CancellationToken::new()).await.unwrap();

        assert_eq!((outcome.reset, outcome.dead_lettered), (3, 1));
        assert_eq!(outcome.refused.as_deref(), Some("a=false"));
        assert_eq!(stub.calls(), ["gates", "recover", "recover", "recover"]);
        let lines = lines.lines();
        assert_eq!(lines.len(), 4);
        assert!(lines[2].contains(" action=moved_to_dead_letter deadLetterId=d2 "));
    }

    #[tokio::test]
    async fn an_unwritable_log_fails_the_batch_instead_of_losing_lines() {
        struct Broken;
        impl std::io::Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let stub = Stub::default();
        stub.applies([Apply::Reap(3, 0)]);
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        let events = EventLog::to_writer(Box::new(Broken));
        let mut reaper = JobReaper::new(stub.clone(), events, metrics, "tester".into());

        let err = reaper
            .reap_once(&CancellationToken::new())
            .await
            .unwrap_err();

        assert!(matches!(err, StoreError::Report { .. }), "{err}");
        assert_eq!(stub.calls(), ["gates", "apply"]);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_passes_are_counted_as_reaps_by_the_loop() {
        let log = test_log::capture();
        let stub = Stub::default();
        *stub.down_for.lock().unwrap() = 2;
        let (reaper, _lines) = reaper(&stub);
        let token = CancellationToken::new();
        let metrics = Metrics::new(StatsdTarget {
            host: "127.0.0.1".into(),
            port: 9,
        });
        let beat = crate::progress::Progress::new(1).beat(0);
        let task = tokio::spawn(crate::sweep::run(reaper, metrics, beat, token.clone()));

        // Paused time: each pass's delay passes at once, the order stays.
        let waited = tokio::time::timeout(Duration::from_secs(60), async {
            while log.events("job_reap_recovered").is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        token.cancel();
        task.await.unwrap();
        assert!(waited.is_ok(), "never recovered");

        let failed = log.events("job_reap_failed");
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0]["failedReaps"], "1");
        assert_eq!(log.events("job_reap_recovered")[0]["failedReaps"], "2");
    }

    /// Three batches of `took` each, the last short.
    fn backlog(stub: &Stub, took: Duration) {
        stub.applies([
            Apply::ReapTaking(JOB_BATCH_SIZE, took),
            Apply::ReapTaking(JOB_BATCH_SIZE, took),
            Apply::ReapTaking(7, took),
        ]);
    }

    /// Workers at work or not, a backlog goes at the speed of its batches:
    /// the reaper never waits because other sessions exist.
    #[tokio::test(start_paused = true)]
    async fn a_backlog_drains_without_pausing() {
        let stub = Stub::default();
        let took = Duration::from_millis(40);
        backlog(&stub, took);
        let (mut reaper, _lines) = reaper(&stub);
        let started = tokio::time::Instant::now();
        let outcome = reaper.reap_once(&CancellationToken::new()).await.unwrap();
        assert_eq!(outcome.reset, 2 * JOB_BATCH_SIZE as u64 + 7);
        assert_eq!(started.elapsed(), 3 * took);
    }
}
