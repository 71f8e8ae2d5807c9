//! The one allocation path every integration takes (prestart hook, precreate, the Docker
//! shim, the demo): load the machine, read live figures and the processes on the GPUs
//! only when the request needs them, then allocate, waiting in the queue when the
//! request asks to.

use crate::host::inventory::live::Cache;
use crate::host::inventory::{self, InventoryError};
use crate::host::whose::{self, Seen};
use crate::input::config::{Config, Foreign};
use crate::input::request::{GpuRequest, Share};
use crate::model::gpu::Inventory;
use crate::model::holder::HolderId;
use crate::model::live::Live;
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::{Figures, FiguresNow, HolderMeta, LedgerError, Machine, Record};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A machine as an allocation sees it.
pub struct Loaded {
    pub inventory: Inventory,
    /// Live figures, where the request needs them and a source has them.
    pub live: Option<Vec<Live>>,
    /// The processes on each GPU, where they are to be avoided (`foreign = "avoid"`, an
    /// exclusive request) and the source lists them.
    pub processes: Option<Vec<Vec<Seen>>>,
}

/// The inventory, and live figures when `request` needs them: its policy reads them, it
/// filters on memory, or, as an exclusive request under `foreign = "avoid"`, it must see
/// the processes on each GPU. Figures that only the last wants and that cannot be read
/// leave processes unseen, with a warning, rather than stop every container start
/// because NVML or the live file has a bad moment.
pub fn load_machine(config: &Config, request: &GpuRequest) -> Result<Loaded, GrantError> {
    let inventory = config.load_inventory()?;
    let policy = request.policy.unwrap_or(config.policy);
    let (for_policy, for_foreign) = live_wanted(config, request);
    let read = || read_live(config, &inventory);
    let live = match (for_policy, for_foreign) {
        (true, _) => read()?,
        (false, true) => read().unwrap_or_else(|err| {
            tracing::warn!(
                error = %crate::base::message::one_line(&err),
                "live figures unreadable: processes on the GPUs not looked at"
            );
            None
        }),
        (false, false) => None,
    };
    let processes = live
        .as_deref()
        .filter(|_| for_foreign)
        .map(|live| whose::observe(live, &whose::passwd_name));
    tracing::debug!(
        inventory = %config.inventory,
        backend = ?inventory.source,
        gpus = inventory.gpus.len(),
        policy = %policy,
        live_wanted = for_policy || for_foreign,
        live_read = live.is_some(),
        processes = processes.as_ref().map(|p| p.iter().map(Vec::len).sum::<usize>()),
        "machine"
    );
    Ok(Loaded {
        inventory,
        live,
        processes,
    })
}

/// Whether `request` needs live figures: for its policy or memory filter, and to see the
/// processes on the GPUs (an exclusive request under `foreign = "avoid"`).
fn live_wanted(config: &Config, request: &GpuRequest) -> (bool, bool) {
    let policy = request.policy.unwrap_or(config.policy);
    (
        policy.needs_live() || request.memory.is_some(),
        config.foreign == Foreign::Avoid && request.share == Share::Exclusive,
    )
}

fn read_live(
    config: &Config,
    inventory: &Inventory,
) -> Result<Option<Vec<Live>>, inventory::InventoryError> {
    let cache = Cache {
        state_dir: &config.state_dir,
        max_age: config.live_cache,
    };
    let file = config.live_file.as_deref();
    inventory::read_live(file, inventory, &config.nvml, Some(cache))
}

/// For a request that waits: the figures `load_machine` read, read again before each
/// look in the queue (`HolderMeta::figures_now`), so that it is decided on the machine
/// as it is then. Figures that cannot be read then leave the earlier ones in place.
fn figures_now(config: &Config, request: &GpuRequest, inventory: &Inventory) -> Option<FiguresNow> {
    let (for_policy, for_foreign) = live_wanted(config, request);
    if !(for_policy || for_foreign) {
        return None;
    }
    let config = config.clone();
    let inventory = inventory.clone();
    Some(FiguresNow(std::sync::Arc::new(move || {
        let live = read_live(&config, &inventory).unwrap_or_else(|err| {
            tracing::warn!(error = %crate::base::message::one_line(&err), "live figures unreadable during a wait: the last ones stand");
            None
        });
        let processes = live
            .as_deref()
            .filter(|_| for_foreign)
            .map(|live| whose::observe(live, &whose::passwd_name));
        Figures { live, processes }
    })))
}

/// The allocation settings of `config` over a loaded machine.
pub fn machine<'a>(config: &'a Config, loaded: &'a Loaded) -> Machine<'a> {
    Machine {
        inventory: &loaded.inventory,
        live: loaded.live.as_deref(),
        default_policy: config.policy,
        max_shared: config.max_shared,
        mig_units: config.mig,
        limits: Some(&config.limits),
        processes: loaded.processes.as_deref(),
        what_if: false,
        // The ledger reads them under its lock, at each decision.
        fenced: None,
    }
}

/// Allocates for `holder` under `config`; returns the machine's inventory with the record,
/// since every caller goes on to turn the record's UUIDs into device nodes.
pub(crate) fn allocate(
    config: &Config,
    holder: &HolderId,
    request: &GpuRequest,
    meta: HolderMeta,
) -> Result<(Inventory, Record), GrantError> {
    // The ledger first: opening it makes the state dir on a host's first start, so that
    // the inventory (and live) caches beside it are written by that start already, and
    // the next one does not ask NVML again.
    let ledger = crate::state::open_ledger(config)?;
    let loaded = load_machine(config, request)?;
    let machine = machine(config, &loaded);
    let refused = refusal(holder, request, &meta);
    let allocation = match request.wait {
        Some(wait) => {
            tracing::debug!(holder = %holder, wait = %humantime::format_duration(wait), "may wait in the queue");
            let meta = HolderMeta {
                figures_now: figures_now(config, request, &loaded.inventory),
                ..meta
            };
            ledger.allocate_waiting(holder, request, &machine, meta, wait)
        }
        None => ledger.allocate(holder, request, &machine, meta),
    };
    match allocation {
        Ok(allocation) => Ok((loaded.inventory, allocation.record)),
        Err(err) => {
            let mut refused = refused.because(crate::base::message::one_line(&err));
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
