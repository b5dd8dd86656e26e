use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::model::DeadLetter;
use crate::store::{PassStart, Reporter, Work};
use crate::sweep::report::testing::{discarded_metrics, written};
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

    async fn recover(&mut self, report: &mut dyn Reporter<JobAction>) -> Result<usize, StoreError> {
        self.called("recover");
        let Some((reset, dead)) = self.abandoned.lock().unwrap().pop_front() else {
            return Ok(0);
        };
        written(report, &actions(reset, dead), Work::JobQueue)?;
        Ok(reset + dead)
    }

    async fn apply_batch(
        &mut self,
        actor: &str,
        limit: usize,
        report: &mut dyn Reporter<JobAction>,
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
        written(report, &actions(reset, dead), Work::JobQueue)?;
        Ok(ApplyBatch::Applied { n: reset + dead })
    }

    async fn stale_count(&mut self) -> Result<u64, StoreError> {
        self.called("stale");
        Ok(STALE_AFTER_APPLY)
    }
}

fn reaper(stub: &Stub) -> (JobReaper<Stub>, crate::output::events::MemoryLog) {
    let (log, lines) = EventLog::in_memory();
    let reaper = JobReaper::new(stub.clone(), log, discarded_metrics(), "tester".into());
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
    let metrics = discarded_metrics();
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
    let metrics = discarded_metrics();
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
