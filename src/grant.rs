//! The one allocation path every integration takes (prestart hook, precreate, the Docker
//! shim, the demo): load the machine, read live figures only when the request needs them,
//! then allocate, waiting in the queue when the request asks to.

use crate::audit::{Event, EventKind};
use crate::config::Config;
use crate::inventory::Live;
use crate::inventory::{self, Inventory, InventoryError};
use crate::ledger::{HolderId, HolderMeta, Ledger, LedgerError, Machine, Record};
use crate::request::GpuRequest;

#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// The inventory, and live figures when `request` needs them (its policy reads them, or
/// it filters on memory).
pub fn load_machine(
    config: &Config,
    request: &GpuRequest,
) -> Result<(Inventory, Option<Vec<Live>>), GrantError> {
    let inventory = inventory::load(&config.inventory, &config.state_dir, &config.nvml)?;
    let policy = request.policy.unwrap_or(config.policy);
    let wants_live = policy.needs_live() || request.memory.is_some();
    let live = if wants_live {
        inventory::live::read(config.live_file.as_deref(), &inventory, &config.nvml)?
    } else {
        None
    };
    tracing::debug!(
        inventory = %config.inventory,
        backend = ?inventory.source,
        gpus = inventory.gpus.len(),
        policy = %policy,
        live_wanted = wants_live,
        live_read = live.is_some(),
        "machine"
    );
    Ok((inventory, live))
}

/// The allocation settings of `config` over a loaded machine.
pub fn machine<'a>(
    config: &'a Config,
    inventory: &'a Inventory,
    live: Option<&'a [Live]>,
) -> Machine<'a> {
    Machine {
        inventory,
        live,
        default_policy: config.policy,
        max_shared: config.max_shared,
        limits: Some(&config.limits),
    }
}

/// Allocates for `holder` under `config`; returns the machine's inventory with the record,
/// since every caller goes on to turn the record's UUIDs into device nodes.
pub fn allocate(
    config: &Config,
    holder: &HolderId,
    request: &GpuRequest,
    meta: HolderMeta,
) -> Result<(Inventory, Record), GrantError> {
    let (inventory, live) = load_machine(config, request)?;
    let machine = machine(config, &inventory, live.as_deref());
    let ledger = Ledger::for_config(config)?;
    let refused = refusal(holder, request, &meta);
    let allocation = match request.wait {
        Some(wait) => {
            tracing::debug!(holder = %holder, wait = %humantime::format_duration(wait), "may wait in the queue");
            ledger.allocate_waiting(holder, request, &machine, meta, wait)
        }
        None => ledger.allocate(holder, request, &machine, meta),
    };
    match allocation {
        Ok(allocation) => Ok((inventory, allocation.record)),
        Err(err) => {
            let mut refused = refused.because(crate::message::one_line(&err));
            refused.code = Some(err.code().to_string());
            ledger.audit(&refused);
            Err(err.into())
        }
    }
}

/// The audit line of a refused request, but for its reason.
fn refusal(holder: &HolderId, request: &GpuRequest, meta: &HolderMeta) -> Event {
    Event {
        request: Some(request.clone()),
        pid: meta.pid,
        within: request.within.clone(),
        ..Event::for_holder(
            EventKind::Refuse,
            holder.as_str(),
            meta.kind,
            meta.owner.as_ref(),
            meta.container.as_ref(),
        )
    }
}
