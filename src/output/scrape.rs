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
//! With a web configuration file (`output::web_config`) it also serves TLS
//! and checks Basic credentials, under the same bounds: a TLS handshake
//! holds one of the `MAX_CONNECTIONS` slots, must end within
//! `HEAD_READ_TIMEOUT` (the head then has its own `HEAD_READ_TIMEOUT`), and
//! counts in `CONNECTION_DEADLINE`; bcrypt runs one at a time off this
//! thread (`web_config::auth`). The file is re-read for each connection
//! that gets a slot; a bad version leaves the last good one serving.
//!
//! It does not own the series (`output::prometheus`) and it never writes to
//! them: a scrape only reads.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    ALLOW, AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::output::prometheus::Exposition;
use crate::output::web_config::auth::Authenticator;
use crate::output::web_config::{Active, Change, Watch};

/// The variable that turns the endpoint on.
pub const ADDR_VAR: &str = "LEASE_SWEEPER_METRICS_ADDR";

/// The one path served.
pub const PATH: &str = "/metrics";

/// Connections served at once, TLS handshakes in progress included. A
/// scraper needs one; a few Prometheus replicas and an operator's curl fit
/// many times over. Past it, a new connection is closed at once (before the
/// web configuration file is read or a handshake begins), so a flood holds
/// at most this many connections' buffers (about 16 KiB each, plus
/// rustls's bounded record buffers under TLS).
pub const MAX_CONNECTIONS: usize = 64;

/// Largest request head (request line and headers). hyper's smallest read
/// buffer; a scrape's head is a few hundred bytes. Larger heads get 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// How long a client may take to send its request head, counted from the
/// connection's start (under TLS: from the handshake's end; the handshake
/// has this long too): a connection that sends nothing (or a byte a
/// second) is closed after this.
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
/// and serves the exposition on a thread of its own until `shutdown` fires,
/// under the web configuration `web` keeps current when there is one.
/// Returns the address bound (the port chosen, when `addr`'s is 0).
pub fn start(
    addr: SocketAddr,
    exposition: Exposition,
    web: Option<Watch>,
    shutdown: CancellationToken,
) -> Result<SocketAddr, ScrapeError> {
    let bind_failed = |source| ScrapeError::Bind { addr, source };
    let listener = TcpListener::bind(addr).map_err(bind_failed)?;
    listener.set_nonblocking(true).map_err(bind_failed)?;
    let bound = listener.local_addr().map_err(bind_failed)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        // bcrypt, one at a time (`web_config::auth`): one thread is enough,
        // and a flood of passwords cannot take a second core.
        .max_blocking_threads(1)
        .build()
        .map_err(ScrapeError::Thread)?;
    std::thread::Builder::new()
        .name("metrics-endpoint".into())
        .spawn(move || runtime.block_on(serve(listener, exposition, web, shutdown)))
        .map_err(ScrapeError::Thread)?;
    Ok(bound)
}

async fn serve(
    listener: TcpListener,
    exposition: Exposition,
    mut web: Option<Watch>,
    shutdown: CancellationToken,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            // Cannot happen on a socket that just bound; said once if it does.
            tracing::error!(error = %e, "metrics_endpoint_failed");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let authenticator = Authenticator::default();
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
        let active = web.as_mut().map(current);
        let exposition = exposition.clone();
        let auth = authenticator.clone();
        let http = http.clone();
        tokio::spawn(async move {
            // Errors are the client's (a bad request, a failed handshake, a
            // reset, a timeout): nothing to log and nothing to retry.
            let _ = tokio::time::timeout(
                CONNECTION_DEADLINE,
                connection(stream, http, exposition, active, auth),
            )
            .await;
            drop(slot);
        });
    }
}

/// The web configuration for the next connection, logging what changed.
fn current(web: &mut Watch) -> Arc<Active> {
    let (active, change) = web.current();
    match change {
        Change::None => {}
        Change::Loaded => {
            tracing::info!(
                file = %web.path().display(),
                summary = %active.summary(),
                "web_config_loaded"
            );
            warn_about(web.path(), &active);
        }
        Change::Rejected(e) => {
            tracing::error!(file = %web.path().display(), error = %e, "web_config_rejected");
        }
    }
    active
}

/// What the toolkit accepts but an operator should hear about: an expired
/// certificate (served all the same), client certificates checked against
/// no CA or every public one. Said when a version is taken.
pub fn warn_about(file: &std::path::Path, active: &Active) {
    if active.expired {
        tracing::warn!(
            file = %file.display(),
            notAfter = active.not_after.as_deref().unwrap_or(""),
            "web_config_certificate_expired"
        );
    }
    for warning in &active.warnings {
        tracing::warn!(file = %file.display(), warning = %warning, "web_config_warning");
    }
}

/// One connection: the TLS handshake when the configuration asks for TLS
/// (bounded by `HEAD_READ_TIMEOUT`), then one request.
async fn connection(
    stream: tokio::net::TcpStream,
    http: hyper::server::conn::http1::Builder,
    exposition: Exposition,
    active: Option<Arc<Active>>,
    auth: Authenticator,
) {
    let tls = active.as_ref().and_then(|a| a.tls.clone());
    let service = hyper::service::service_fn(move |request| {
        let exposition = exposition.clone();
        let active = active.clone();
        let auth = auth.clone();
        async move { Ok::<_, Infallible>(answer(request, exposition, active, auth).await) }
    });
    match tls {
        None => {
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        }
        Some(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let Ok(Ok(stream)) =
                tokio::time::timeout(HEAD_READ_TIMEOUT, acceptor.accept(stream)).await
            else {
                return;
            };
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        }
    }
}

/// Credentials first (on every path, as the toolkit does), then the
/// response, with the file's headers on either.
async fn answer(
    request: Request<Incoming>,
    exposition: Exposition,
    active: Option<Arc<Active>>,
    auth: Authenticator,
) -> Response<Full<Bytes>> {
    let Some(active) = active else {
        return respond(&request, &exposition);
    };
    let allowed = active.users.is_empty()
        || auth
            .allows(
                &active.users,
                request
                    .headers()
                    .get(AUTHORIZATION)
                    .map(HeaderValue::as_bytes),
            )
            .await;
    let mut response = if allowed {
        respond(&request, &exposition)
    } else {
        unauthorized()
    };
    for (name, value) in &active.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The same answer whether the user is unknown or the password wrong.
fn unauthorized() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"Unauthorized\n")));
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    let headers = response.headers_mut();
    headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
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
