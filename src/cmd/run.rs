//! `lease-sweeper run`: the daemon.
//!
//! Owns wiring the services to their two connections (the lock sweep's
//! own; one the job reaper and the horizon check share, the latter outside
//! the watchdog's set of loops), the signal lines,
//! StatsD, the scrape endpoint when it is asked for, systemd and the
//! shutdown signal, then waiting for every loop to stop. It owns no timing (`sweep::run`) and no SQL (`pg`).

use anyhow::Context as _;
use tracing::info;

use crate::config::{DbTarget, StatsdTarget};
use crate::output::events::EventLog;
use crate::output::metrics::Metrics;
use crate::output::prometheus::Exposition;
use crate::pg::conn::SharedDb;
use crate::pg::horizon::PgHorizon;
use crate::pg::job_queue::PgJobQueue;
use crate::pg::lock_store::PgLockStore;
use crate::progress::Beat;
use crate::progress::Progress;
use crate::sweep::horizon_check::HorizonCheck;
use crate::sweep::job_reaper::JobReaper;
use crate::sweep::lock_sweeper::LockSweeper;

/// The progress slot of each loop; the lock sweeper's first pass is "ready".
const LOCK_LOOP: usize = 0;
const JOB_LOOP: usize = 1;
const LOOPS: usize = 2;

/// The daemon: both services until SIGTERM/SIGINT.
pub async fn run() -> anyhow::Result<()> {
    let db = DbTarget::from_env()?;
    let statsd = StatsdTarget::from_env()?;
    let metrics_addr = crate::config::metrics_addr_from_env()?;
    let shutdown =
        crate::shutdown::on_signals().context("installing the SIGTERM/SIGINT handlers")?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        database = db.display(),
        databaseFrom = %db.origin(),
        statsd = %statsd,
        "starting"
    );
    for note in db.notes() {
        tracing::warn!(note = %note, "database_config_warning");
    }
    let actor = format!("lease-sweeper@{}", super::hostname());
    let metrics = match metrics_addr {
        None => Metrics::new(statsd),
        Some(addr) => {
            let exposition = Exposition::new();
            let bound = crate::output::scrape::start(addr, exposition.clone(), shutdown.clone())?;
            info!(
                addr = %bound,
                path = crate::output::scrape::PATH,
                "metrics_listening"
            );
            Metrics::with_prometheus(statsd, exposition)
        }
    };
    let progress = Progress::new(LOOPS);
    // systemd: READY=1 after the first lock sweep, WATCHDOG=1 while every
    // loop moves, STOPPING=1 on the signal.
    let notifier = crate::notify::Notifier::from_env();
    notifier.follow(progress.watch(), LOCK_LOOP, shutdown.clone());
    // Containers: the same progress, as a file `lease-sweeper alive` reads.
    if let Some(path) = crate::heartbeat::path_from_env() {
        crate::heartbeat::follow(path, progress.watch(), shutdown.clone());
    }

    let locks = LockSweeper::new(
        PgLockStore::new(db.clone()),
        EventLog::stdout(),
        metrics.clone(),
    );
    // The daemon's two connections: the lock sweep's own, and one the job
    // reaper and the horizon check take turns on.
    let shared = SharedDb::new(db.clone());
    let horizon = HorizonCheck::new(
        PgHorizon::on(shared.clone()),
        EventLog::stdout(),
        metrics.clone(),
    );
    let jobs = JobReaper::new(
        PgJobQueue::on(shared),
        EventLog::stdout(),
        metrics.clone(),
        actor,
    );
    tokio::join!(
        crate::sweep::run(
            locks,
            metrics.clone(),
            progress.beat(LOCK_LOOP),
            shutdown.clone()
        ),
        crate::sweep::run(
            jobs,
            metrics.clone(),
            progress.beat(JOB_LOOP),
            shutdown.clone()
        ),
        // Not watched: a check every 10 s must not slow the watchdog's
        // pings, and a stuck one (bounded by its own timeouts) stops no sweep.
        crate::sweep::run(
            horizon,
            metrics.clone(),
            Beat::unwatched(),
            shutdown.clone()
        ),
    );
    notifier.stopping();
    // Each loop handed its last counts over as it stopped; the sender gets a
    // short bound to deliver them (a dead DNS server must not hold the exit;
    // what it could not send was already warned about as statsd_unavailable).
    let _delivered = tokio::task::spawn_blocking(move || metrics.finish()).await;
    Ok(())
}
