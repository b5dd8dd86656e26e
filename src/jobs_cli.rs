//! `lease-sweeper jobs …` and `gates …`. (Being written: issue 3.)

use std::process::ExitCode;

use crate::cli::{GatesArgs, JobsCommand};

pub async fn jobs(_cmd: JobsCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("jobs is not implemented yet")
}

pub async fn gates(_args: GatesArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gates is not implemented yet")
}
