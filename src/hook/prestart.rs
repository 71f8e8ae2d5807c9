//! The prestart path for plain runc (and CRI-O): the spec has been read already, so the
//! GPUs are given from outside: nodes in the container's mount namespace, access in its
//! device cgroup, and the choice written to the bundle for later hooks.

use super::{HookError, Outcome, VISIBLE_DEVICES};
use crate::config::Config;
use crate::grant;
use crate::inject;
use crate::inventory::Inventory;
use crate::ledger::{HolderId, HolderMeta, Ledger, Record};
use crate::request::GpuRequest;
use crate::spec;
use std::path::Path;

/// The container the prestart path works on.
pub(super) struct Target<'a> {
    pub id: &'a HolderId,
    pub pid: Option<i32>,
    pub bundle: &'a Path,
}

pub(super) fn prestart(
    c: &Target,
    request: &GpuRequest,
    mut spec_value: serde_json::Value,
    config: &Config,
) -> Result<Outcome, HookError> {
    let pid = c.pid.ok_or_else(|| HookError::NoPid(c.id.to_string()))?;
    let config_path = c.bundle.join("config.json");
    let rootfs = spec::rootfs_path(&spec_value, c.bundle).map_err(|source| HookError::Bundle {
        id: c.id.to_string(),
        source,
    })?;
    if request.cpus.is_some() {
        return Err(HookError::CpusNeedSpecEdit(c.id.to_string()));
    }
    let meta = HolderMeta {
        source: "hook".into(),
        pid: Some(pid),
        bundle: Some(c.bundle.to_path_buf()),
        ..HolderMeta::default()
    };
    let (inventory, record) = grant::allocate(config, c.id, request, meta)?;
    let given = give_gpus(
        c.id,
        pid,
        &rootfs,
        &inventory,
        &record,
        &mut spec_value,
        &config_path,
    );
    if let Err(err) = given {
        // The container will not start: its GPUs go back at once, not at the next gc.
        Ledger::for_config(config)?.release(c.id)?;
        return Err(err);
    }
    Ok(Outcome::Allocated(record))
}

fn give_gpus(
    id: &HolderId,
    pid: i32,
    rootfs: &Path,
    inventory: &Inventory,
    record: &Record,
    spec_value: &mut serde_json::Value,
    config_path: &Path,
) -> Result<(), HookError> {
    let nodes = inventory.nodes_for(&record.gpus);
    let inject_err = |source| HookError::Inject {
        id: id.to_string(),
        source,
    };
    inject::create_nodes_in_container(pid, rootfs, &nodes).map_err(inject_err)?;
    inject::allow_in_device_cgroup(pid, &nodes).map_err(inject_err)?;
    let write_err = |source| HookError::WriteSpec {
        id: id.to_string(),
        source,
    };
    spec::set_env(spec_value, VISIBLE_DEVICES, &record.gpus.join(",")).map_err(write_err)?;
    spec::write_atomic(config_path, spec_value).map_err(write_err)
}
