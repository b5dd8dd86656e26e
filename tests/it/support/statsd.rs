//! A real UDP socket standing in for a StatsD agent, and the waits that
//! count passes by the gauges every pass sends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UdpSocket;

use super::wait_until;

/// A real UDP socket standing in for a StatsD agent.
#[derive(Clone)]
pub struct StatsdCapture {
    pub port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl StatsdCapture {
    pub async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind UDP");
        let port = socket.local_addr().unwrap().port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok(n) = socket.recv(&mut buf).await {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock().unwrap().extend(text.lines().map(str::to_owned));
            }
        });
        Self { port, lines }
    }

    pub fn target(&self) -> lease_sweeper::testing::config::StatsdTarget {
        lease_sweeper::testing::config::StatsdTarget {
            host: "127.0.0.1".into(),
            port: self.port,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Sum of every `name:N|c|#tags` line with exactly these tags.
    pub fn counter(&self, name: &str, tags: &str) -> u64 {
        self.lines()
            .iter()
            .filter_map(|l| {
                let (metric, rest) = l.split_once(':')?;
                let mut parts = rest.split('|');
                let value = parts.next()?;
                let kind = parts.next()?;
                let line_tags = parts.next().unwrap_or("");
                (metric == name && kind == "c" && line_tags == tags)
                    .then(|| value.parse::<u64>().ok())?
            })
            .sum()
    }

    /// The last value of a gauge with exactly these tags.
    pub fn gauge(&self, name: &str, tags: &str) -> Option<u64> {
        self.lines().iter().rev().find_map(|l| {
            let (metric, rest) = l.split_once(':')?;
            let parts: Vec<&str> = rest.split('|').collect();
            (metric == name
                && parts.get(1) == Some(&"g")
                && parts.get(2).copied().unwrap_or("") == tags)
                .then(|| parts[0].parse().ok())?
        })
    }

    pub async fn wait_counter(&self, name: &str, tags: &str, expected: u64) {
        let what = format!("{name} {tags} to reach {expected}");
        wait_until(Duration::from_secs(10), &what, || async {
            self.counter(name, tags) >= expected
        })
        .await;
    }
}

/// Lock sweeps seen so far: each one that finishes sends the held gauge.
pub fn lock_sweeps_seen(statsd: &StatsdCapture) -> usize {
    statsd
        .lines()
        .iter()
        .filter(|l| l.starts_with("lock.held.current:"))
        .count()
}

/// Job-reaper passes seen so far: each one that finishes sends the stale gauge.
pub fn job_passes_seen(statsd: &StatsdCapture) -> usize {
    statsd
        .lines()
        .iter()
        .filter(|l| l.starts_with("queue.lease.stale.current:"))
        .count()
}

/// Waits until `seen` has grown by `n` from its value now (20 s at most):
/// the one shape of "let N more passes happen" that every signal uses.
pub(super) async fn wait_more(n: usize, what: &str, seen: impl Fn() -> usize) {
    let target = seen() + n;
    wait_until(
        Duration::from_secs(20),
        &format!("{n} more {what}"),
        || async { seen() >= target },
    )
    .await;
}

/// Waits until `n` more lock sweeps have finished (a deterministic "let a
/// few sweeps pass": no fixed sleep).
pub async fn wait_sweeps(statsd: &StatsdCapture, n: usize) {
    wait_more(n, "lock sweeps", || lock_sweeps_seen(statsd)).await;
}

/// Waits until `n` more job-reaper passes have finished.
pub async fn wait_job_passes(statsd: &StatsdCapture, n: usize) {
    wait_more(n, "job-reaper passes", || job_passes_seen(statsd)).await;
}
