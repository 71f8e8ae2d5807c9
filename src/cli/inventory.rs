//! `gpupin inventory`: the machine's GPUs and links, as gpupin sees them.

use gpupin::config::Config;
use gpupin::{inventory, report};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InventoryArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Probe the hardware again and rewrite the cached inventory
    #[arg(long)]
    pub refresh: bool,
}

pub fn run(config: &Config, args: &InventoryArgs) -> anyhow::Result<ExitCode> {
    let inv = if args.refresh {
        inventory::refresh(&config.inventory, &config.state_dir, &config.nvml)?
    } else {
        inventory::load(&config.inventory, &config.state_dir, &config.nvml)?
    };
    if args.json {
        outln!("{:#}", report::inventory_json(&inv))?;
    } else {
        out!("{}", report::inventory_table(&inv))?;
    }
    Ok(ExitCode::SUCCESS)
}
