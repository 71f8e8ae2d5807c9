//! `gpupin pick`: what a request would get now, without allocating. For scripts, and for
//! seeing what a policy does.

use gpupin::config::Config;
use gpupin::grant;
use gpupin::ledger::Ledger;
use gpupin::request::{self, Origin};
use serde_json::json;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct PickArgs {
    /// How many GPUs: a positive integer or "all"
    #[arg(long)]
    pub count: Option<String>,
    /// GPUs by index, UUID or PCI bus id, comma-separated (instead of --count)
    #[arg(long)]
    pub devices: Option<String>,
    /// Selection policy (default: the configured one)
    #[arg(long)]
    pub policy: Option<String>,
    /// Only GPUs with at least this much (free) memory, e.g. 40GiB
    #[arg(long)]
    pub memory: Option<String>,
    /// Only GPUs whose name contains this, ignoring case, e.g. H100
    #[arg(long)]
    pub model: Option<String>,
    /// exclusive (default) or shared
    #[arg(long)]
    pub share: Option<String>,
    /// Memory a shared holder reserves per GPU, e.g. 20GiB
    #[arg(long)]
    pub reserve: Option<String>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

impl PickArgs {
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("gpupin.count", &self.count),
            ("gpupin.devices", &self.devices),
            ("gpupin.policy", &self.policy),
            ("gpupin.memory", &self.memory),
            ("gpupin.model", &self.model),
            ("gpupin.share", &self.share),
            ("gpupin.reserve", &self.reserve),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }
}

pub fn run(config: &Config, args: &PickArgs) -> anyhow::Result<ExitCode> {
    let request = request::from_pairs(&args.pairs(), Origin::Cli)?
        .ok_or_else(|| anyhow::anyhow!("give --count or --devices"))?;
    let (inventory, live) = grant::load_machine(config, &request)?;
    let machine = grant::machine(config, &inventory, live.as_deref());
    let uuids = Ledger::read_only_for_config(config)?.preview(&request, &machine)?;
    let gpus: Vec<_> = uuids
        .iter()
        .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
        .collect();
    let policy = request.policy.unwrap_or(config.policy);
    if args.json {
        let list: Vec<_> = gpus
            .iter()
            .map(|g| json!({"index": g.index, "uuid": g.uuid, "name": g.name}))
            .collect();
        outln!("{:#}", json!({"policy": policy.as_str(), "gpus": list}))?;
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
    }
    Ok(ExitCode::SUCCESS)
}
