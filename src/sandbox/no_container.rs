//! The hook's prestart and poststop for a "container" that is only a live process: what
//! `gpupin demo` does where runc or root is missing.
//!
//! Prestart reads the request with the hook's own reader (state annotations, else the
//! bundle's process env) and allocates through the same path, but creates no device node and grants
//! no cgroup access: both need the mount namespace and device cgroup of a real container,
//! and root. Poststop is the hook's own.

use crate::admit::{self, Admission};
use crate::config::Config;
use crate::hook::{self, HookError, Outcome, Stage};
use crate::ledger::{HolderId, HolderMeta, Record};
use std::path::Path;

/// Allocates what the OCI state `state_json` asks for. `Ok(None)`: it asks for nothing.
pub fn prestart_without_container(
    config: &Config,
    state_json: &[u8],
) -> Result<Option<Record>, HookError> {
    let Some((state, request)) = hook::request_of(state_json)? else {
        return Ok(None);
    };
    let id = HolderId::new(state.id())?;
    let admission = Admission {
        holder: &id,
        request: &request,
        meta: HolderMeta {
            source: "demo (no container)".into(),
            pid: *state.pid(),
            bundle: Some(state.bundle().to_path_buf()),
            ..HolderMeta::default()
        },
        claim: None,
    };
    // No consumer: there is no container to give the GPUs to.
    let (record, ()) = admit::admit(config, admission, |_| Ok(()))?;
    Ok(Some(record))
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
