//! `gpupin reset GPU...`: an admin resets GPUs with NVIDIA's `nvidia-smi --gpu-reset`, and
//! those whose health had fenced them are handed out again. Nobody may hold a GPU being
//! reset (the reset ends their work): such a GPU is refused, and a drain keeps new
//! requests off it meanwhile. The driver resets no GPU that any process has open, NVML's
//! clients included, so `gpupin serve`'s health watch is paused for it.

use crate::base::command::{RunError, run_within};
use crate::host::inventory::InventoryError;
use crate::input::config::Config;
use crate::jobs::drain::DrainError;
use crate::jobs::serve::{Client, ClientError, Request};
use crate::model::fence::{Fence, FenceState};
use crate::model::gpu::Gpu;
use crate::state::ledger::{Ledger, LedgerError, RESETTING, Record, ResetEnd};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long one GPU's reset may take before nvidia-smi is killed.
const RESET_TIMEOUT: Duration = Duration::from_secs(120);

/// How long `gpupin serve` keeps its health watch paused at most, should this command
/// die before it resumes it.
const PAUSE: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResetError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Named(DrainError),
    #[error(
        "cannot reset GPU {gpu}: {holders} still {has} it, and a reset ends their work; wait for them (gpupin drain {gpu} --wait) or gpupin evict them first"
    )]
    Held {
        gpu: u32,
        holders: String,
        has: &'static str,
    },
    #[error(
        "cannot reset GPU {gpu}: it is in MIG mode with instances, which a reset destroys; reset it with nvidia-smi --gpu-reset -i {uuid}, create its instances again, then gpupin undrain {gpu}"
    )]
    MigInstances { gpu: u32, uuid: String },
    #[error(
        "{key:?} is a MIG instance: gpupin reset takes whole GPUs, and a reset is its GPU's (GPU {gpu})"
    )]
    MigInstanceNamed { key: String, gpu: u32 },
    #[error("cannot pause gpupin serve's GPU health watch for the reset: {0}")]
    Pause(String),
    #[error(
        "cannot reset GPU {gpu}: {by}'s gpupin reset is resetting it now; if none runs, gpupin undrain {gpu} ends that"
    )]
    Resetting { gpu: u32, by: String },
}

/// What became of one GPU.
#[derive(Debug)]
pub struct Outcome {
    pub index: u32,
    pub uuid: String,
    /// The reset went through: the health fence it cleared, if any. Else nvidia-smi's
    /// one line of why not.
    pub result: Result<Option<Fence>, String>,
    /// An admin's drain that stays after the reset.
    pub still_drained: Option<Fence>,
}

/// Resets the GPUs `keys` name with `nvidia_smi`, as `by`.
pub fn reset(
    config: &Config,
    keys: &[String],
    by: &str,
    nvidia_smi: &Path,
) -> Result<Vec<Outcome>, ResetError> {
    let inventory = config.load_inventory()?;
    let gpus = crate::jobs::drain::named(&inventory, keys).map_err(|e| match e {
        // drain's words for it would send the admin to drain.
        DrainError::MigInstance { key, gpu } => ResetError::MigInstanceNamed { key, gpu },
        other => ResetError::Named(other),
    })?;
    if let Some(gpu) = gpus.iter().find(|g| !g.mig_instances().is_empty()) {
        return Err(ResetError::MigInstances {
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
        });
    }
    let ledger = crate::state::open_ledger(config)?;
    let before = ledger.begin_reset(&gpus, by)?;
    let give_back = |ledger: &Ledger| {
        for (gpu, had) in gpus.iter().zip(&before) {
            let _ = ledger.end_reset(gpu, had.as_ref(), ResetEnd::NotRun, by);
        }
    };
    let refused = match already_resetting(&gpus, &before) {
        Some(error) => Err(error),
        None => refuse_held(&ledger, &gpus),
    };
    if let Err(error) = refused {
        give_back(&ledger);
        return Err(error);
    }
    let paused = match pause_health(config) {
        Ok(paused) => paused,
        Err(error) => {
            give_back(&ledger);
            return Err(error);
        }
    };
    let results: Vec<Result<(), String>> = gpus.iter().map(|g| run_reset(nvidia_smi, g)).collect();
    if paused {
        // A resume that fails leaves the watch paused until the pause runs out (PAUSE).
        let resumed = Client::connect(&config.client_socket())
            .and_then(|mut client| client.ask(&Request::ResumeHealth));
        if let Err(error) = resumed {
            tracing::warn!(error = %error, "could not resume the GPU health watch; it resumes by itself");
        }
    }
    let mut outcomes = Vec::new();
    for ((gpu, had), result) in gpus.iter().zip(&before).zip(results) {
        let end = match &result {
            Ok(()) => ResetEnd::Done,
            Err(why) => ResetEnd::Failed(why),
        };
        let cleared = ledger.end_reset(gpu, had.as_ref(), end, by)?;
        outcomes.push(Outcome {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            still_drained: had
                .as_ref()
                .filter(|f| f.state == FenceState::Drained)
                .cloned(),
            result: result.map(|()| cleared),
        });
    }
    Ok(outcomes)
}

