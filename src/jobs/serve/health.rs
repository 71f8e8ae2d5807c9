//! The daemon's watch of the GPUs' health, where the inventory comes from NVML and
//! `[health] watch` is on: NVML's XID and double-bit ECC events as they come, and every
//! `[health] poll` the conditions that hold until a reset (`host::inventory::nvml_health`).
//! What each means is `model::health`'s; here it becomes a fence in the ledger (the GPU
//! goes to no one until the reset or reboot, its holders keep it and are told through
//! the audit log, status, the metrics and their alerts) or an audit line.

use super::health_pause::HealthPause;
use crate::base::message::one_line;
use crate::host::inventory::InventoryError;
use crate::host::inventory::nvml_health::{self, HealthSink};
use crate::input::config::Config;
use crate::input::config::inventory::InventorySource;
use crate::jobs::evict::Evictor;
use crate::model::fence::{Fence, FenceTarget};
use crate::model::gpu::{Gpu, Inventory};
use crate::model::health::{Action, Signal, judge};
use crate::state::ledger::lookup::Match;
use crate::state::ledger::{HEALTH_BY, Ledger};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How long a holder evicted for its GPU's health may take to stop before it is killed.
const EVICT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Watches until `stopping`, with the config `config` gives at each event (a reload
/// changes the XID actions from the next event on). Never fails: what cannot be watched
/// is logged once.
///
/// While `pause` says so (`gpupin reset`), the watch lets go of NVML and takes it again
/// after.
pub(super) fn watch(config: impl Fn() -> Arc<Config>, stopping: &AtomicBool, pause: &HealthPause) {
    let now = config();
    let nvml = match now.inventory {
        InventorySource::Nvml | InventorySource::Auto => now.health.watch,
        _ => false,
    };
    if !nvml {
        return;
    }
    let inventory = match now.load_inventory() {
        Ok(inventory) if crate::host::inventory::from_nvml(&inventory) => inventory,
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(error = %one_line(&error), "GPU health is not watched: no inventory");
            return;
        }
    };
    let mut sink = Sink {
        config,
        inventory,
        slowed: HashMap::new(),
    };
    while !stopping.load(Ordering::SeqCst) {
        if pause.paused() {
            std::thread::sleep(PAUSED_LOOK);
            continue;
        }
        pause.holding(true);
        let ends = || stopping.load(Ordering::SeqCst) || pause.paused();
        let watched = nvml_health::watch(now.health.poll, &mut sink, &ends);
        pause.holding(false);
        match watched {
            Ok(()) if pause.paused() => tracing::info!("GPU health watch paused for a reset"),
            Ok(()) => {}
            Err(error @ InventoryError::NvmlUnavailable { .. }) => {
                tracing::info!(error = %one_line(&error), "GPU health is not watched");
                return;
            }
            Err(error) => {
                tracing::warn!(error = %one_line(&error), "GPU health watch ended");
                return;
            }
        }
    }
}

/// How often a paused watch looks whether its pause is over.
const PAUSED_LOOK: std::time::Duration = std::time::Duration::from_millis(200);

struct Sink<F> {
    config: F,
    inventory: Inventory,
    /// The slowdowns each GPU had at the last poll: only a change is told.
    slowed: HashMap<String, Vec<&'static str>>,
}

impl<F: Fn() -> Arc<Config>> Sink<F> {
    fn gpu(&self, uuid: &str) -> Option<&Gpu> {
        self.inventory.gpus.iter().find(|g| g.uuid == uuid)
    }

    fn ledger(&self) -> Option<Ledger> {
        crate::state::open_ledger(&(self.config)())
            .inspect_err(|error| tracing::warn!(error = %one_line(error), "cannot open the ledger for a GPU health event"))
            .ok()
    }

    /// What an event on the GPU with `uuid` blames: the MIG instance of GPU instance
    /// `gpu_instance` where the driver names one the inventory has, else the GPU.
    fn target<'g>(gpu: &'g Gpu, gpu_instance: Option<u32>) -> FenceTarget<'g> {
        let instance = gpu_instance.and_then(|gi| {
            gpu.mig_instances()
                .iter()
                .find(|m| m.access.is_some_and(|a| a.gi == gi))
        });
        match instance {
            Some(m) => m.into(),
            None => gpu.into(),
        }
    }

    /// Under `[health] evict = true`, the holders of what was just fenced (a GPU with its
    /// MIG instances, or one instance) are evicted as `gpupin evict` does (grace
    /// `EVICT_GRACE`), saying why; otherwise they are only told.
    fn evict_holders(&self, ledger: &Ledger, fence: &Fence) {
        let config = (self.config)();
        if !config.health.evict {
            return;
        }
        let holders = match (fence.mig, self.gpu(&fence.uuid)) {
            (None, Some(gpu)) => ledger.holders_of_gpus(&[gpu]),
            _ => ledger.holders_of(&[fence.uuid.as_str()]),
        };
        let by = Evictor {
            uid: 0,
            user: HEALTH_BY.to_string(),
            reason: Some(format!("{} {}", fence.named(), fence.why())),
            how: Match::Exact,
        };
        for holder in holders.unwrap_or_default() {
            match crate::jobs::evict::evict(&config, &holder.id, &by, EVICT_GRACE) {
                Ok(_) => tracing::warn!(
                    gpu = fence.address(),
                    holder = holder.shown_name(),
                    "evicted: its GPU is out of allocation"
                ),
                Err(error) => tracing::warn!(
                    gpu = fence.address(),
                    holder = holder.shown_name(),
                    error = %one_line(&error),
                    "could not evict"
                ),
            }
        }
    }
}

