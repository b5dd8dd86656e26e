//! StatsD delivery: the buffer that metric lines wait in, and the one sender
//! thread that resolves the host and sends them over UDP.
//!
//! Owns the delivery discipline: `Statsd::flush`, on the sweep's path, only
//! hands the buffered lines to the sender, so DNS and the network never hold
//! up a sweep; the sender resolves when it has something to send (again after
//! a failure, at most every `RETRY_PAUSE`), keeps what waits bounded, and gets
//! a short bound at shutdown (`Statsd::finish`). Metrics are best effort, so
//! nothing here returns an error. It does not name metrics or tags
//! (`output::metrics` does). Why cadence, our own sink and a thread:
//! docs/decisions.md, section 2.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs as _, UdpSocket};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cadence::{MetricSink, StatsdClient};

use crate::config::StatsdTarget;

/// Largest payload per datagram: fits a 1500-byte MTU after IP/UDP headers,
/// the size the Datadog agent and Etsy statsd recommend.
const MAX_DATAGRAM: usize = 1432;

/// Datagrams kept while the target cannot be reached; older ones are dropped
/// so an unreachable agent never grows memory (at most about 360 KiB).
const MAX_PENDING_DATAGRAMS: usize = 256;

/// After a failed lookup or send, the sender waits this long before it
/// resolves and tries again (sooner only when `finish` asks). What is handed
/// over meanwhile is kept, bounded, and sent once the host resolves.
const RETRY_PAUSE: Duration = Duration::from_secs(5);

/// How often an idle sender looks whether every handle is gone, so the
/// thread of a dropped client ends (tests build many).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long the shutdown waits for the sender to deliver what is left: long
/// enough for a lookup that answers and a few hundred sends, short enough
/// that a dead DNS server never holds up an exit.
pub const FINISH_BOUND: Duration = Duration::from_secs(1);

/// Longest one datagram's send may block (a full socket buffer).
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// How the sender turns the target into an address; a parameter so the
/// tests can stand in a lookup that hangs or fails.
type Resolver = Box<dyn Fn(&StatsdTarget) -> Result<SocketAddr, String> + Send>;

/// A StatsD client whose lines wait in memory until `flush`.
#[derive(Clone)]
pub struct Statsd {
    /// Formats DogStatsD lines (tags in the order they are added).
    pub client: Arc<StatsdClient>,
    shared: Arc<Shared>,
}

impl Statsd {
    /// Starts the sender thread. A host that does not resolve is not an
    /// error here, nor later: it is retried by the sender.
    pub fn new(target: StatsdTarget) -> Self {
        Self::start(target, Box::new(resolve))
    }

    fn start(target: StatsdTarget, resolver: Resolver) -> Self {
        let shared = Arc::new(Shared {
            target,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            settled: Condvar::new(),
        });
        let for_sender = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("statsd-sender".into())
            .spawn(move || send_loop(&for_sender, &resolver));
        if let Err(e) = spawned {
            // Lines then wait, bounded, and are never sent; the sweep goes on.
            tracing::warn!(
                target = %shared.target,
                error = %format!("cannot start the StatsD sender thread: {e}; \
                                  metrics are not sent until the daemon restarts"),
                "statsd_unavailable"
            );
        }
        let client = StatsdClient::from_sink("", SharedSink(shared.clone()));
        Self {
            client: Arc::new(client),
            shared,
        }
    }

    /// Hands everything buffered over to the sender and returns at once:
    /// it never waits on a lookup or a send.
    pub fn flush(&self) {
        self.shared.hand_over(false);
    }

