//! Graceful shutdown: SIGTERM and SIGINT become a `CancellationToken`.
//!
//! Owns the signal handling only. The first signal cancels the token (the
//! sweep loop finishes its batch, flushes and returns); a second one exits at
//! once, because an operator who asks twice means it. Whoever owns the loop
//! decides what "stop" means; tests cancel the token directly.

use futures_util::StreamExt as _;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Starts listening for SIGTERM and SIGINT; returns the token they cancel.
/// Must be called inside a Tokio runtime.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut seen = false;
        while let Some(signal) = signals.next().await {
            let name = if signal == SIGTERM {
                "SIGTERM"
            } else {
                "SIGINT"
            };
            if seen {
                warn!(signal = name, "shutdown_forced");
                std::process::exit(128 + signal);
            }
            seen = true;
            info!(signal = name, "shutdown_requested");
            cancel.cancel();
        }
    });
    Ok(token)
}
