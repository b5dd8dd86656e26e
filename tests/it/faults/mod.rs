//! What goes wrong around the daemon and must not lose or forge a report:
//! a skewed clock, other writers on its rows, a silent DNS server, a
//! database outage, signals mid-drain, a StatsD that is not there, and
//! hostile input.

mod clock;
mod concurrent_writers;
mod dns;
mod hostile;
mod outage;
mod signals;
mod statsd;
mod support;
