//! `gpupin hold ID --devices LIST`: GPUs set aside without a container, for a Slurm prolog
//! or an administrator, for as long as a process lives or until `gpupin release ID`.

use gpupin::config::Config;
use gpupin::hold::{self, Hold};
use gpupin::ledger::HolderId;
use gpupin::serve::{Client, Request};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct HoldArgs {
    /// The holder id, e.g. slurm-$SLURM_JOB_ID or maintenance-gpu7
    pub id: String,
    /// GPUs by index, UUID or PCI bus id, comma-separated
    #[arg(long, required = true)]
    pub devices: String,
    /// --devices are device minors (/dev/nvidia<N>), as Slurm's gres.conf File= order gives
    #[arg(long)]
    pub by_minor: bool,
    /// Whose hold it is (root only) [default: you]
    #[arg(long)]
    pub user: Option<String>,
    /// Hold while this process lives
    #[arg(long, conflicts_with = "until_release")]
    pub pid: Option<i32>,
    /// Hold until `gpupin release ID` (root only)
    #[arg(long)]
    pub until_release: bool,
    /// Take the GPUs from this holder's instead of the free pool
    #[arg(long, value_name = "ID")]
    pub within: Option<String>,
}

pub fn run(config: &Config, args: &HoldArgs) -> anyhow::Result<ExitCode> {
    let euid = rustix::process::geteuid().as_raw();
    let (id, gpus) = if euid == 0 {
        let owner = match &args.user {
            Some(user) => gpupin::users::owner_named(user)?,
            None => gpupin::users::owner_of(euid)?,
        };
        let spec = Hold {
            id: HolderId::new(&args.id)?,
            devices: args.devices.clone(),
            by_minor: args.by_minor,
            pid: args.pid,
            until_release: args.until_release,
            owner,
            limited: false,
            within: args.within.clone(),
        };
        let record = hold::hold(config, &spec, "cli")?;
        let indices: Vec<String> = record.indices.iter().map(u32::to_string).collect();
        (record.id, indices)
    } else {
        let reply = Client::connect(&config.socket_path())?.ask(&Request::Hold {
            id: args.id.clone(),
            devices: args.devices.clone(),
            by_minor: args.by_minor,
            pid: args.pid,
            until_release: args.until_release,
            user: args.user.clone(),
            within: args.within.clone(),
        })?;
        let indices = reply
            .gpus
            .iter()
            .map(|g| g.index.map_or(g.uuid.clone(), |i| i.to_string()))
            .collect();
        (reply.holder.unwrap_or_default(), indices)
    };
    let until = match args.pid {
        Some(pid) => format!("while pid {pid} runs"),
        None => "until released".to_string(),
    };
    outln!(
        "{id} holds GPU{} {} {until}",
        if gpus.len() == 1 { "" } else { "s" },
        gpus.join(",")
    )?;
    Ok(ExitCode::SUCCESS)
}
