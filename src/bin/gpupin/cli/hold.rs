//! `gpupin hold ID --devices LIST`: GPUs set aside without a container, for a Slurm prolog
//! or an administrator, for as long as a process lives or until `gpupin release ID`.

use super::route::Route;
use anyhow::Context;
use gpupin::command::{Client, Config, HoldOwner, HoldRequest, Request, hold, slurm};
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true).args(["devices", "count", "mig"])))]
pub struct HoldArgs {
    /// The holder id, e.g. slurm-$SLURM_JOB_ID or maintenance-gpu7
    pub id: String,
    /// GPUs by index, UUID or PCI bus id, comma-separated
    #[arg(long)]
    pub devices: Option<String>,
    /// How many GPUs, chosen by the policy as for a container (--gpus is the same)
    #[arg(long, visible_alias = "gpus", conflicts_with_all = ["devices", "by_minor", "by_slurm_index"], value_parser = super::flag::positive())]
    pub count: Option<u32>,
    /// MIG instances of this profile (e.g. 1g.10gb), or "any"; --count says how many
    #[arg(long, conflicts_with_all = ["devices", "by_minor", "by_slurm_index"])]
    pub mig: Option<String>,
    /// Why the GPUs are held: shown in gpupin status and written to the audit log
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Wait up to this long for the GPUs, in the queue with every container, e.g. 10m (a
    /// busy GPU drained for maintenance: the hold takes it once its holder ends)
    #[arg(long, value_name = "DURATION", value_parser = super::flag::wait())]
    pub wait: Option<std::time::Duration>,
    /// End the hold by itself after this long (2h, 30m); gc and the next allocation
    /// release it then. Without --pid, root only, as --until-release
    #[arg(long = "for", value_name = "DURATION", value_parser = super::flag::hold_for())]
    pub for_: Option<u64>,
    /// --devices are device minors (/dev/nvidia<N>)
    #[arg(long)]
    pub by_minor: bool,
    /// --devices are Slurm's GPU numbers ($SLURM_JOB_GPUS): positions in gres.conf's File=
    /// list for this node (gres.conf beside $SLURM_CONF; node $SLURMD_NODENAME, else the
    /// short host name)
    #[arg(long, conflicts_with = "by_minor")]
    pub by_slurm_index: bool,
    /// Whose hold it is (root only) [default: you]
    #[arg(long, value_hint = clap::ValueHint::Username)]
    pub user: Option<String>,
    /// Hold while this process lives
    #[arg(long, conflicts_with = "until_release")]
    pub pid: Option<i32>,
    /// Hold until `gpupin release ID` (root only)
    #[arg(long)]
    pub until_release: bool,
    #[command(flatten)]
    pub within: super::within::WithinArgs,
}

pub fn run(config: &Config, args: &HoldArgs) -> anyhow::Result<ExitCode> {
    let listed = args.devices.clone().unwrap_or_default();
    let (devices, by_minor) = match args.by_slurm_index {
        true => (slurm_minors(&listed)?, true),
        false => (listed, args.by_minor),
    };
    let asked = HoldRequest {
        id: args.id.clone(),
        devices,
        by_minor,
        pid: args.pid,
        until_release: args.until_release,
        user: args.user.clone(),
        within: args.within.resolve()?,
        count: args.count,
        mig: args.mig.clone(),
        reason: args.reason.clone(),
        for_secs: args.for_,
        request: Vec::new(),
        wait: args.wait,
    };
    let (id, gpus) = match Route::of_this_process() {
        Route::Local => as_root(config, asked)?,
        Route::Daemon => through_daemon(config, asked)?,
    };
    let until = match (args.pid, args.for_) {
        (Some(pid), None) => format!("while pid {pid} runs"),
        (Some(pid), Some(d)) => format!(
            "while pid {pid} runs, for {} at most",
            humantime::format_duration(std::time::Duration::from_secs(d))
        ),
        (None, Some(d)) => format!(
            "for {}, or until released",
            humantime::format_duration(std::time::Duration::from_secs(d))
        ),
        (None, None) => "until released".to_string(),
    };
    outln!(
        "{id} holds GPU{} {} {until}",
        if gpus.len() == 1 { "" } else { "s" },
        gpus.join(",")
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Root's hold, in the ledger: for itself or the user it names, no limits.
fn as_root(config: &Config, asked: HoldRequest) -> anyhow::Result<(String, Vec<String>)> {
    let owner = match &asked.user {
        Some(user) => gpupin::command::owner_named(user)?,
        None => gpupin::command::owner_of(0)?,
    };
    let whose = HoldOwner {
        owner,
        limited: false,
    };
    let record = hold::hold(config, &asked, &whose, "cli")?;
    // A MIG instance by its UUID: its index is its GPU's.
    let indices: Vec<String> = record
        .gpus
        .iter()
        .zip(&record.indices)
        .map(|(uuid, i)| match uuid.starts_with("MIG-") {
            true => uuid.clone(),
            false => i.to_string(),
        })
        .collect();
    Ok((record.id, indices))
}

/// A user's hold, through gpupin serve.
fn through_daemon(config: &Config, asked: HoldRequest) -> anyhow::Result<(String, Vec<String>)> {
    // gpupin serve takes a wait only among request keys, which stand for devices, count
    // and mig.
    let asked = match asked.wait {
        None => asked,
        Some(_) if asked.by_minor => anyhow::bail!(
            "--wait with --by-minor or --by-slurm-index is root's (a Slurm prolog runs as root); give --devices as GPU indices or UUIDs"
        ),
        Some(wait) => HoldRequest {
            request: wait_request(&asked, wait),
            devices: String::new(),
            count: None,
            mig: None,
            wait: None,
            ..asked
        },
    };
    let reply = Client::connect(&config.client_socket())?.ask(&Request::Hold(asked))?;
    let indices = reply
        .gpus
        .iter()
        .map(|g| match (g.index, g.uuid.starts_with("MIG-")) {
            (Some(i), false) => i.to_string(),
            _ => g.uuid.clone(),
        })
        .collect();
    Ok((reply.holder.unwrap_or_default(), indices))
}

/// `--devices`, `--count` or `--mig` and `--wait` as the request keys gpupin serve reads.
fn wait_request(asked: &HoldRequest, wait: std::time::Duration) -> Vec<(String, String)> {
    use gpupin::command::Key;
    let mut pairs = Vec::new();
    let mut add = |key: Key, value: String| pairs.push((key.as_str().to_string(), value));
    if !asked.devices.trim().is_empty() {
        add(Key::Devices, asked.devices.clone());
    }
    if let Some(mig) = &asked.mig {
        add(Key::Mig, mig.clone());
    }
    if asked.count.is_some() || asked.mig.is_some() {
        add(Key::Count, asked.count.unwrap_or(1).to_string());
    }
    add(Key::Wait, humantime::format_duration(wait).to_string());
    pairs
}

/// Slurm's GPU numbers as device minors, read where slurmd reads them: gres.conf beside
/// the slurm.conf a prolog's `SLURM_CONF` names, for the node `SLURMD_NODENAME` names.
fn slurm_minors(numbers: &str) -> anyhow::Result<String> {
    let slurm_conf = std::env::var_os("SLURM_CONF").filter(|v| !v.is_empty());
    let gres_conf = slurm::gres_conf_path(slurm_conf.as_deref().map(std::path::Path::new));
    let node = match std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|v| !v.is_empty())
    {
        Some(node) => node,
        None => slurm::short_hostname().context("reading this host's name")?,
    };
    // A MIG instance (a MultipleFiles= line) as `gpu/cap/cap`, which --by-minor takes.
    let units = slurm::units(&gres_conf, &node, numbers)?;
    Ok(units
        .iter()
        .map(slurm::SlurmUnit::key)
        .collect::<Vec<_>>()
        .join(","))
}
