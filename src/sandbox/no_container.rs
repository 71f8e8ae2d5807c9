//! The hook's prestart and poststop for a "container" that is only a live process: what
//! `gpupin demo` does where runc or root is missing.
//!
//! Prestart reads the request as `gpupin hook` does (state annotations, else the bundle's
//! process env) and allocates in the same ledger, but creates no device node and grants
//! no cgroup access: both need the mount namespace and device cgroup of a real container,
//! and root. Poststop is the hook's own.

use crate::config::Config;
use crate::hook::{self, HookError, Outcome, Stage};
use crate::inventory;
use crate::ledger::{HolderId, HolderMeta, Ledger, Record};
use crate::request;
use crate::spec;
use oci_spec::runtime::State;
use std::path::Path;

/// Allocates what the OCI state `state_json` asks for. `Ok(None)`: it asks for nothing.
pub fn prestart_without_container(
    config: &Config,
    state_json: &[u8],
) -> Result<Option<Record>, HookError> {
    let state: State =
        serde_json::from_slice(state_json).map_err(|e| HookError::State(e.to_string()))?;
    let id = HolderId::new(state.id())?;
    let bundle_err = |source| HookError::Bundle {
        id: id.to_string(),
        source,
    };
    let annotations = state.annotations().clone().unwrap_or_default();
    let mut request = request::from_annotations(&annotations)?;
    if request.is_none() {
        let spec = spec::read(&state.bundle().join("config.json")).map_err(bundle_err)?;
        request = request::from_env(&spec::process_env(&spec))?;
    }
    let Some(request) = request else {
        return Ok(None);
    };
    let inventory = inventory::load(&config.inventory, &config.state_dir)?;
    let meta = HolderMeta {
        source: "demo (no container)".into(),
        pid: *state.pid(),
        bundle: Some(state.bundle().to_path_buf()),
    };
    let ledger = Ledger::for_config(config)?;
    let allocation = ledger.allocate(&id, &request, &inventory, config.policy, meta)?;
    Ok(Some(allocation.record))
}

/// `gpupin hook poststop`, in process.
pub fn poststop(config: &Config, state_json: &[u8]) -> Result<Option<Record>, HookError> {
    // The exe only matters at precreate, which writes it into the spec as the hook.
    let exe = Path::new("gpupin");
    match hook::run(Stage::Poststop, state_json, exe, || Ok(config.clone()))? {
        Outcome::Released(record) => Ok(record),
        // The other outcomes are prestart's.
        _ => Ok(None),
    }
}