    /// At shutdown: hands everything over, lets the sender retry at once if
    /// it was pausing after a failure, and blocks the calling thread until
    /// it has sent all of it, that retry has failed, or `bound` has passed,
    /// whichever is first (a lookup that never answers costs `bound`, never
    /// a hang). Returns whether everything was sent.
    pub fn finish(&self, bound: Duration) -> bool {
        self.shared.hand_over(true);
        let deadline = Instant::now() + bound;
        let mut s = self.shared.lock();
        while !s.pending.is_empty() || s.in_flight {
            if s.pausing && !s.hurry {
                // The one try asked for failed: nothing more comes in time.
                return false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .shared
                .settled
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

/// What the sweep's side and the sender share.
struct Shared {
    target: StatsdTarget,
    state: Mutex<State>,
    /// Wakes the sender: datagrams handed over, or `finish` hurrying it.
    wake: Condvar,
    /// Wakes `finish`: the sender settled a batch (sent, or put back).
    settled: Condvar,
}

#[derive(Default)]
struct State {
    /// The datagram `push` is filling, not yet handed over.
    current: String,
    /// Datagrams handed over, oldest first, waiting for the sender.
    pending: VecDeque<String>,
    /// The sender holds a batch it took from `pending`.
    in_flight: bool,
    /// `finish` asks the sender not to wait out `RETRY_PAUSE` (once).
    hurry: bool,
    /// The sender is waiting out `RETRY_PAUSE` after a failure.
    pausing: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the current datagram to `pending` and wakes the sender. While
    /// the sender cannot deliver, small datagrams are merged up to
    /// `MAX_DATAGRAM`, so the bound holds lines, not sweeps.
    fn hand_over(&self, hurry: bool) {
        let mut s = self.lock();
        let current = std::mem::take(&mut s.current);
        if !current.is_empty() {
            match s.pending.back_mut() {
                Some(last) if last.len() + 1 + current.len() <= MAX_DATAGRAM => {
                    last.push('\n');
                    last.push_str(&current);
                }
                _ => enqueue(&mut s.pending, current),
            }
        }
        s.hurry |= hurry;
        if !s.pending.is_empty() || hurry {
            self.wake.notify_one();
        }
    }

    /// Appends one metric line, starting a new datagram when it would not
    /// fit (the full one is handed over: a large batch streams).
    fn push(&self, metric: &str) {
        let mut s = self.lock();
        if !s.current.is_empty() && s.current.len() + 1 + metric.len() > MAX_DATAGRAM {
            let full = std::mem::take(&mut s.current);
            enqueue(&mut s.pending, full);
            self.wake.notify_one();
        }
        if !s.current.is_empty() {
            s.current.push('\n');
        }
        s.current.push_str(metric);
    }
}

/// Appends a datagram, dropping the oldest beyond `MAX_PENDING_DATAGRAMS`.
fn enqueue(pending: &mut VecDeque<String>, datagram: String) {
    pending.push_back(datagram);
    while pending.len() > MAX_PENDING_DATAGRAMS {
        pending.pop_front();
    }
}

/// The sender thread: waits for datagrams, delivers them, puts back what
/// it could not send; ends once every `Statsd` handle is gone.
fn send_loop(shared: &Arc<Shared>, resolver: &Resolver) {
    let mut link = Link::default();
    loop {
        let batch = {
            let mut s = shared.lock();
            loop {
                // Only this thread's reference is left: nobody can push again.
                if Arc::strong_count(shared) == 1 {
                    return;
                }
                let mut pause = link
                    .retry_at
                    .map(|t| t.saturating_duration_since(Instant::now()))
                    .filter(|left| !left.is_zero());
                if pause.is_some() && s.hurry {
                    // One try at once for `finish`; a failure then pauses.
                    s.hurry = false;
                    pause = None;
                }
                if !s.pending.is_empty() && pause.is_none() {
                    s.pausing = false;
                    break;
                }
                if s.pausing != pause.is_some() {
                    s.pausing = pause.is_some();
                    shared.settled.notify_all();
                }
                let wait = pause.map_or(IDLE_CHECK, |left| left.min(IDLE_CHECK));
                s = shared
                    .wake
                    .wait_timeout(s, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            s.in_flight = true;
            std::mem::take(&mut s.pending)
        };
        let unsent = link.deliver(&shared.target, resolver, batch);
        let mut s = shared.lock();
        s.in_flight = false;
        if !unsent.is_empty() {
            // What could not be sent is older than what arrived meanwhile.
            let newer = std::mem::replace(&mut s.pending, unsent);
            for datagram in newer {
                enqueue(&mut s.pending, datagram);
            }
        }
        shared.settled.notify_all();
    }
}

/// The sender's own view of the target; only its thread touches it.
#[derive(Default)]
struct Link {
    addr: Option<SocketAddr>,
    socket: Option<UdpSocket>,
    /// The last failure reported, so a persistent one is logged only once.
    failing: Option<String>,
    /// No new lookup or send before this, after a failure.
    retry_at: Option<Instant>,
}

impl Link {
    /// Sends `batch` in order; returns what was not sent.
    fn deliver(
        &mut self,
        target: &StatsdTarget,
        resolver: &Resolver,
        mut batch: VecDeque<String>,
    ) -> VecDeque<String> {
        let addr = match self.addr {
            Some(addr) => addr,
            None => match resolver(target) {
                Ok(addr) => {
                    self.addr = Some(addr);
                    addr
                }
                Err(cause) => {
                    self.failed(target, &format!("cannot resolve {target}: {cause}"));
                    return batch;
                }
            },
        };
        if self.socket.is_none() {
            match open_socket(addr) {
                Ok(socket) => self.socket = Some(socket),
                Err(e) => {
                    self.failed(target, &format!("cannot open a UDP socket: {e}"));
                    return batch;
                }
            }
        }
        let socket = self.socket.as_ref().expect("the socket was just opened");
        while let Some(datagram) = batch.front() {
            if let Err(e) = socket.send_to(datagram.as_bytes(), addr) {
                self.failed(target, &format!("cannot send to {target}: {e}"));
                return batch;
            }
            batch.pop_front();
        }
        self.retry_at = None;
        if self.failing.take().is_some() {
            tracing::info!(target = %target, "statsd_recovered");
        }
        batch
    }

    /// Forgets the address (the next try resolves again) and pauses.
    fn failed(&mut self, target: &StatsdTarget, cause: &str) {
        self.addr = None;
        self.socket = None;
        self.retry_at = Some(Instant::now() + RETRY_PAUSE);
        if self.failing.as_deref() != Some(cause) {
            tracing::warn!(target = %target, error = %cause, "statsd_unavailable");
            self.failing = Some(cause.to_owned());
        }
    }
}

/// The system's lookup (`/etc/hosts`, then DNS, as `/etc/nsswitch.conf`
/// says); the first address wins.
fn resolve(target: &StatsdTarget) -> Result<SocketAddr, String> {
    (target.host.as_str(), target.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "no address".to_owned())
}

fn open_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local)?;
    socket.set_write_timeout(Some(SEND_TIMEOUT))?;
    Ok(socket)
}

/// The handle cadence writes through.
struct SharedSink(Arc<Shared>);

impl MetricSink for SharedSink {
    fn emit(&self, metric: &str) -> io::Result<usize> {
        self.0.push(metric);
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use cadence::Counted as _;

    use super::*;
    use crate::output::test_agent::Agent;

    fn target() -> StatsdTarget {
        StatsdTarget {
            host: "statsd.test".into(),
            port: 8125,
        }
    }

    #[tokio::test]
    async fn flush_returns_while_the_lookup_hangs_and_the_lines_follow_its_answer() {
        let agent = Agent::bind();
        let addr = agent.addr();
        let (answer, answered) = mpsc::channel::<()>();
        let answered = Mutex::new(answered);
        let statsd = Statsd::start(
            target(),
            Box::new(move |_| {
                answered.lock().unwrap().recv().unwrap();
                Ok(addr)
            }),
        );
        // The lookup is blocked until `answer` is sent: a flush that waited
        // on it would never return, and the test would hang here.
        for n in 1..=3 {
            statsd.client.count("lock.lease.expired", n).unwrap();
            statsd.flush();
        }
        answer.send(()).unwrap();

        assert_eq!(
            agent.receive(3),
            [
                "lock.lease.expired:1|c",
                "lock.lease.expired:2|c",
                "lock.lease.expired:3|c"
            ]
        );
    }

    #[test]
    fn finish_gives_up_at_its_bound_when_the_lookup_never_answers() {
        let (_answer, answered) = mpsc::channel::<()>();
        let answered = Mutex::new(answered);
        let statsd = Statsd::start(
            target(),
            Box::new(move |_| {
                let _ = answered.lock().unwrap().recv();
                Err("never answered".into())
            }),
        );
        statsd.client.count("lock.lease.expired", 1).unwrap();

        let started = Instant::now();
        let delivered = statsd.finish(Duration::from_millis(300));

        assert!(!delivered);
        let took = started.elapsed();
        assert!(
            (Duration::from_millis(300)..Duration::from_secs(2)).contains(&took),
            "finish took {took:?}"
        );
    }

    #[test]
    fn finish_returns_as_soon_as_its_retry_has_failed() {
        let statsd = Statsd::start(target(), Box::new(|_| Err("no such host".into())));
        statsd.client.count("lock.lease.expired", 1).unwrap();
        statsd.shared.hand_over(false);
        // The first try has failed and the sender is pausing.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !statsd.shared.lock().pausing {
            assert!(Instant::now() < deadline, "the sender never paused");
            std::thread::sleep(Duration::from_millis(5));
        }

        let started = Instant::now();
        assert!(!statsd.finish(Duration::from_secs(30)));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "waited {took:?} for nothing");
        assert!(
            !statsd.shared.lock().pending.is_empty(),
            "kept for a later try"
        );
    }

    #[test]
    fn an_unreachable_host_keeps_the_newest_lines_within_the_bound_and_sends_them_later() {
        let agent = Agent::bind();
        let addr = agent.addr();
        let (resolves, resolved) = mpsc::channel::<Result<SocketAddr, String>>();
        let resolved = Mutex::new(resolved);
        let statsd = Statsd::start(
            target(),
            Box::new(move |_| resolved.lock().unwrap().recv().unwrap()),
        );
        resolves.send(Err("no such host".into())).unwrap();
        // Each line fills most of a datagram, so every flush is one datagram.
        let pad = "x".repeat(MAX_DATAGRAM - 40);
        let total = MAX_PENDING_DATAGRAMS + 50;
        for i in 0..total {
            statsd.client.count(&format!("m{i:04}.{pad}"), 1).unwrap();
            statsd.shared.hand_over(false);
        }
        let kept: Vec<String> = statsd
            .shared
            .lock()
            .pending
            .iter()
            .map(|d| d[..5].to_owned())
            .collect();
        let newest: Vec<String> = (total - MAX_PENDING_DATAGRAMS..total)
            .map(|i| format!("m{i:04}"))
            .collect();
        assert_eq!(
            kept, newest,
            "the oldest were dropped, the rest kept in order"
        );

        // Sent once the host resolves (the listener need not read them all:
        // a send on loopback succeeds whether or not it is read).
        resolves.send(Ok(addr)).unwrap();
        assert!(
            statsd.finish(Duration::from_secs(10)),
            "delivered once resolved"
        );
        assert_eq!(&agent.receive(1)[0][..5], "m0050");
    }

    #[test]
    fn small_flushes_merge_while_the_sender_cannot_deliver() {
        let (_resolves, resolved) = mpsc::channel::<Result<SocketAddr, String>>();
        let resolved = Mutex::new(resolved);
        // The lookup blocks forever: every flush waits in `pending`.
        let statsd = Statsd::start(
            target(),
            Box::new(move |_| {
                resolved
                    .lock()
                    .unwrap()
                    .recv()
                    .unwrap_or(Err("gone".into()))
            }),
        );
        statsd.client.count("first", 1).unwrap();
        statsd.shared.hand_over(false);
        wait_in_flight(&statsd);
        for _ in 0..100 {
            statsd.client.count("lock.lease.expired", 1).unwrap();
            statsd.shared.hand_over(false);
        }

        let s = statsd.shared.lock();
        let lines: usize = s.pending.iter().map(|d| d.lines().count()).sum();
        assert_eq!(lines, 100);
        assert!(s.pending.len() <= 3, "{} datagrams", s.pending.len());
        assert!(s.pending.iter().all(|d| d.len() <= MAX_DATAGRAM));
    }

    /// Waits until the sender has taken what was handed over (and is now
    /// blocked in its lookup).
    fn wait_in_flight(statsd: &Statsd) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !statsd.shared.lock().in_flight {
            assert!(Instant::now() < deadline, "the sender never took the batch");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
