//! The `lease-sweeper` binary: parse the command line, set up logging, run the
//! command, report a failure once and choose the exit status.

use std::process::ExitCode;

use clap::Parser as _;
use lease_sweeper::{cli::Cli, cmd, telemetry};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cmd::name(&cli.command);
    if let Err(e) = telemetry::init(cmd::log_output(&cli.command)) {
        eprintln!("lease-sweeper: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(cmd::execute(cli)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(command, error = %format!("{e:#}"), "failed");
            cmd::exit_code_for(&e)
        }
    }
}
