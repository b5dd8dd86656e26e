//! StatsD delivery: the buffer that metric lines wait in and the UDP send.
//!
//! Owns the delivery discipline: lines are buffered in memory and sent when
//! `Statsd::flush` is called (after every committed batch, after every pass
//! and at shutdown), never left sitting in a buffer. The target host is
//! resolved at flush time and again after a failure, so a name that does not
//! resolve yet never stops the daemon. Metrics are best effort; sweeping is
//! not, so nothing here returns an error. It does not name metrics or tags
//! (`output::metrics` does).
//!
//! cadence formats the lines; the sink is ours because cadence's UDP sinks
//! resolve once at construction and buffer without a timed flush (see
//! docs/decisions.md).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cadence::{MetricSink, StatsdClient};

use crate::config::StatsdTarget;

/// Largest payload per datagram: fits a 1500-byte MTU after IP/UDP headers,
/// the size the Datadog agent and Etsy statsd recommend.
const MAX_DATAGRAM: usize = 1432;

/// Datagrams kept while the target cannot be reached; older ones are dropped
/// so an unreachable agent never grows memory.
const MAX_PENDING_DATAGRAMS: usize = 256;

/// How long a DNS lookup of the StatsD host may hold up a flush.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// After a failed lookup, flushes skip resolving for this long: a drain
/// flushes after every batch and must not wait on DNS each time. What is
/// buffered meanwhile is kept (bounded) and sent once the host resolves.
const RESOLVE_RETRY: Duration = Duration::from_secs(5);

/// A StatsD client whose lines wait in memory until `flush`.
#[derive(Clone)]
pub struct Statsd {
    /// Formats DogStatsD lines (tags in the order they are added).
    pub client: Arc<StatsdClient>,
    sink: Arc<Buffer>,
}

impl Statsd {
    pub fn new(target: StatsdTarget) -> Self {
        let sink = Arc::new(Buffer {
            target,
            state: Mutex::new(State::default()),
        });
        let client = StatsdClient::from_sink("", SharedSink(sink.clone()));
        Self {
            client: Arc::new(client),
            sink,
        }
    }

    /// Sends everything buffered. Resolves the host first if it is not known
    /// (at start, or after a failure). Failures are logged once per change
    /// of state and never returned.
    pub async fn flush(&self) {
        if !self.sink.has_data() {
            return;
        }
        if !self.sink.has_addr() {
            if !self.sink.may_resolve() {
                return;
            }
            let target = (self.sink.target.host.clone(), self.sink.target.port);
            let resolved = match tokio::time::timeout(
                RESOLVE_TIMEOUT,
                tokio::net::lookup_host(target),
            )
            .await
            {
                Ok(Ok(mut addrs)) => addrs.next().ok_or_else(|| "no address".to_owned()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {} s", RESOLVE_TIMEOUT.as_secs())),
            };
            match resolved {
                Ok(addr) => self.sink.set_addr(addr),
                Err(cause) => {
                    self.sink
                        .resolve_failed(&format!("cannot resolve {}: {cause}", self.sink.target));
                    return;
                }
            }
        }
        self.sink.send_pending();
    }
}

/// What the sink knows between flushes.
#[derive(Default)]
struct State {
    current: String,
    pending: Vec<String>,
    addr: Option<SocketAddr>,
    socket: Option<UdpSocket>,
    /// The last failure reported, so a persistent one is logged only once.
    failing: Option<String>,
    /// When the last lookup failed, for `RESOLVE_RETRY`.
    resolve_failed_at: Option<std::time::Instant>,
}

struct Buffer {
    target: StatsdTarget,
    state: Mutex<State>,
}

impl Buffer {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn has_data(&self) -> bool {
        let s = self.lock();
        !s.current.is_empty() || !s.pending.is_empty()
    }

    fn has_addr(&self) -> bool {
        self.lock().addr.is_some()
    }

    fn may_resolve(&self) -> bool {
        self.lock()
            .resolve_failed_at
            .is_none_or(|t| t.elapsed() >= RESOLVE_RETRY)
    }

    fn set_addr(&self, addr: SocketAddr) {
        let mut s = self.lock();
        s.addr = Some(addr);
        s.resolve_failed_at = None;
        s.socket = None;
    }

    /// A failed lookup: recorded like any failure, and no new lookup for
    /// `RESOLVE_RETRY`.
    fn resolve_failed(&self, cause: &str) {
        self.failed(cause);
        self.lock().resolve_failed_at = Some(std::time::Instant::now());
    }

    fn failed(&self, cause: &str) {
        let mut s = self.lock();
        s.addr = None;
        s.socket = None;
        // Keep what is pending for the next try, bounded.
        let current = std::mem::take(&mut s.current);
        if !current.is_empty() {
            s.pending.push(current);
        }
        let excess = s.pending.len().saturating_sub(MAX_PENDING_DATAGRAMS);
        s.pending.drain(..excess);
        if s.failing.as_deref() != Some(cause) {
            tracing::warn!(target = %self.target, error = %cause, "statsd_unavailable");
            s.failing = Some(cause.to_owned());
        }
    }

    fn send_pending(&self) {
        let mut guard = self.lock();
        let s = &mut *guard;
        let current = std::mem::take(&mut s.current);
        if !current.is_empty() {
            s.pending.push(current);
        }
        let Some(addr) = s.addr else { return };
        if s.socket.is_none() {
            let local: SocketAddr = if addr.is_ipv4() {
                ([0, 0, 0, 0], 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            match UdpSocket::bind(local).and_then(|sock| sock.set_nonblocking(true).map(|()| sock))
            {
                Ok(sock) => s.socket = Some(sock),
                Err(e) => {
                    drop(guard);
                    self.failed(&format!("cannot open a UDP socket: {e}"));
                    return;
                }
            }
        }
        let socket = s.socket.as_ref().expect("socket was just set");
        let mut sent = 0;
        let mut error = None;
        for datagram in &s.pending {
            match socket.send_to(datagram.as_bytes(), addr) {
                Ok(_) => sent += 1,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        s.pending.drain(..sent);
        match error {
            None => {
                if s.failing.take().is_some() {
                    tracing::info!(target = %self.target, "statsd_recovered");
                }
            }
            Some(e) => {
                drop(guard);
                self.failed(&format!("cannot send to {}: {e}", self.target));
            }
        }
    }

    /// Appends one metric line, starting a new datagram when it would not fit.
    fn push(&self, metric: &str) {
        let mut s = self.lock();
        if !s.current.is_empty() && s.current.len() + 1 + metric.len() > MAX_DATAGRAM {
            let full = std::mem::take(&mut s.current);
            s.pending.push(full);
            let excess = s.pending.len().saturating_sub(MAX_PENDING_DATAGRAMS);
            s.pending.drain(..excess);
        }
        if !s.current.is_empty() {
            s.current.push('\n');
        }
        s.current.push_str(metric);
    }
}

/// The handle cadence writes through.
struct SharedSink(Arc<Buffer>);

impl MetricSink for SharedSink {
    fn emit(&self, metric: &str) -> io::Result<usize> {
        self.0.push(metric);
        Ok(0)
    }
}
