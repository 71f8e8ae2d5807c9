//! `gpupin pick`: what a request would get now, without allocating, for the caller: what
//! their `gpupin exec` would get (their limits and groups' GPUs apply). For scripts, and
//! for seeing what a policy does.

use super::request_args::RequestArgs;
use gpupin::command::{Config, Ledger, Origin, explain, grant, request};
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
    // A what-if: instances an import left without GI and CI ids count as they would.
    let machine = gpupin::command::Machine {
        what_if: true,
        ..grant::machine(config, &loaded)
    };
    // What the caller's own `gpupin exec` would get: their limits and groups apply.
    let asker = gpupin::command::owner_of(rustix::process::getuid().as_raw()).ok();
    let preview = Ledger::open_read_only(&config.ledger_settings())?.preview_from(
        &request,
        &machine,
        asker.as_ref(),
    )?;
    let inventory = &loaded.inventory;
    // The GPUs out of allocation, for --explain (the preview refused any it named).
    let fences = match args.explain {
        true => Ledger::open_read_only(&config.ledger_settings())?.fences()?,
        false => Default::default(),
    };
    let gpus: Vec<_> = preview
        .uuids
        .iter()
        .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
        .collect();
    // MIG instances, by address (`0:2`) and profile, after the whole GPUs.
    let instances: Vec<_> = preview
        .uuids
        .iter()
        .filter_map(|u| inventory.mig_instances().find(|m| &m.uuid == u))
        .collect();
    let policy = request.policy.unwrap_or(config.policy);
    let why = args
        .explain
        .then(|| explain::why(&request, policy, inventory, &preview.free));
    if args.json {
        let list: Vec<_> = gpus
            .iter()
            .map(|g| json!({"index": g.index, "uuid": g.uuid, "name": g.name}))
            .chain(instances.iter().map(|m| {
                json!({"index": m.parent_index, "instance": m.address(), "uuid": m.uuid, "profile": m.profile})
            }))
            .collect();
        let mut out = json!({"policy": policy.as_str(), "gpus": list});
        if let Some(why) = &why {
            out["explain"] = explain::json(why, inventory);
            out["fenced"] = serde_json::to_value(&fences.gpus)?;
        }
        outln!("{out:#}")?;
    } else {
        let names: Vec<String> = gpus
            .iter()
            .map(|g| g.index.to_string())
            .chain(instances.iter().map(|m| m.address()))
            .collect();
        let unit = match (gpus.is_empty(), instances.is_empty()) {
            (true, false) => "MIG instance",
            _ => "GPU",
        };
        outln!(
            "{policy} would pick {unit}{} {}",
            if names.len() == 1 { "" } else { "s" },
            names.join(",")
        )?;
        for g in gpus {
            outln!("  {}  {}  {}", g.index, g.uuid, g.name)?;
        }
        for m in instances {
            outln!("  {}  {}  MIG {}", m.address(), m.uuid, m.profile_name())?;
        }
        if let Some(why) = &why {
            out!("{}", explain::table(why, inventory))?;
            // What no policy may choose from, and why.
            for fence in &fences.gpus {
                outln!("not chosen from: {} {}", fence.named(), fence.why())?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
