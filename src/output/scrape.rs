//! The opt-in scrape endpoint: `GET /metrics` on the address in
//! `LEASE_SWEEPER_METRICS_ADDR`, in the Prometheus text format.
//!
//! Owns the listening socket and everything that keeps a hostile client away
//! from the sweep: the endpoint runs on a thread and runtime of its own (a
//! flood can take that thread's time, never the sweep's); at most
//! `MAX_CONNECTIONS` connections are served at once and the rest are closed
//! as they arrive; a request's head is bounded in size (`MAX_HEAD_BYTES`)
//! and in time (`HEAD_READ_TIMEOUT`); every connection serves one request
//! and ends within `CONNECTION_DEADLINE` whatever the client does. Nothing a
//! client sends is logged: a flood cannot flood the log either.
//!
//! It does not own the series (`output::prometheus`) and it never writes to
//! them: a scrape only reads.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::output::prometheus::Exposition;

/// The variable that turns the endpoint on.
pub const ADDR_VAR: &str = "LEASE_SWEEPER_METRICS_ADDR";

/// The one path served.
pub const PATH: &str = "/metrics";

/// Connections served at once. A scraper needs one; a few Prometheus
/// replicas and an operator's curl fit many times over. Past it, a new
/// connection is closed at once, so a flood holds at most this many
/// connections' buffers (about 16 KiB each).
pub const MAX_CONNECTIONS: usize = 64;

/// Largest request head (request line and headers). hyper's smallest read
/// buffer; a scrape's head is a few hundred bytes. Larger heads get 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// How long a client may take to send its request head, counted from the
/// connection's start: a connection that sends nothing (or a byte a second)
/// is closed after this.
pub const HEAD_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a connection lives, request and response together; a client
/// that stops reading its response is cut off here.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// Pause after a failed accept (out of file descriptors, say), so the
/// endpoint does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The content type of the text format, as Prometheus asks for it.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error(
        "cannot listen on {addr} ({ADDR_VAR}): {source}; choose a free port or address, \
         or unset {ADDR_VAR} to serve no metrics endpoint"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics endpoint's thread: {0}")]
    Thread(std::io::Error),
}

/// Binds `addr` now (so a port in use fails the start, not a later scrape)
/// and serves the exposition on a thread of its own until `shutdown` fires.
/// Returns the address bound (the port chosen, when `addr`'s is 0).
pub fn start(
    addr: SocketAddr,
    exposition: Exposition,
    shutdown: CancellationToken,
) -> Result<SocketAddr, ScrapeError> {
    let bind_failed = |source| ScrapeError::Bind { addr, source };
    let listener = TcpListener::bind(addr).map_err(bind_failed)?;
    listener.set_nonblocking(true).map_err(bind_failed)?;
    let bound = listener.local_addr().map_err(bind_failed)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(ScrapeError::Thread)?;
    std::thread::Builder::new()
        .name("metrics-endpoint".into())
        .spawn(move || runtime.block_on(serve(listener, exposition, shutdown)))
        .map_err(ScrapeError::Thread)?;
    Ok(bound)
}

async fn serve(listener: TcpListener, exposition: Exposition, shutdown: CancellationToken) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            // Cannot happen on a socket that just bound; said once if it does.
            tracing::error!(error = %e, "metrics_endpoint_failed");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false);
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Full: closing now keeps the kernel's queue moving, and the
            // flood's cost at one accept per connection.
            drop(stream);
            continue;
        };
        let exposition = exposition.clone();
        let connection = http.serve_connection(
            TokioIo::new(stream),
            hyper::service::service_fn(move |request| {
                std::future::ready(Ok::<_, Infallible>(respond(&request, &exposition)))
            }),
        );
        tokio::spawn(async move {
            // Errors are the client's (a bad request, a reset, a timeout):
            // nothing to log and nothing to retry.
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, connection).await;
            drop(slot);
        });
    }
}

fn respond(request: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, PATH) => (StatusCode::OK, exposition.render()),
        (_, PATH) => (
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are served here\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            format!("not found: the metrics are at {PATH}\n"),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if status == StatusCode::OK {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
    } else {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if status == StatusCode::METHOD_NOT_ALLOWED {
            headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        }
    }
    response
}
