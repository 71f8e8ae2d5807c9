//! `gpupin pick`: what a request would get now, without allocating. For scripts, and for
//! seeing what a policy does.

use super::explain;
use super::request_args::RequestArgs;
use gpupin::admission::grant;
use gpupin::input::config::Config;
use gpupin::input::request::{self, Origin};
use gpupin::state::ledger::Ledger;
use serde_json::json;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct PickArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Show why: the ranking terms of the chosen GPUs and of the runner-up (topology)
    #[arg(long)]
    pub explain: bool,
}

pub fn run(config: &Config, args: &PickArgs) -> anyhow::Result<ExitCode> {
    let request = request::from_pairs(&args.request.pairs(), Origin::Cli)?
        .ok_or_else(|| anyhow::anyhow!("give --count or --devices"))?;
    let loaded = grant::load_machine(config, &request)?;
    let machine = grant::machine(config, &loaded);
    let preview = Ledger::read_only_for_config(config)?.preview_from(&request, &machine)?;
    let inventory = &loaded.inventory;
    let gpus: Vec<_> = preview
        .uuids
        .iter()
        .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
        .collect();
    let policy = request.policy.unwrap_or(config.policy);
    let why = args
        .explain
        .then(|| explain::why(&request, policy, inventory, &preview.free));
    if args.json {
        let list: Vec<_> = gpus
            .iter()
            .map(|g| json!({"index": g.index, "uuid": g.uuid, "name": g.name}))
            .collect();
        let mut out = json!({"policy": policy.as_str(), "gpus": list});
        if let Some(why) = &why {
            out["explain"] = explain::json(why, inventory);
        }
        outln!("{out:#}")?;
    } else {
        let indices: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
        outln!(
            "{policy} would pick GPU{} {}",
            if gpus.len() == 1 { "" } else { "s" },
            indices.join(",")
        )?;
        for g in gpus {
            outln!("  {}  {}  {}", g.index, g.uuid, g.name)?;
        }
        if let Some(why) = &why {
            out!("{}", explain::table(why, inventory))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
