//! `gpupin inventory`: the machine's GPUs and links, as gpupin sees them; `gpupin
//! inventory import`: an inventory file from what `nvidia-smi` prints.

use anyhow::Context;
use gpupin::command::{
    Config, Durability, Links, atomic, inventory, inventory_json, inventory_table, safe_open,
};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct InventoryArgs {
    #[command(subcommand)]
    pub action: Option<InventoryAction>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Probe the hardware again and rewrite the cached inventory
    #[arg(long)]
    pub refresh: bool,
}

#[derive(clap::Subcommand)]
pub enum InventoryAction {
    /// Write an inventory file from the text of `nvidia-smi topo -m` (and a GPU list), to model a machine and what-if with `gpupin pick`
    Import(ImportArgs),
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The output of `nvidia-smi topo -m`, or - for stdin
    #[arg(value_name = "FILE")]
    pub topo: PathBuf,
    /// The output of `nvidia-smi -L`, or of `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv`
    #[arg(long, value_name = "FILE")]
    pub gpus: Option<PathBuf>,
    /// Write the inventory file here (a new file gets mode 0644) instead of to stdout
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(config: &Config, args: &InventoryArgs) -> anyhow::Result<ExitCode> {
    let inv = if args.refresh {
        config.refresh_inventory()?
    } else {
        config.load_inventory()?
    };
    if args.json {
        outln!("{:#}", inventory_json(&inv))?;
    } else {
        out!("{}", inventory_table(&inv))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A subcommand of `gpupin inventory`; none needs the configuration.
pub fn run_action(action: &InventoryAction) -> anyhow::Result<ExitCode> {
    match action {
        InventoryAction::Import(args) => import(args),
    }
}

fn import(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    let topo = read(&args.topo)?;
    let list = args.gpus.as_deref().map(read).transpose()?;
    let inv = inventory::import::import(&topo, list.as_deref(), &args.topo)
        .with_context(|| format!("importing {}", args.topo.display()))?;
    let json = inventory::to_json(&inv) + "\n";
    match &args.output {
        Some(path) => atomic::write(path, json.as_bytes(), 0o644, Durability::Synced)?,
        None => out!("{json}")?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A file the user named (a link is followed, a FIFO refused), or stdin for `-`.
fn read(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading stdin")?;
        return Ok(text);
    }
    safe_open::read_to_string(path, Links::Follow)
        .with_context(|| format!("reading {}", path.display()))
}
