//! Plumbing for the scrape-endpoint tests: a daemon with its endpoint on a
//! port the kernel picks, a plain HTTP/1.0 client, and reading a series out
//! of the text format.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{Daemon, events};

/// The endpoint's variable.
pub const ADDR_VAR: &str = "LEASE_SWEEPER_METRICS_ADDR";

/// Starts `lease-sweeper run` with `env` and the endpoint on a free loopback
/// port; returns it with the address it logged in `metrics_listening`.
pub async fn daemon_with_endpoint(env: &[(&str, &str)]) -> (Daemon, SocketAddr) {
    let mut env = env.to_vec();
    env.push((ADDR_VAR, "127.0.0.1:0"));
    let daemon = Daemon::spawn(&env);
    daemon
        .wait_for_event("metrics_listening", Duration::from_secs(30))
        .await;
    let addr = events(&daemon.lines(), "metrics_listening")[0]["addr"]
        .parse()
        .expect("metrics_listening carries the bound address");
    (daemon, addr)
}

/// One request as raw bytes; returns the status code and the body.
pub async fn request(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connecting to the endpoint");
    stream.write_all(raw).await.expect("sending the request");
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut response))
        .await
        .expect("the endpoint answers and closes within 15 s")
        .expect("reading the response");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// `GET path`; returns the status code and the body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    request(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
}

/// The body of a successful scrape.
pub async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the series written exactly as `series` (name and labels in
/// the order the endpoint writes them), if present.
pub fn value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let (name, v) = line.rsplit_once(' ')?;
        (name == series).then(|| v.parse().expect("a numeric sample"))
    })
}
