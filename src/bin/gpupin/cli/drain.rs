//! `gpupin drain GPU... --reason TEXT [--wait]`, `gpupin undrain GPU...` and `gpupin
//! reset GPU...`: root takes whole GPUs out of allocation for maintenance and puts them
//! back (`gpupin::command::drain`), and resets them (`gpupin::command::reset`). New
//! requests skip a drained GPU at once; its holders keep it until they end; `--wait`
//! returns when none has it any more.

use gpupin::command::{Config, Record, drain, reset};
use std::process::ExitCode;
use std::time::Duration;

/// How often `--wait` looks whether the drained GPUs' holders have ended.
const WAIT_POLL: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct DrainArgs {
    /// The GPUs, by index, UUID or PCI bus id
    #[arg(value_name = "GPU", required = true)]
    pub gpus: Vec<String>,
    /// Why, in one line (at most 200 characters): `gpupin status`, refusals and the
    /// audit log show it
    #[arg(long, value_name = "TEXT", required = true)]
    pub reason: String,
    /// Return only once no holder has the GPUs any more (they stay drained either way)
    #[arg(long)]
    pub wait: bool,
}

#[derive(clap::Args)]
pub struct UndrainArgs {
    /// The GPUs, by index, UUID or PCI bus id (a GPU's MIG instances come back with it),
    /// or a MIG instance its health took out alone (0:1, MIG-...)
    #[arg(value_name = "GPU", required = true)]
    pub gpus: Vec<String>,
}

#[derive(clap::Args)]
pub struct ResetArgs {
    /// The GPUs, by index, UUID or PCI bus id
    #[arg(value_name = "GPU", required = true)]
    pub gpus: Vec<String>,
    /// nvidia-smi: a path, or a name looked up on PATH
    #[arg(long, value_name = "PROGRAM", default_value = "nvidia-smi")]
    pub nvidia_smi: std::path::PathBuf,
}

/// What every user may get changes: root only (sudo keeps who asked in the trail).
fn as_root(command: &str) -> anyhow::Result<()> {
    if !rustix::process::geteuid().is_root() {
        anyhow::bail!(
            "gpupin {command} changes which GPUs everyone may get: run it as root (sudo gpupin {command} ...)"
        );
    }
    Ok(())
}

pub fn run_drain(config: &Config, args: &DrainArgs) -> anyhow::Result<ExitCode> {
    as_root("drain")?;
    let by = super::release::operator();
    let drained = drain::drain(config, &args.gpus, &args.reason, &by)?;
    for fence in &drained.fences {
        outln!(
            "drained GPU {} ({}): {}",
            fence.index,
            fence.uuid,
            fence.reason
        )?;
    }
    if drained.holders.is_empty() {
        outln!("no holder has it: nothing is handed out on it from now")?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "new requests skip it; {} keep{} it until {} end{}",
        names(&drained.holders),
        if drained.holders.len() == 1 { "s" } else { "" },
        if drained.holders.len() == 1 {
            "it"
        } else {
            "they"
        },
        if drained.holders.len() == 1 { "s" } else { "" },
    )?;
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let mut left = drained.holders;
    while !left.is_empty() {
        std::thread::sleep(WAIT_POLL);
        let now = drain::holders(config, &args.gpus)?;
        if now.len() < left.len() {
            let gone: Vec<&Record> = left
                .iter()
                .filter(|r| !now.iter().any(|n| n.id == r.id))
                .collect();
            for record in gone {
                outln!("{} ended", record.shown_name())?;
            }
        }
        left = now;
    }
    outln!("no holder has it any more: it is free and drained")?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_undrain(config: &Config, args: &UndrainArgs) -> anyhow::Result<ExitCode> {
    as_root("undrain")?;
    let by = super::release::operator();
    let undrained = drain::undrain(config, &args.gpus, &by)?;
    for fence in &undrained.cleared {
        outln!(
            "undrained {} (was {} by {}: {}): it is handed out again",
            fence.named(),
            fence.state.as_str(),
            fence.by,
            fence.reason
        )?;
    }
    for address in &undrained.not_fenced {
        match address.contains(':') {
            true => outln!("MIG instance {address} was not out of allocation")?,
            false => outln!("GPU {address} was not drained")?,
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `train-1 (alice), web`: holders as status names them.
fn names(records: &[Record]) -> String {
    records
        .iter()
        .map(|r| match &r.owner {
            Some(owner) => format!("{} ({})", r.shown_name(), owner.user),
            None => r.shown_name().to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn run_reset(config: &Config, args: &ResetArgs) -> anyhow::Result<ExitCode> {
    as_root("reset")?;
    let by = super::release::operator();
    let outcomes = reset::reset(config, &args.gpus, &by, &args.nvidia_smi)?;
    let mut failed = false;
    for o in &outcomes {
        match (&o.result, &o.still_drained) {
            (Err(why), _) => {
                failed = true;
                eprintln!(
                    "gpupin: could not reset GPU {} ({}): {why}",
                    o.index, o.uuid
                );
            }
            (Ok(_), Some(drain)) => outln!(
                "reset GPU {} ({}); it stays drained by {}: {} (gpupin undrain {} hands it out)",
                o.index,
                o.uuid,
                drain.by,
                drain.reason,
                o.index
            )?,
            (Ok(Some(was)), None) => outln!(
                "reset GPU {} ({}) (was {}: {}): it is handed out again",
                o.index,
                o.uuid,
                was.state.as_str(),
                was.reason
            )?,
            (Ok(None), None) => outln!("reset GPU {} ({})", o.index, o.uuid)?,
        }
    }
    Ok(match failed {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    })
}
