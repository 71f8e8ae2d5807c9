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
    let inventory = inventory::load(&config.inventory, &config.state_dir)?;
    let records = Ledger::open_read_only(&config.state_dir)?.records()?;
    if args.json {
        println!("{:#}", report::status_json(&inventory, &records));
    } else {
        print!("{}", report::status_table(&inventory, &records));
    }
    Ok(ExitCode::SUCCESS)
}
