//! The scrape endpoint behind a web configuration file (the Prometheus
//! exporter toolkit's format): `check` agreeing with `promtool`, a real
//! Prometheus scraping over TLS with basic auth or a client certificate,
//! what curl gets with and without each credential, rotation and re-reads
//! while running, bad files at start, and the flood with TLS on.

mod agreement;
mod auth_flood;
mod client_auth;
mod corpus;
mod curl_status;
mod prometheus_scrape;
mod reload;
mod start;
pub mod support;
mod tls_flood;
