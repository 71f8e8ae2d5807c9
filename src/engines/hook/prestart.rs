//! The prestart path for plain runc (and CRI-O): the spec has been read already, so the
//! GPUs are given from outside (edits::inject): nodes in the container's mount namespace,
//! access in its device cgroup, and the choice written to the bundle for later hooks.

use super::{HookError, Outcome};
use crate::admission::admit::{self, Admission};
use crate::admission::edits::inject::{self, Target};
use crate::admission::foreign::{self, GpuNumbers};
use crate::admission::spec;
use crate::input::config::Config;
use crate::input::config::Unrequested;
use crate::input::request::{GpuRequest, Origin, Selection};
use crate::model::holder::{ContainerInfo, HolderId};
use crate::state::ledger::HolderMeta;
use serde_json::Value;
use std::path::Path;

/// The container the prestart path works on.
pub(super) struct Container<'a> {
    pub id: &'a HolderId,
    pub pid: Option<i32>,
    pub bundle: &'a Path,
    /// What its engine told about it (`engine::from_annotations`).
    pub info: Option<ContainerInfo>,
}

pub(super) fn prestart(
    c: &Container,
    request: &GpuRequest,
    mut spec_value: Value,
    config: &Config,
) -> Result<Outcome, HookError> {
    let pid = c.pid.ok_or_else(|| HookError::NoPid(c.id.to_string()))?;
    let spec_path = c.bundle.join("config.json");
    let rootfs = spec::rootfs_path(&spec_value, c.bundle).map_err(|source| HookError::Bundle {
        id: c.id.to_string(),
        source,
    })?;
    // Refused before anything is allocated: a cpuset needs the spec edited before create.
    if request.cpus.is_some() {
        return Err(HookError::CpusNeedSpecEdit(c.id.to_string()));
    }
    if let Some(cap) = crate::host::container_devices::missing_capability() {
        return Err(HookError::MissingCapability {
            id: c.id.to_string(),
            cap,
        });
    }
    let admission = Admission {
        holder: c.id,
        request,
        meta: HolderMeta {
            source: "hook".into(),
            pid: Some(pid),
            bundle: Some(c.bundle.to_path_buf()),
            container: c.info.clone(),
            ..HolderMeta::default()
        },
        claim: None,
        slurm_job: crate::input::request::slurm_job(&spec::process_env(&spec_value)),
        labels: spec::annotations(&spec_value),
    };
    let (record, ()) = admit::admit(config, admission, |edits| {
        let target = Target {
            pid,
            rootfs: &rootfs,
            spec: &mut spec_value,
            spec_path: &spec_path,
        };
        inject::apply(edits, target)
    })?;
    Ok(Outcome::Allocated(record))
}

/// A container that asks gpupin for nothing. GPU nodes runc has already made for it
/// cannot be taken back, and gpupin cannot pick others: they are recorded as its GPUs,
/// or the container is refused when another holder has one (not for a privileged one,
/// which sees every GPU anyway: `foreign::admits_every_gpu`). Without any, what it asks
/// NVIDIA's stack for is voided in its bundle (`unrequested = "strip"`) before NVIDIA's
/// hook, which runs after gpupin's, reads it.
pub(super) fn unrequested(
    c: &Container,
    mut spec_value: Value,
    config: &Config,
) -> Result<Outcome, HookError> {
    if foreign::has_char_devices(&spec_value) {
        let inventory = config.load_inventory()?;
        let gpus = GpuNumbers::of(&inventory);
        let minors = match foreign::admits_every_gpu(&spec_value, &gpus) {
            true => Default::default(),
            false => foreign::gpu_minors(&spec_value, &gpus),
        };
        let uuids: Vec<String> = inventory
            .gpus
            .iter()
            .filter(|g| minors.contains(&g.minor))
            .map(|g| g.uuid.clone())
            .collect();
        if !uuids.is_empty() {
            tracing::info!(container = %c.id, gpus = ?uuids, "GPU nodes came with the spec: recording them as its GPUs");
            let request = GpuRequest::new(Selection::Devices(uuids), Origin::Nvidia);
            return prestart(c, &request, spec_value, config);
        }
    }
    if config.unrequested == Unrequested::Strip && foreign::void(&mut spec_value) {
        let path = c.bundle.join("config.json");
        spec::write_atomic(&path, &spec_value).map_err(|source| HookError::Bundle {
            id: c.id.to_string(),
            source,
        })?;
        tracing::info!(container = %c.id, "no request: NVIDIA's request set to void");
    }
    Ok(Outcome::NoRequest)
}
