//! systemd's notify protocol for `run`: `READY=1` after the first lock sweep,
//! `WATCHDOG=1` each time every service loop has moved, `STOPPING=1` when
//! shutdown starts.
//!
//! Owns only what is said to the service manager and when; the datagrams are
//! sent by the `sd-notify` crate to the socket named in `NOTIFY_SOCKET`. Without
//! that variable (a shell, a container, a test) every call is a no-op. It does
//! not decide when the daemon stops (`shutdown` does) nor how often it sweeps
//! (`sweep::run` does).
//!
//! Why from the loops' progress and not a timer: the watchdog must notice a
//! wedged loop, of either service, so a ping is sent only when every loop has
//! finished a pass since the last ping (`progress::Watcher::all_moved`). A
//! database that is down is not a wedged loop: a pass fails fast, is logged,
//! and still counts, so systemd never restarts the daemon for something a
//! restart cannot fix. "Ready" means "one lock sweep has run".
//!
//! A failure to notify is logged once and never stops the daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::progress::Watcher;

/// The environment variable systemd sets for `Type=notify` services.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Shown by `systemctl status` while the daemon runs.
const STATUS_RUNNING: &str = "sweeping expired leases";
/// Shown by `systemctl status` while the daemon drains.
const STATUS_STOPPING: &str = "finishing the batch in flight, flushing StatsD";

/// Talks to systemd on behalf of `run`. Cheap to clone; all clones share state.
#[derive(Clone, Default)]
pub struct Notifier {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    ready: AtomicBool,
    stopping: AtomicBool,
    /// Set after the first failed send, so a broken socket is reported once.
    failed: AtomicBool,
}

impl Notifier {
    /// A notifier for this process; logs whether systemd is listening.
    pub fn from_env() -> Self {
        if std::env::var_os(NOTIFY_SOCKET).is_some() {
            info!(
                watchdogMillis = watchdog().map_or(0, |d| d.as_millis() as u64),
                "systemd_notify_enabled"
            );
        }
        Self::default()
    }

    /// Follows the loops' progress until `shutdown`: `READY=1` once loop
    /// `ready_slot` has finished a pass, `WATCHDOG=1` each time every loop
    /// has, and `STOPPING=1` as soon as `shutdown` fires (so systemd shows
    /// the drain while it happens). Needs a Tokio runtime.
    pub fn follow(&self, mut progress: Watcher, ready_slot: usize, shutdown: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            while progress.next(&shutdown).await {
                let ready = this.state.ready.load(Ordering::SeqCst);
                match after_beat(ready, &mut progress, ready_slot) {
                    Some(Say::Ready) => this.ready(),
                    Some(Say::Watchdog) => this.send(&[NotifyState::Watchdog]),
                    None => {}
                }
            }
            this.stopping();
        });
    }

    /// The first lock sweep ran.
    fn ready(&self) {
        if self.state.stopping.load(Ordering::SeqCst) {
            // After STOPPING=1 a READY=1 would confuse systemd's state machine.
            return;
        }
        self.state.ready.store(true, Ordering::SeqCst);
        self.send(&[
            NotifyState::Ready,
            NotifyState::Status(STATUS_RUNNING),
            NotifyState::Watchdog,
        ]);
    }

    /// Shutdown started; sent once however often it is called.
    pub fn stopping(&self) {
        if !self.state.stopping.swap(true, Ordering::SeqCst) {
            self.send(&[NotifyState::Stopping, NotifyState::Status(STATUS_STOPPING)]);
        }
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(states)
            && !self.state.failed.swap(true, Ordering::SeqCst)
        {
            warn!(
                socket = std::env::var(NOTIFY_SOCKET).unwrap_or_default(),
                error = %e,
                "systemd_notify_failed"
            );
        }
    }
}

/// What a beat of some loop gives systemd to hear.
#[derive(Debug, PartialEq, Eq)]
enum Say {
    /// `READY=1`, which carries `WATCHDOG=1` too.
    Ready,
    Watchdog,
}

/// The rule of `follow`: READY once loop `ready_slot` has finished a pass,
/// then a ping each time every loop has moved since the last message. The
/// READY message is a ping too, so it restarts the count: the next ping
/// waits for every loop to move after it rather than counting the first
/// lock pass twice.
fn after_beat(ready: bool, progress: &mut Watcher, ready_slot: usize) -> Option<Say> {
    if !ready {
        if progress.passes(ready_slot) == 0 {
            return None;
        }
        progress.restart();
        return Some(Say::Ready);
    }
    progress.all_moved().then_some(Say::Watchdog)
}

/// The watchdog interval systemd asked for (`WATCHDOG_USEC`), if any.
pub fn watchdog() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;

    #[test]
    fn after_ready_the_first_ping_waits_for_every_loop_to_move_again() {
        let progress = Progress::new(2);
        let (locks, jobs) = (progress.beat(0), progress.beat(1));
        let mut watcher = progress.watch();

        jobs.beat();
        assert_eq!(
            after_beat(false, &mut watcher, 0),
            None,
            "no lock sweep yet"
        );
        locks.beat();
        assert_eq!(after_beat(false, &mut watcher, 0), Some(Say::Ready));
        // Both loops have one pass, but the lock loop's was already pinged
        // with READY: a second ping now would claim a pass that did not run.
        jobs.beat();
        assert_eq!(after_beat(true, &mut watcher, 0), None);
        locks.beat();
        assert_eq!(after_beat(true, &mut watcher, 0), Some(Say::Watchdog));
        assert_eq!(
            after_beat(true, &mut watcher, 0),
            None,
            "nothing moved since"
        );
    }
}