/// Refuses a GPU another `gpupin reset` is resetting now (its drain says so).
fn already_resetting(gpus: &[&Gpu], before: &[Option<Fence>]) -> Option<ResetError> {
    gpus.iter().zip(before).find_map(|(gpu, had)| {
        let had = had.as_ref()?;
        (had.state == FenceState::Drained && had.reason == RESETTING).then(|| {
            ResetError::Resetting {
                gpu: gpu.index,
                by: had.by.clone(),
            }
        })
    })
}

/// Refuses a GPU that someone holds: the reset would end their work.
fn refuse_held(ledger: &Ledger, gpus: &[&Gpu]) -> Result<(), ResetError> {
    // The ledger read once for all of them.
    let live = ledger.holders_of_gpus(gpus)?;
    for gpu in gpus {
        let holders: Vec<&Record> = live
            .iter()
            .filter(|r| r.gpus.iter().any(|u| gpu.uuids().any(|own| own == u)))
            .collect();
        if !holders.is_empty() {
            return Err(ResetError::Held {
                gpu: gpu.index,
                holders: holders
                    .iter()
                    .map(|r| r.shown_name())
                    .collect::<Vec<_>>()
                    .join(", "),
                has: if holders.len() == 1 { "holds" } else { "hold" },
            });
        }
    }
    Ok(())
}

/// Pauses `gpupin serve`'s health watch; whether it did (`false` where no daemon
/// answers: none runs, so nothing of gpupin's has NVML open).
fn pause_health(config: &Config) -> Result<bool, ResetError> {
    let mut client = match Client::connect(&config.client_socket()) {
        Ok(client) => client,
        Err(ClientError::Connect { .. }) => return Ok(false),
        Err(error) => return Err(ResetError::Pause(crate::base::message::one_line(&error))),
    };
    client
        .ask(&Request::PauseHealth {
            secs: PAUSE.as_secs(),
        })
        .map_err(|e| ResetError::Pause(crate::base::message::one_line(&e)))?;
    Ok(true)
}

/// `nvidia-smi --gpu-reset -i UUID`; its one line of why not.
fn run_reset(nvidia_smi: &Path, gpu: &Gpu) -> Result<(), String> {
    let mut command = Command::new(nvidia_smi);
    command.args(["--gpu-reset", "-i", &gpu.uuid]);
    match run_within(&mut command, RESET_TIMEOUT) {
        Ok(ran) if ran.status.success() => Ok(()),
        // nvidia-smi heads its refusal (`The following GPUs could not be reset:`) and
        // names the GPU and why on the next line.
        Ok(ran) => Err(format!("{} ({})", ran.said(2), ran.status)),
        Err(error @ RunError::Start(_)) => Err(format!("{}: {error}", nvidia_smi.display())),
        Err(error @ RunError::Timeout(_)) => Err(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fence::FenceTarget;

    /// A GPU another reset drained for itself is refused; an admin's drain or a health
    /// fence is not (those GPUs are what a reset is for).
    #[test]
    fn a_gpu_another_reset_is_resetting_is_refused() {
        let inv = crate::policy::testing::machine(2);
        let gpus: Vec<&Gpu> = inv.gpus.iter().collect();
        let fence =
            |reason: &str, state| Some(FenceTarget::from(gpus[1]).fence(state, reason, "bob", 1));
        let err = already_resetting(&gpus, &[None, fence(RESETTING, FenceState::Drained)]).unwrap();
        assert_eq!(
            err.to_string(),
            "cannot reset GPU 1: bob's gpupin reset is resetting it now; if none runs, gpupin undrain 1 ends that"
        );
        assert!(
            already_resetting(&gpus, &[None, fence("fan swap", FenceState::Drained)]).is_none()
        );
        assert!(
            already_resetting(&gpus, &[None, fence(RESETTING, FenceState::NeedsReset)]).is_none()
        );
        assert!(already_resetting(&gpus, &[None, None]).is_none());
    }

    /// A MIG instance named is refused in reset's words, not drain's, changing nothing.
    #[test]
    fn a_mig_instance_named_is_refused_in_one_line() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            inventory: "sim:dgxa100mig".parse().unwrap(),
            ..crate::input::config::testing::sim8_in(tmp.path())
        };
        let err = reset(&config, &["0:1".into()], "root", Path::new("/bin/false")).unwrap_err();
        assert_eq!(
            crate::base::message::one_line(&err),
            "\"0:1\" is a MIG instance: gpupin reset takes whole GPUs, and a reset is its GPU's (GPU 0)"
        );
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert!(ledger.fences().unwrap().is_empty());
    }
}
