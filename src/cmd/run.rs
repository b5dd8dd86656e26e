//! `lease-sweeper run`: the daemon.
//!
//! Owns wiring the three services to their backends (the lock sweeper on a
//! connection of its own, to PostgreSQL or etcd; the job reaper and the
//! horizon check taking turns on one PostgreSQL connection, the horizon
//! check outside the watchdog's loops), the signal lines, StatsD, the
//! scrape endpoint when it is asked for (with its web configuration file,
//! read once here so a bad one stops the start), systemd and the shutdown
//! signal, then waiting for every loop to stop. It owns no timing
//! (`sweep::run`) and no SQL (`pg`).

use anyhow::Context as _;
use tracing::info;

use crate::config::{DbTarget, EtcdTarget, StatsdTarget};
use crate::etcd::store::EtcdLockStore;
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

/// The progress slot of each watched loop (the horizon check has none); the
/// lock sweeper's first pass is "ready".
const LOCK_LOOP: usize = 0;
const JOB_LOOP: usize = 1;

/// The daemon: every service until SIGTERM/SIGINT. The locks are in etcd
/// when `ETCDCTL_ENDPOINTS` is set, else in PostgreSQL; the job reaper and
/// the horizon check run when there is a PostgreSQL database (with etcd:
/// when the environment names one).
pub async fn run() -> anyhow::Result<()> {
    let etcd = EtcdTarget::from_env()?;
    let db = match &etcd {
        Some(_) if !crate::config::pg_named_in_env() => None,
        _ => Some(DbTarget::from_env()?),
    };
    let statsd = StatsdTarget::from_env()?;
    let metrics_addr = crate::config::metrics_addr_from_env()?;
    let web_config = crate::config::web_config_file_from_env(metrics_addr)?;
    // Read before anything starts: a bad file stops the daemon here, and the
    // endpoint never serves without the TLS or auth the file asks for.
    let web = match web_config {
        None => None,
        Some(path) => {
            let active = crate::output::web_config::load(&path)?;
            Some((path, active))
        }
    };
    let shutdown =
        crate::shutdown::on_signals().context("installing the SIGTERM/SIGINT handlers")?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        locks = %etcd.as_ref().map_or_else(|| "postgresql".to_owned(), EtcdTarget::display),
        database = db.as_ref().map_or("none", DbTarget::display),
        databaseFrom = %db.as_ref().map_or_else(String::new, DbTarget::origin),
        statsd = %statsd,
        "starting"
    );
    for note in db.iter().flat_map(DbTarget::notes) {
        tracing::warn!(note = %note, "database_config_warning");
    }
    let metrics = match metrics_addr {
        None => Metrics::new(statsd),
        Some(addr) => {
            let exposition = Exposition::new();
            let watch = web.map(|(path, active)| {
                info!(file = %path.display(), summary = %active.summary(), "web_config_loaded");
                crate::output::scrape::warn_about(&path, &active);
                crate::output::web_config::Watch::new(path, active)
            });
            let tls = watch.as_ref().is_some_and(|w| w.is_tls());
            let bound =
                crate::output::scrape::start(addr, exposition.clone(), watch, shutdown.clone())?;
            info!(
                addr = %bound,
                path = crate::output::scrape::PATH,
                scheme = if tls { "https" } else { "http" },
                "metrics_listening"
            );
            Metrics::with_prometheus(statsd, exposition)
        }
    };
    let progress = Progress::new(if db.is_some() { 2 } else { 1 });
    // systemd: READY=1 after the first lock sweep, WATCHDOG=1 while every
    // watched loop moves, STOPPING=1 on the signal.
    let notifier = crate::notify::Notifier::from_env();
    notifier.follow(progress.watch(), LOCK_LOOP, shutdown.clone());
    // Containers: the same progress, as a file `lease-sweeper alive` reads.
    if let Some(path) = crate::heartbeat::path_from_env() {
        crate::heartbeat::follow(path, progress.watch(), shutdown.clone());
    }

    // The lock sweep's own connection (PostgreSQL) or client (etcd): the
    // same service, loop, lines and metrics over either store.
    let locks = async {
        let beat = progress.beat(LOCK_LOOP);
        match (&etcd, &db) {
            (Some(target), _) => {
                let store = EtcdLockStore::new(target.clone(), super::sidecar_name());
                let sweeper = LockSweeper::new(store, EventLog::stdout(), metrics.clone());
                crate::sweep::run(sweeper, metrics.clone(), beat, shutdown.clone()).await;
            }
            (None, Some(db)) => {
                let store = PgLockStore::new(db.clone());
                let sweeper = LockSweeper::new(store, EventLog::stdout(), metrics.clone());
                crate::sweep::run(sweeper, metrics.clone(), beat, shutdown.clone()).await;
            }
            (None, None) => unreachable!("without etcd the database is always resolved"),
        }
    };
    // One connection the job reaper and the horizon check take turns on.
    let queue = async {
        let Some(db) = &db else { return };
        let actor = format!("lease-sweeper@{}", super::hostname());
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
    };
    tokio::join!(locks, queue);
    notifier.stopping();
    // Each loop handed its last counts over as it stopped; the sender gets a
    // short bound to deliver them (a dead DNS server must not hold the exit;
    // what it could not send was already warned about as statsd_unavailable).
    let _delivered = tokio::task::spawn_blocking(move || metrics.finish()).await;
    Ok(())
}
