//! What an operator watches: the Prometheus endpoint (exact counts, a
//! flood on its port, the lateness histograms), the shipped mtail program,
//! rules and dashboard against live series, and the horizon check.

mod dashboard;
mod horizon;
mod lateness;
mod mtail;
mod scrape;
mod scrape_flood;
pub mod support;