impl<F: Fn() -> Arc<Config>> HealthSink for Sink<F> {
    fn event(&mut self, uuid: &str, gpu_instance: Option<u32>, signal: Signal) {
        let Some(gpu) = self.gpu(uuid) else {
            return;
        };
        let target = Self::target(gpu, gpu_instance);
        let (action, reason) = judge(signal, &(self.config)().health.xid);
        if action == Action::Ignore {
            tracing::debug!(gpu = target.address(), reason, "ignored");
            return;
        }
        let Some(ledger) = self.ledger() else {
            return;
        };
        // An instance's error fences that instance; the others of its GPU go on.
        let fenced = match action.fence() {
            Some(state) => ledger.fence_health(target, state, &reason, false),
            None => Ok(None),
        };
        match fenced {
            Ok(Some(fence)) => {
                tracing::warn!(
                    gpu = fence.address(),
                    state = fence.state.as_str(),
                    reason,
                    "GPU out of allocation"
                );
                self.evict_holders(&ledger, &fence);
            }
            // Restart-app, or a GPU out of allocation already: told in the trail.
            Ok(None) => ledger.note_health(target, action.as_str(), &reason),
            Err(error) => {
                tracing::warn!(gpu = target.address(), error = %one_line(&error), "could not fence the GPU")
            }
        }
    }

    fn slowdowns(&mut self, uuid: &str, now: &[&'static str]) {
        let before = self
            .slowed
            .insert(uuid.to_string(), now.to_vec())
            .unwrap_or_default();
        if before == now {
            return;
        }
        let Some(gpu) = self.gpu(uuid) else {
            return;
        };
        let Some(ledger) = self.ledger() else {
            return;
        };
        // Told, not fenced: a GPU that slows down still works, and its holders and the
        // admin should know why it is slow.
        match now.is_empty() {
            true => ledger.note_health(gpu.into(), "slowdown-ended", &before.join(", ")),
            false => ledger.note_health(gpu.into(), "slowdown", &now.join(", ")),
        }
    }

    fn conditions(&mut self, uuid: &str, now: &[Signal]) {
        let Some(gpu) = self.gpu(uuid) else {
            return;
        };
        let Some(ledger) = self.ledger() else {
            return;
        };
        // Read without the lock first: most looks change nothing, and take no lock.
        let fence = ledger.fences().ok().and_then(|f| f.of(uuid).cloned());
        // The gravest condition speaks for the GPU: a row remap pending and the driver
        // asking for a reboot is a reboot.
        let xid = &(self.config)().health.xid;
        let worst = now
            .iter()
            .map(|&signal| judge(signal, xid))
            .max_by_key(|(action, _)| *action);
        let result = match (worst, &fence) {
            (Some((action, reason)), None) => match action.fence() {
                Some(state) => ledger.fence_health(gpu.into(), state, &reason, true),
                None => Ok(None),
            },
            // A condition's fence turns graver with a graver condition.
            (Some((action, reason)), Some(f)) if f.until_clear => match action.fence() {
                Some(state) => ledger.fence_health(gpu.into(), state, &reason, true),
                None => Ok(None),
            },
            // An XID's fence, told once, follows a condition that asks as much (the
            // driver's recovery action): the fence then goes with it, at the reset.
            (Some((action, reason)), Some(f)) if f.by == HEALTH_BY => ledger
                .follow_condition(gpu, action, &reason)
                .map(|followed| {
                    if let Some(f) = followed {
                        tracing::info!(
                            gpu = gpu.index,
                            reason = f.reason,
                            "the GPU's fence now ends when the driver no longer reports it"
                        );
                    }
                    None
                }),
            (None, Some(f)) if f.until_clear => ledger.clear_health(gpu),
            _ => Ok(None),
        };
        match result {
            Ok(Some(f)) if now.is_empty() => {
                tracing::info!(
                    gpu = gpu.index,
                    was = f.reason,
                    "GPU back in allocation: no longer reported"
                )
            }
            Ok(Some(f)) => {
                tracing::warn!(
                    gpu = gpu.index,
                    state = f.state.as_str(),
                    reason = f.reason,
                    "GPU out of allocation"
                );
                self.evict_holders(&ledger, &f);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(gpu = gpu.index, error = %one_line(&error), "could not change the GPU's fence")
            }
        }
    }
}
