//! NVML backend: the inventory from libnvidia-ml.so.1, loaded at run time by nvml-wrapper
//! so the binary runs on machines without a driver.
//!
//! Per GPU: index, UUID, name, total memory, PCI bus id and device minor from NVML; NUMA
//! node and local CPUs from sysfs by bus id (as in the procfs backend); majors and control
//! nodes from /proc/devices (as in the procfs backend).
//!
//! Topology, per pair of GPUs:
//! - `NV<n>` when `n` active NVLinks of either GPU lead to the other (remote PCI bus id);
//! - `NVS` when both have active NVLinks whose remote is not a GPU of this machine: that is
//!   an NVSwitch. (nvidia-smi prints `NV18` for the same H100 HGX pair; `NVS` says what the
//!   policies need: every pair is linked at full bandwidth.) NVLinks to a CPU (IBM POWER9)
//!   would be taken for a switch, a machine kind gpupin does not target;
//! - otherwise the PCIe level from `nvmlDeviceGetTopologyCommonAncestor`.
//!
//! When any PCIe level cannot be read the matrix is left out rather than guessed.
//!
//! MIG: a GPU whose current MIG mode is enabled (`nvmlDeviceGetMigMode`) lists its MIG
//! devices (`nvmlDeviceGetMaxMigDeviceCount`, then `nvmlDeviceGetMigDeviceHandleByIndex`
//! for each index, NOT_FOUND meaning no device there), each with its UUID, memory, GPU and
//! compute instance ids (`nvmlDeviceGetGpuInstanceId`, `nvmlDeviceGetComputeInstanceId`,
//! which nvml-wrapper 0.13 does not wrap: called through its loaded library), and the
//! profile from its name (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`). NVML does not give the
//! capability minors: they come from procfs as the procfs backend reads them
//! (`/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<X>/access`, `.../ci<Y>/access`,
//! else `/proc/driver/nvidia-caps/mig-minors`). A GPU in MIG mode whose instances cannot
//! all be read fails the probe (`MigUnreadable`): left out or listed whole, it would be
//! handed out whole, which gives a holder nothing CUDA can use and every instance's
//! holder a neighbour.

