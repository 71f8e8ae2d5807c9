//! `gpupin status`: which GPUs are held, by whom, since when.

use gpupin::config::Config;
use gpupin::ledger::Ledger;
use gpupin::{inventory, report};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

pub fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let inventory = inventory::load(&config.inventory, &config.state_dir, &config.nvml)?;
    let records = Ledger::read_only_for_config(config)?.records()?;
    if args.json {
        outln!(
            "{:#}",
            report::status_json(&inventory, &records, config.claim_grace)
        )?;
    } else {
        out!(
            "{}",
            report::status_table(&inventory, &records, config.claim_grace)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
