//! Loop progress: how many passes each service loop has finished.
//!
//! Owns the shared counters and the rule "every loop has moved since you last
//! looked", which is what systemd's watchdog (`notify`) and the container
//! liveness heartbeat are fed from: a wedged loop, of either service, stops
//! them. A database that is down is not a wedged loop: a failed pass still
//! counts, so nothing restarts the daemon for what a restart cannot fix. It
//! does not decide what a pass is (`sweep`) nor whom to tell (`notify`).

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The counters of every registered loop. Cheap to clone.
#[derive(Clone)]
pub struct Progress {
    passes: watch::Sender<Vec<u64>>,
}

/// One loop's handle: `beat` after every pass, failed or not.
#[derive(Clone)]
pub struct Beat {
    passes: watch::Sender<Vec<u64>>,
    slot: usize,
}

impl Progress {
    /// Counters for `loops` loops, all at zero.
    pub fn new(loops: usize) -> Self {
        Self {
            passes: watch::Sender::new(vec![0; loops]),
        }
    }

    /// The handle of loop number `slot` (0 is the lock sweeper, whose first
    /// pass means "ready").
    pub fn beat(&self, slot: usize) -> Beat {
        assert!(slot < self.passes.borrow().len(), "no loop {slot}");
        Beat {
            passes: self.passes.clone(),
            slot,
        }
    }

    /// Watches the counters; `Watcher::moved` says when every loop moved.
    pub fn watch(&self) -> Watcher {
        let rx = self.passes.subscribe();
        let seen = rx.borrow().clone();
        Watcher { rx, seen }
    }
}

impl Beat {
    /// A beat nobody watches: for a loop that must not feed the watchdog
    /// (the horizon check, which runs every 10 s and never sweeps).
    pub fn unwatched() -> Self {
        Self {
            passes: watch::Sender::new(vec![0]),
            slot: 0,
        }
    }

    /// One more pass of this loop.
    pub fn beat(&self) {
        self.passes.send_modify(|p| p[self.slot] += 1);
    }
}

/// Tells when every loop has finished a pass since the last time it said so.
pub struct Watcher {
    rx: watch::Receiver<Vec<u64>>,
    seen: Vec<u64>,
}

impl Watcher {
    /// Waits for the next beat of any loop: `false` once `shutdown` fires or
    /// every `Beat` and the `Progress` are gone (the follower should stop).
    pub async fn next(&mut self, shutdown: &CancellationToken) -> bool {
        tokio::select! {
            () = shutdown.cancelled() => false,
            changed = self.rx.changed() => changed.is_ok(),
        }
    }

    /// Passes of loop `slot` so far.
    pub fn passes(&self, slot: usize) -> u64 {
        self.rx.borrow()[slot]
    }

    /// Counts afresh from now, as a `true` from `all_moved` would: for a
    /// signal sent on other grounds that is still a watchdog ping (systemd's
    /// READY=1 carries WATCHDOG=1), so the next ping waits for every loop.
    pub fn restart(&mut self) {
        self.seen = self.rx.borrow().clone();
    }

    /// True when every loop has finished a pass since the last `true` (or
    /// `restart`); then starts counting afresh.
    pub fn all_moved(&mut self) -> bool {
        let now = self.rx.borrow().clone();
        let moved = now.iter().zip(&self.seen).all(|(n, s)| n > s);
        if moved {
            self.seen = now;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pass_of_every_loop_counts_as_progress() {
        let progress = Progress::new(2);
        let (locks, jobs) = (progress.beat(0), progress.beat(1));
        let mut watcher = progress.watch();

        locks.beat();
        locks.beat();
        assert!(!watcher.all_moved(), "the job loop has not moved");
        jobs.beat();
        assert!(watcher.all_moved());
        assert!(!watcher.all_moved(), "nothing moved since");
        jobs.beat();
        assert!(!watcher.all_moved(), "the lock loop has not moved since");
    }
}