use super::procfs::{Roots, add_sysfs_locality, device_nodes, mig_access, nvml_bus_id};
use super::{InventoryError, NvmlAccess};
use crate::model::gpu::{Gpu, Inventory};
use crate::model::link::Link;
use crate::model::live::{GpuProcess, Live};
use crate::model::mig::MigInstance;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TopologyLevel};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::error::{nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use std::collections::HashMap;
use std::ffi::OsStr;

/// The library name NVIDIA installs with the driver (the unversioned name needs the dev package).
const LIBRARY: &str = super::NVML_LIBRARY;
/// NVML_NVLINK_MAX_LINKS in the current nvml.h (36 since NVLink 5; 18 in older headers,
/// and in nvml-wrapper-sys, which does not re-export it). A link past what a GPU or an
/// older driver has answers an error, which counts as no link, so asking for all 36
/// only costs the calls.
const MAX_NVLINKS: u32 = 36;

/// The inventory from NVML, through `access`.
pub(super) fn probe(access: &NvmlAccess) -> Result<Inventory, InventoryError> {
    match access {
        NvmlAccess::InProcess => probe_here(),
        NvmlAccess::Helper(exe) => super::nvml_helper::inventory(exe),
    }
}

/// The inventory from NVML loaded into this process.
pub fn probe_here() -> Result<Inventory, InventoryError> {
    probe_with(OsStr::new(LIBRARY), &Roots::host())
}

fn probe_with(library: &OsStr, roots: &Roots) -> Result<Inventory, InventoryError> {
    let nvml = Nvml::builder()
        .lib_path(library)
        .init()
        .map_err(|source| InventoryError::NvmlUnavailable { source })?;
    let count = nvml.device_count().map_err(query_error("device count"))?;
    if count == 0 {
        return Err(InventoryError::NoGpusInNvml);
    }
    let mut gpus = (0..count)
        .map(|index| read_gpu(&nvml, index))
        .collect::<Result<Vec<_>, _>>()?;
    let mut mig_minors = None;
    for gpu in &mut gpus {
        add_sysfs_locality(roots, gpu)?;
        if mig_enabled(&nvml, gpu.index)? {
            // Read once, and only on a machine with a GPU in MIG mode.
            let minors = match &mig_minors {
                Some(minors) => minors,
                None => mig_minors.insert(super::procfs::read_mig_minors(roots)?),
            };
            let instances = read_mig(&nvml, gpu, roots, minors).map_err(|source| {
                InventoryError::MigUnreadable {
                    gpu: gpu.index,
                    uuid: gpu.uuid.clone(),
                    source: Box::new(source),
                }
            })?;
            gpu.mig = Some(instances);
        }
    }
    let links = links(&nvml, &gpus);
    let (gpu_major, control_nodes) = device_nodes(roots)?;
    Ok(Inventory {
        source: super::NVML_SOURCE.to_string(),
        gpu_major,
        gpus,
        control_nodes,
        links,
        caps_major: super::procfs::caps_major(roots)?,
    })
}

/// The live figures of each GPU of `inventory`, by UUID (indices may have
/// moved since the inventory was cached), through `access`.
pub(super) fn live(
    inventory: &Inventory,
    access: &NvmlAccess,
) -> Result<Vec<Live>, InventoryError> {
    let uuids: Vec<&str> = inventory.gpus.iter().map(|g| g.uuid.as_str()).collect();
    match access {
        NvmlAccess::InProcess => live_of(&init()?, &uuids),
        NvmlAccess::Helper(exe) => super::nvml_helper::live(exe, inventory),
    }
}

/// Every GPU NVML knows, by UUID, with its live figures: what `gpupin nvml live` prints.
pub fn live_all_here() -> Result<Vec<(String, Live)>, InventoryError> {
    let nvml = init()?;
    let count = nvml.device_count().map_err(query_error("device count"))?;
    let uuids = (0..count)
        .map(|index| {
            nvml.device_by_index(index)
                .and_then(|d| d.uuid())
                .map_err(query_error("uuid"))
        })
        .collect::<Result<Vec<String>, _>>()?;
    let names: Vec<&str> = uuids.iter().map(String::as_str).collect();
    let live = live_of(&nvml, &names)?;
    Ok(uuids.into_iter().zip(live).collect())
}

fn init() -> Result<Nvml, InventoryError> {
    Nvml::builder()
        .lib_path(OsStr::new(LIBRARY))
        .init()
        .map_err(|source| InventoryError::NvmlUnavailable { source })
}

/// The live figures of `uuids`, from one initialised NVML. Memory is required (the
/// policies read it); utilization is left out where NVML says NotSupported (a GPU in MIG
/// mode), temperature, power and the process lists where a GPU or driver does not answer
/// (`NotSupported` on some boards, an NVML without the v3 process queries).
fn live_of(nvml: &Nvml, uuids: &[&str]) -> Result<Vec<Live>, InventoryError> {
    uuids
        .iter()
        .map(|uuid| {
            let device = nvml
                .device_by_uuid(*uuid)
                .map_err(query_error("device by uuid"))?;
            // NotSupported on a GPU in MIG mode (nvml.h: "not currently supported"): that
            // GPU's load is unknown, not the whole machine's figures.
            let utilization = match device.utilization_rates() {
                Ok(rates) => Some(rates.gpu),
                Err(NvmlError::NotSupported) => None,
                Err(e) => return Err(query_error("utilization")(e)),
            };
            let memory_free = device
                .memory_info()
                .map_err(query_error("memory info"))?
                .free;
            Ok(Live {
                utilization,
                memory_free,
                temperature: device.temperature(TemperatureSensor::Gpu).ok(),
                // NVML says milliwatts.
                power: device.power_usage().ok().map(|mw| (mw + 500) / 1000),
                processes: processes(
                    device.running_compute_processes(),
                    device.running_graphics_processes(),
                ),
            })
        })
        .collect()
}

/// Compute and graphics processes as one list, a process in both once (with the larger
/// figure); `None` when neither list could be read.
fn processes(
    compute: Result<Vec<ProcessInfo>, NvmlError>,
    graphics: Result<Vec<ProcessInfo>, NvmlError>,
) -> Option<Vec<GpuProcess>> {
    if compute.is_err() && graphics.is_err() {
        return None;
    }
    let mut list: Vec<GpuProcess> = Vec::new();
    for info in compute.into_iter().chain(graphics).flatten() {
        let Ok(pid) = i32::try_from(info.pid) else {
            continue;
        };
        let used = match info.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        match list.iter_mut().find(|p| p.pid == pid) {
            Some(seen) => seen.used_memory = seen.used_memory.max(used),
            None => list.push(GpuProcess {
                pid,
                used_memory: used,
            }),
        }
    }
    Some(list)
}

fn query_error(what: &str) -> impl Fn(NvmlError) -> InventoryError + '_ {
    move |source| InventoryError::Nvml {
        what: what.to_string(),
        source,
    }
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<Gpu, InventoryError> {
    let what = |field: &str| format!("{field} of GPU {index}");
    let device = nvml
        .device_by_index(index)
        .map_err(query_error(&what("handle")))?;
    let bus_id = device
        .pci_info()
        .map_err(query_error(&what("pci bus id")))?
        .bus_id;
    Ok(Gpu {
        index,
        uuid: device.uuid().map_err(query_error(&what("uuid")))?,
        name: device.name().map_err(query_error(&what("name")))?,
        memory_bytes: device
            .memory_info()
            .map_err(query_error(&what("memory")))?
            .total,
        pci_bus_id: nvml_bus_id(&bus_id).unwrap_or(bus_id),
        minor: device
            .minor_number()
            .map_err(query_error(&what("minor number")))?,
        numa_node: None,
        local_cpus: None,
        mig: None,
    })
}

/// Whether GPU `index` is in MIG mode now (not the mode pending a reset). A GPU or
/// driver without MIG answers NotSupported, a library without the function lacks the
/// symbol: both are GPUs that are units.
fn mig_enabled(nvml: &Nvml, index: u32) -> Result<bool, InventoryError> {
    let what = format!("MIG mode of GPU {index}");
    let device = nvml.device_by_index(index).map_err(query_error(&what))?;
    match device.mig_mode() {
        Ok(mode) => Ok(mode.current == MIG_ENABLE),
        Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Ok(false),
        Err(e) => Err(query_error(&what)(e)),
    }
}

/// NVML_DEVICE_MIG_ENABLE in nvml.h.
const MIG_ENABLE: u32 = 1;

/// The MIG devices of `gpu` (in MIG mode), by MIG device index; any one unreadable is an
/// error (see the module doc).
fn read_mig(
    nvml: &Nvml,
    gpu: &Gpu,
    roots: &Roots,
    mig_minors: &HashMap<String, u32>,
) -> Result<Vec<MigInstance>, InventoryError> {
    let device = nvml
        .device_by_index(gpu.index)
        .map_err(query_error("handle"))?;
    let count = device
        .mig_device_count()
        .map_err(query_error("MIG device count"))?;
    let mut instances = Vec::new();
    for index in 0..count {
        let what = |field: &str| format!("{field} of MIG device {}:{index}", gpu.index);
        let mig = match device.mig_device_by_index(index) {
            Ok(mig) => mig,
            // Fewer instances than the GPU could have: no device at this index.
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(query_error(&what("handle"))(e)),
        };
        let (gi, ci) =
            instance_ids(nvml, &mig).map_err(query_error(&what("GPU and compute instance ids")))?;
        let name = mig.name().map_err(query_error(&what("name")))?;
        instances.push(MigInstance {
            index,
            uuid: mig.uuid().map_err(query_error(&what("uuid")))?,
            profile: profile_of(&name),
            memory_bytes: mig
                .memory_info()
                .map_err(query_error(&what("memory")))?
                .total,
            access: Some(mig_access(roots, gpu.minor, gi, ci, mig_minors)?),
            parent_index: gpu.index,
            parent_uuid: gpu.uuid.clone(),
            parent_minor: gpu.minor,
        });
    }
    Ok(instances)
}

/// The GPU and compute instance ids of a MIG device. nvml-wrapper 0.13 has no wrapper for
/// them, so the library's functions it loaded are called as nvml.h declares them.
fn instance_ids(nvml: &Nvml, mig: &Device) -> Result<(u32, u32), NvmlError> {
    let lib = nvml.lib();
    let gi_fn = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?;
    let ci_fn = nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?;
    let (mut gi, mut ci) = (0, 0);
    // SAFETY: `mig` is a device handle NVML gave, valid while `nvml` is initialised (it
    // outlives this call); both functions take a handle and a pointer to one unsigned
    // int they write, here locals that outlive the calls.
    unsafe {
        let handle = mig.handle();
        nvml_try(gi_fn(handle, &mut gi))?;
        nvml_try(ci_fn(handle, &mut ci))?;
    }
    Ok((gi, ci))
}

/// The profile in a MIG device's name, which NVML writes as `<GPU name> MIG <profile>`
/// (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`); `None` (unknown) when the name is not of that
/// shape or the profile not of NVIDIA's form.
fn profile_of(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    crate::model::mig::is_profile_name(profile).then(|| profile.to_string())
}

fn links(nvml: &Nvml, gpus: &[Gpu]) -> Option<Vec<Vec<Link>>> {
    let nvlinks = NvLinks::read(nvml, gpus);
    let n = gpus.len();
    let mut matrix = vec![vec![Link::SelfLink; n]; n];
    for a in 0..n {
        for b in a + 1..n {
            let link = match nvlinks.between(a, b) {
                Some(link) => link,
                None => pcie_level(nvml, gpus[a].index, gpus[b].index)?,
            };
            matrix[a][b] = link;
            matrix[b][a] = link;
        }
    }
    Some(matrix)
}

fn pcie_level(nvml: &Nvml, a: u32, b: u32) -> Option<Link> {
    let first = nvml.device_by_index(a).ok()?;
    let second = nvml.device_by_index(b).ok()?;
    Some(match first.topology_common_ancestor(second).ok()? {
        // Internal: two GPUs on one board behind its own switch (Tesla K80).
        TopologyLevel::Internal | TopologyLevel::Single => Link::PcieSwitch,
        TopologyLevel::Multiple => Link::PcieMultiSwitch,
        TopologyLevel::HostBridge => Link::HostBridge,
        TopologyLevel::Node => Link::SameNuma,
        TopologyLevel::System => Link::CrossSocket,
    })
}

/// Active NVLinks per GPU: how many lead to each other GPU, how many to something else.
struct NvLinks {
    to_gpu: Vec<Vec<u32>>,
    to_other: Vec<u32>,
}

impl NvLinks {
    fn read(nvml: &Nvml, gpus: &[Gpu]) -> Self {
        let mut links = NvLinks {
            to_gpu: vec![vec![0; gpus.len()]; gpus.len()],
            to_other: vec![0; gpus.len()],
        };
        for (a, gpu) in gpus.iter().enumerate() {
            for remote in active_remotes(nvml, gpu.index) {
                match gpus.iter().position(|g| g.pci_bus_id == remote) {
                    Some(b) => links.to_gpu[a][b] += 1,
                    None => links.to_other[a] += 1,
                }
            }
        }
        links
    }

    fn between(&self, a: usize, b: usize) -> Option<Link> {
        let direct = self.to_gpu[a][b].max(self.to_gpu[b][a]);
        if direct > 0 {
            return Some(Link::NvLink(u8::try_from(direct).unwrap_or(u8::MAX)));
        }
        (self.to_other[a] > 0 && self.to_other[b] > 0).then_some(Link::NvSwitch)
    }
}

/// Remote PCI bus ids of a GPU's active NVLinks, normalized; none on GPUs without
/// NVLink, where every query answers NotSupported.
fn active_remotes(nvml: &Nvml, index: u32) -> Vec<String> {
    let Ok(device) = nvml.device_by_index(index) else {
        return Vec::new();
    };
    (0..MAX_NVLINKS)
        .filter_map(|link| {
            let wrapper = device.link_wrapper_for(link);
            if !wrapper.is_active().ok()? {
                return None;
            }
            let bus_id = wrapper.remote_pci_info().ok()?.bus_id;
            Some(nvml_bus_id(&bus_id).unwrap_or(bus_id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_one_line_unavailable(result: Result<Inventory, InventoryError>) {
        match result {
            Err(e @ InventoryError::NvmlUnavailable { .. }) => {
                let message = e.to_string();
                assert!(!message.contains('\n'), "{message}");
                assert!(message.starts_with("NVML is not available ("), "{message}");
            }
            Err(other) => panic!("expected NvmlUnavailable, got {other}"),
            Ok(inv) => panic!("expected NvmlUnavailable, got {} GPUs", inv.gpus.len()),
        }
    }

    #[test]
    fn missing_library_is_nvml_unavailable() {
        let library = OsStr::new("/nonexistent/libnvidia-ml.so.1");
        assert_one_line_unavailable(probe_with(library, &Roots::host()));
    }

    #[test]
    fn host_without_driver_is_nvml_unavailable() {
        // On a machine with the driver this probes real GPUs instead: nothing to assert.
        let driver_present = std::path::Path::new("/proc/driver/nvidia").exists();
        if !driver_present {
            let state = tempfile::tempdir().unwrap();
            let source = crate::input::config::InventorySource::Nvml;
            let here = crate::host::inventory::NvmlAccess::InProcess;
            assert_one_line_unavailable(crate::input::config::inventory::load(
                &source,
                state.path(),
                &here,
            ));
        }
    }

    fn info(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn compute_and_graphics_processes_merge_by_pid() {
        let got = processes(
            Ok(vec![info(10, Some(5)), info(11, None)]),
            Ok(vec![info(10, Some(7)), info(12, Some(1))]),
        )
        .unwrap();
        let pairs: Vec<(i32, Option<u64>)> = got.iter().map(|p| (p.pid, p.used_memory)).collect();
        assert_eq!(pairs, [(10, Some(7)), (11, None), (12, Some(1))]);
        let one_fails = processes(Err(NvmlError::NotSupported), Ok(vec![info(3, None)]));
        assert_eq!(one_fails.unwrap().len(), 1);
        assert_eq!(
            processes(Err(NvmlError::NotSupported), Err(NvmlError::NotSupported)),
            None
        );
    }

    #[test]
    fn the_profile_comes_from_the_mig_devices_name() {
        let of = |name| profile_of(name);
        assert_eq!(
            of("NVIDIA A100-SXM4-80GB MIG 1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            of("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(
            of("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb").as_deref(),
            Some("1c.3g.20gb")
        );
        // Not NVIDIA's shape: unknown, never a made-up profile.
        assert_eq!(of("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(of("NVIDIA A100 MIG something"), None);
    }

    #[test]
    fn unreadable_instances_are_one_line_naming_the_gpu_and_why() {
        let err = InventoryError::MigUnreadable {
            gpu: 2,
            uuid: "GPU-2".into(),
            source: Box::new(InventoryError::Nvml {
                what: "uuid of MIG device 2:1".into(),
                source: NvmlError::Unknown,
            }),
        };
        let line = crate::base::message::one_line(&err);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("GPU 2 (GPU-2) is in MIG mode but its instances cannot be read, so nothing of it is handed out: NVML query failed: uuid of MIG device 2:1"),
            "{line}"
        );
    }

    #[test]
    fn counts_direct_nvlinks_and_switches() {
        let links = NvLinks {
            to_gpu: vec![vec![0, 4, 0], vec![4, 0, 0], vec![0, 0, 0]],
            to_other: vec![0, 2, 6],
        };
        assert_eq!(links.between(0, 1), Some(Link::NvLink(4)));
        assert_eq!(links.between(1, 2), Some(Link::NvSwitch));
        assert_eq!(links.between(0, 2), None);
    }
}
