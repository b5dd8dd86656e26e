//! `lease-sweeper check`: the operator's preflight. (Being written: issue 5.)

use std::process::ExitCode;

pub async fn run() -> anyhow::Result<ExitCode> {
    anyhow::bail!("check is not implemented yet")
}
