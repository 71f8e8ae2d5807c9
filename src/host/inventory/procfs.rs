//! procfs backend: the inventory without NVML, from files the driver and the kernel write.
//!
//! - `/proc/driver/nvidia/gpus/<bus>/information`: `Model`, `GPU UUID`, `Device Minor`,
//!   `Bus Location`; GPUs with `GPU Excluded: Yes` are left out (the driver refuses them).
//! - `/proc/devices`: the GPU major (`nvidia`, or `nvidia-frontend` on older drivers) and the
//!   `nvidia-uvm` major. Control nodes: nvidiactl gpu_major:255; nvidia-modeset gpu_major:254
//!   only when `/dev/nvidia-modeset` exists on the host (it belongs to the display driver,
//!   which /proc/devices does not list separately, and CUDA does not need it); nvidia-uvm
//!   and nvidia-uvm-tools minors 0 and 1 only when `nvidia-uvm` is loaded.
//! - `/sys/bus/pci/devices/<bus>/numa_node` (`-1` means none) and `local_cpulist`.
//! - Topology: PCIe distance from where the GPUs sit in the sysfs device tree (the
//!   `/sys/bus/pci/devices/<bus>` link target), in nvidia-smi notation: `PIX` when they meet
//!   below at most one bridge on each side (one switch), `PXB` when deeper, `PHB` when they
//!   meet only at the root bus, `NODE` on different root buses of one NUMA node, `SYS`
//!   otherwise. procfs shows no NVLink, so NVLink machines look like PCIe ones here; the
//!   matrix is left out when any GPU's position is unreadable.
//!
//! - MIG instances, as NVIDIA's toolkit finds them (`internal/nvcaps`): a compute instance
//!   exists where `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<X>/ci<Y>/access`
//!   does; that file and its GPU instance's `gi<X>/access` say the capability minors
//!   (`DeviceFileMinor: <n>`), else `/proc/driver/nvidia-caps/mig-minors` does
//!   (`gpu<minor>/gi<X>/ci<Y>/access <n>`). A GPU with such a GPU instance is in MIG mode.
//!   procfs names no MIG UUID, profile or memory: an instance gets the legacy UUID
//!   `MIG-<GPU uuid>/<gi>/<ci>`, which CUDA and NVIDIA's runtime also accept, an unknown
//!   profile, and indexes in GI, CI order. A GPU in MIG mode with no GPU instance looks
//!   whole here; NVML tells them apart.
//!
//! Memory is not in procfs: `memory_bytes` is 0 (unknown). Indexes follow PCI bus id order,
//! as NVML enumerates by default.

use super::file::node;
use super::{InventoryError, cpulist};
use crate::model::gpu::{DeviceNode, Gpu, Inventory};
use crate::model::link::Link;
use crate::model::mig::{MigAccess, MigInstance};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Where procfs, sysfs and /dev are; other than `/` only in tests.
pub(super) struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub dev: PathBuf,
}

impl Roots {
    pub(super) fn host() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
        }
    }
}

pub(super) fn probe() -> Result<Inventory, InventoryError> {
    probe_at(&Roots::host())
}

pub(super) fn probe_at(roots: &Roots) -> Result<Inventory, InventoryError> {
    let gpus_dir = roots.proc.join("driver/nvidia/gpus");
    let mut found = Vec::new();
    for dir in list_dir(&gpus_dir)? {
        if let Some(gpu) = read_gpu(&dir)? {
            found.push(gpu);
        }
    }
    if found.is_empty() {
        return Err(InventoryError::NoGpusInProcfs { root: gpus_dir });
    }
    // NVML's default enumeration order; the normalized ids sort like the numbers.
    found.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    let mut gpus = Vec::with_capacity(found.len());
    let mig_minors = read_mig_minors(roots)?;
    for (index, mut gpu) in found.into_iter().enumerate() {
        gpu.index = index as u32;
        add_sysfs_locality(roots, &mut gpu)?;
        gpu.mig = read_mig(roots, &gpu, &mig_minors)?;
        gpus.push(gpu);
    }
    let (gpu_major, control_nodes) = device_nodes(roots)?;
    let links = pcie_links(roots, &gpus);
    Ok(Inventory {
        source: "procfs".to_string(),
        gpu_major,
        gpus,
        control_nodes,
        links,
        caps_major: caps_major(roots)?,
    })
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, InventoryError> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(InventoryError::NoGpusInProcfs {
                root: dir.to_path_buf(),
            });
        }
        other => other.map_err(|source| procfs_error(dir, source))?,
    };
    let mut paths = Vec::new();
    for entry in entries {
        paths.push(entry.map_err(|source| procfs_error(dir, source))?.path());
    }
    Ok(paths)
}

fn procfs_error(path: &Path, source: std::io::Error) -> InventoryError {
    InventoryError::Procfs {
        path: path.to_path_buf(),
        source,
    }
}

fn format_error(path: &Path, reason: impl Into<String>) -> InventoryError {
    InventoryError::ProcfsFormat {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// One GPU from its `information` file; `None` when the driver excludes it.
fn read_gpu(dir: &Path) -> Result<Option<Gpu>, InventoryError> {
    let path = dir.join("information");
    let text = std::fs::read_to_string(&path).map_err(|source| procfs_error(&path, source))?;
    if field(&text, "GPU Excluded").is_some_and(|v| v.eq_ignore_ascii_case("yes")) {
        return Ok(None);
    }
    parse_information(&text)
        .map(Some)
        .map_err(|reason| format_error(&path, reason))
}

fn parse_information(text: &str) -> Result<Gpu, String> {
    let get = |key: &str| field(text, key).ok_or_else(|| format!("no {key:?} line"));
    let uuid = get("GPU UUID")?;
    // The driver prints question marks until it has initialized the GPU once.
    if uuid.contains('?') || !uuid.starts_with("GPU-") {
        return Err(format!(
            "GPU UUID {uuid:?} is not known yet: start nvidia-persistenced or use NVML"
        ));
    }
    let minor = get("Device Minor")?;
    let bus = get("Bus Location")?;
    Ok(Gpu {
        index: 0,
        uuid: uuid.to_string(),
        name: get("Model")?.to_string(),
        memory_bytes: 0,
        pci_bus_id: nvml_bus_id(bus).ok_or_else(|| format!("bad Bus Location {bus:?}"))?,
        minor: minor
            .parse()
            .map_err(|_| format!("bad Device Minor {minor:?}"))?,
        numa_node: None,
        local_cpus: None,
        mig: None,
    })
}

/// The value of a `Key: value` line; values may themselves hold colons (bus ids).
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// `0000:17:00.0` (procfs, sysfs) to NVML's `00000000:17:00.0`, upper case as NVML writes it.
pub(super) fn nvml_bus_id(bus: &str) -> Option<String> {
    let (domain, rest) = split_bus_id(bus)?;
    Some(format!("{domain:08X}:{}", rest.to_ascii_uppercase()))
}

/// NVML's `00000000:17:00.0` to the sysfs name `0000:17:00.0`.
pub(super) fn sysfs_bus_id(bus: &str) -> Option<String> {
    let (domain, rest) = split_bus_id(bus)?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

/// Splits `domain:bus:device.function` and checks its shape.
fn split_bus_id(bus: &str) -> Option<(u32, &str)> {
    let (domain, rest) = bus.trim().split_once(':')?;
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let (bus_dev, function) = rest.split_once('.')?;
    let (bus_no, device) = bus_dev.split_once(':')?;
    let shaped = hex(bus_no, 2) && hex(device, 2) && hex(function, 1);
    let domain = u32::from_str_radix(domain, 16).ok()?;
    shaped.then_some((domain, rest))
}

/// Fills `numa_node` and `local_cpus` from sysfs.
pub(super) fn add_sysfs_locality(roots: &Roots, gpu: &mut Gpu) -> Result<(), InventoryError> {
    let Some(dir) = pci_dir(roots, &gpu.pci_bus_id) else {
        return Ok(());
    };
    gpu.numa_node = read_optional(&dir.join("numa_node"))?
        .and_then(|text| text.parse::<i64>().ok())
        .and_then(|node| u32::try_from(node).ok());
    gpu.local_cpus = read_optional(&dir.join("local_cpulist"))?
        .filter(|text| !text.is_empty() && cpulist::parse(text).is_some());
    Ok(())
}

fn pci_dir(roots: &Roots, nvml_bus: &str) -> Option<PathBuf> {
    let name = sysfs_bus_id(nvml_bus)?;
    Some(roots.sys.join("bus/pci/devices").join(name))
}

/// A trimmed sysfs value; `None` when the file does not exist (older kernels, no NUMA).
fn read_optional(path: &Path) -> Result<Option<String>, InventoryError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(procfs_error(path, source)),
    }
}

/// The GPU major and the control nodes, from /proc/devices and /dev (see the module docs).
pub(super) fn device_nodes(roots: &Roots) -> Result<(u32, Vec<DeviceNode>), InventoryError> {
    let path = roots.proc.join("devices");
    let text = std::fs::read_to_string(&path).map_err(|source| procfs_error(&path, source))?;
    let majors = char_majors(&text);
    let gpu_major = majors
        .get("nvidia")
        .or_else(|| majors.get("nvidia-frontend"))
        .copied()
        .ok_or_else(|| {
            format_error(
                &path,
                "no nvidia or nvidia-frontend character device: is the nvidia module loaded?",
            )
        })?;
    let mut nodes = vec![node(super::CTL_NODE, gpu_major, 255)];
    if roots.dev.join("nvidia-modeset").symlink_metadata().is_ok() {
        nodes.push(node(super::MODESET_NODE, gpu_major, 254));
    }
    if let Some(&uvm) = majors.get("nvidia-uvm") {
        nodes.push(node(super::UVM_NODE, uvm, 0));
        nodes.push(node(super::UVM_TOOLS_NODE, uvm, 1));
    }
    Ok((gpu_major, nodes))
}

/// `/proc/driver/nvidia-caps/mig-minors`: `gpu0/gi1/ci0/access 13` lines as a map;
/// empty where the file does not exist (no MIG-capable driver). Other lines (`config 1`,
/// `monitor 2`) are skipped, as NVIDIA's toolkit skips them.
pub(super) fn read_mig_minors(roots: &Roots) -> Result<HashMap<String, u32>, InventoryError> {
    let path = roots.proc.join("driver/nvidia-caps/mig-minors");
    let Some(text) = read_optional(&path)? else {
        return Ok(HashMap::new());
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let (cap, minor) = line.trim().split_once(' ')?;
            Some((cap.to_string(), minor.trim().parse().ok()?))
        })
        .filter(|(cap, _)| cap.starts_with("gpu"))
        .collect())
}

/// The GPU's MIG instances from its capabilities tree; `None` when it has no GPU instance.
fn read_mig(
    roots: &Roots,
    gpu: &Gpu,
    mig_minors: &HashMap<String, u32>,
) -> Result<Option<Vec<MigInstance>>, InventoryError> {
    let dir = roots
        .proc
        .join(format!("driver/nvidia/capabilities/gpu{}/mig", gpu.minor));
    let gis = numbered_dirs(&dir, "gi")?;
    if gis.is_empty() {
        return Ok(None);
    }
    let mut instances = Vec::new();
    for gi in gis {
        let gi_dir = dir.join(format!("gi{gi}"));
        let cap = format!("gpu{}/gi{gi}/access", gpu.minor);
        let gi_minor = access_minor(&gi_dir.join("access"), &cap, mig_minors)?;
        for ci in numbered_dirs(&gi_dir, "ci")? {
            let cap = format!("gpu{}/gi{gi}/ci{ci}/access", gpu.minor);
            let path = gi_dir.join(format!("ci{ci}/access"));
            let ci_minor = access_minor(&path, &cap, mig_minors)?;
            instances.push(MigInstance {
                index: instances.len() as u32,
                uuid: format!("MIG-{}/{gi}/{ci}", gpu.uuid),
                profile: None,
                memory_bytes: 0,
                access: Some(MigAccess {
                    gi,
                    ci,
                    gi_minor,
                    ci_minor,
                }),
                parent_index: gpu.index,
                parent_uuid: gpu.uuid.clone(),
                parent_minor: gpu.minor,
            });
        }
    }
    Ok(Some(instances))
}

/// The capability minors of compute instance `ci` of GPU instance `gi` on the GPU with
/// device minor `gpu_minor`, read as `read_mig` reads them: for the NVML backend, which
/// has the GI and CI ids from NVML but no minors (NVML does not give them; NVIDIA's
/// toolkit reads them here too).
pub(super) fn mig_access(
    roots: &Roots,
    gpu_minor: u32,
    gi: u32,
    ci: u32,
    mig_minors: &HashMap<String, u32>,
) -> Result<MigAccess, InventoryError> {
    let gi_dir = roots.proc.join(format!(
        "driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
    ));
    let gi_minor = access_minor(
        &gi_dir.join("access"),
        &format!("gpu{gpu_minor}/gi{gi}/access"),
        mig_minors,
    )?;
    let ci_minor = access_minor(
        &gi_dir.join(format!("ci{ci}/access")),
        &format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"),
        mig_minors,
    )?;
    Ok(MigAccess {
        gi,
        ci,
        gi_minor,
        ci_minor,
    })
}

/// The compute instances the capabilities tree under `proc` shows, as
/// `gpu0/gi1/ci0,gpu0/gi2/ci0` (sorted); empty without MIG or when unreadable. A few
/// directory reads, no NVML: cheap enough for every cache check.
pub(super) fn mig_geometry(proc: &Path) -> String {
    let caps = proc.join("driver/nvidia/capabilities");
    let mut found = Vec::new();
    for gpu in numbered_dirs(&caps, "gpu").unwrap_or_default() {
        let mig = caps.join(format!("gpu{gpu}/mig"));
        for gi in numbered_dirs(&mig, "gi").unwrap_or_default() {
            for ci in numbered_dirs(&mig.join(format!("gi{gi}")), "ci").unwrap_or_default() {
                found.push(format!("gpu{gpu}/gi{gi}/ci{ci}"));
            }
        }
    }
    found.join(",")
}

/// The numbers of `<prefix><n>` subdirectories, sorted; none when `dir` does not exist.
fn numbered_dirs(dir: &Path, prefix: &str) -> Result<Vec<u32>, InventoryError> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.map_err(|source| procfs_error(dir, source))?,
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| procfs_error(dir, source))?;
        let name = entry.file_name();
        let number = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.parse().ok());
        if let Some(n) = number
            && entry.path().is_dir()
        {
            found.push(n);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// A capability's minor: `DeviceFileMinor` of its `access` file, else its mig-minors line.
fn access_minor(
    path: &Path,
    cap: &str,
    mig_minors: &HashMap<String, u32>,
) -> Result<u32, InventoryError> {
    if let Some(text) = read_optional(path)?
        && let Some(value) = field(&text, "DeviceFileMinor")
    {
        return value
            .parse()
            .map_err(|_| format_error(path, format!("bad DeviceFileMinor {value:?}")));
    }
    mig_minors.get(cap).copied().ok_or_else(|| {
        format_error(
            path,
            format!("no DeviceFileMinor, and no {cap} line in /proc/driver/nvidia-caps/mig-minors"),
        )
    })
}

/// The major of the MIG capability nodes: `nvidia-caps` in /proc/devices, where the
/// driver registered it (drivers with MIG support do, MIG mode or not).
pub(super) fn caps_major(roots: &Roots) -> Result<Option<u32>, InventoryError> {
    let path = roots.proc.join("devices");
    let text = std::fs::read_to_string(&path).map_err(|source| procfs_error(&path, source))?;
    Ok(char_majors(&text)
        .get(crate::model::mig::CAPS_DEVICE_NAME)
        .copied())
}

/// Name to major of the `Character devices:` section.
pub(crate) fn char_majors(text: &str) -> HashMap<&str, u32> {
    text.lines()
        .skip_while(|line| line.trim() != "Character devices:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty() && !line.ends_with(':'))
        .filter_map(|line| {
            let (major, name) = line.trim().split_once(char::is_whitespace)?;
            Some((name.trim(), major.parse().ok()?))
        })
        .collect()
}

/// The PCIe matrix from sysfs positions; `None` when any position is unknown.
fn pcie_links(roots: &Roots, gpus: &[Gpu]) -> Option<Vec<Vec<Link>>> {
    let paths = gpus
        .iter()
        .map(|g| pci_path(&pci_dir(roots, &g.pci_bus_id)?))
        .collect::<Option<Vec<_>>>()?;
    let links = (0..gpus.len())
        .map(|a| {
            (0..gpus.len())
                .map(|b| match a == b {
                    true => Link::SelfLink,
                    false => pcie_link(&paths[a], &paths[b], gpus[a].numa_node, gpus[b].numa_node),
                })
                .collect()
        })
        .collect();
    Some(links)
}

/// The device's path from its root bus: `["pci0000:00", "0000:00:01.0", ..., "0000:17:00.0"]`.
fn pci_path(dir: &Path) -> Option<Vec<String>> {
    let target = std::fs::read_link(dir).ok()?;
    let parts: Vec<String> = target
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .skip_while(|c| !c.starts_with("pci"))
        .collect();
    (parts.len() >= 2).then_some(parts)
}

fn pcie_link(a: &[String], b: &[String], numa_a: Option<u32>, numa_b: Option<u32>) -> Link {
    if a[0] != b[0] {
        // Both unknown means the kernel has no NUMA: one node.
        return match numa_a == numa_b {
            true => Link::SameNuma,
            false => Link::CrossSocket,
        };
    }
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if common == 1 {
        return Link::HostBridge;
    }
    // Bridges between the common ancestor and each GPU, the GPU itself not counted: a
    // switch's two downstream ports give one on each side.
    let bridges = (a.len() - common).max(b.len() - common) - 1;
    match bridges {
        0 | 1 => Link::PcieSwitch,
        _ => Link::PcieMultiSwitch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    struct Fixture {
        _dir: tempfile::TempDir,
        roots: Roots,
    }

    fn fixture(devices: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let roots = Roots {
            proc: dir.path().join("proc"),
            sys: dir.path().join("sys"),
            dev: dir.path().join("dev"),
        };
        fs::create_dir_all(roots.proc.join("driver/nvidia/gpus")).unwrap();
        fs::create_dir_all(roots.sys.join("devices")).unwrap();
        fs::create_dir_all(roots.sys.join("bus/pci/devices")).unwrap();
        fs::create_dir_all(&roots.dev).unwrap();
        fs::write(roots.proc.join("devices"), devices).unwrap();
        Fixture { _dir: dir, roots }
    }

    const DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n\
        234 nvidia-uvm\n237 nvidia-caps\n\nBlock devices:\n  7 loop\n";

    impl Fixture {
        /// A GPU at `bus` (`0000:17:00.0`) under the sysfs `path` of bridges.
        fn gpu(&self, bus: &str, minor: u32, numa: Option<&str>, bridges: &str) {
            let info = format!(
                "Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 40\nGPU UUID: \t GPU-{minor}-{bus}\n\
                 Bus Type: \t PCIe\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
            );
            let proc_dir = self.roots.proc.join("driver/nvidia/gpus").join(bus);
            fs::create_dir_all(&proc_dir).unwrap();
            fs::write(proc_dir.join("information"), info).unwrap();
            let device = self.roots.sys.join("devices").join(bridges).join(bus);
            fs::create_dir_all(&device).unwrap();
            if let Some(numa) = numa {
                fs::write(device.join("numa_node"), format!("{numa}\n")).unwrap();
                fs::write(device.join("local_cpulist"), "0-3\n").unwrap();
            }
            let link = self.roots.sys.join("bus/pci/devices").join(bus);
            std::os::unix::fs::symlink(format!("../../../devices/{bridges}/{bus}"), link).unwrap();
        }
    }

    #[test]
    fn reads_two_gpus_in_bus_order_with_their_minors() {
        let f = fixture(DEVICES);
        f.gpu("0000:b1:00.0", 0, Some("1"), "pci0000:b0/0000:b0:01.0");
        f.gpu("0000:17:00.0", 1, Some("0"), "pci0000:16/0000:16:01.0");
        let inv = probe_at(&f.roots).unwrap();
        assert_eq!(inv.source, "procfs");
        assert_eq!(inv.gpus[0].pci_bus_id, "00000000:17:00.0");
        assert_eq!((inv.gpus[0].index, inv.gpus[0].minor), (0, 1));
        assert_eq!((inv.gpus[1].index, inv.gpus[1].minor), (1, 0));
        assert_eq!(inv.gpus[1].pci_bus_id, "00000000:B1:00.0");
        assert_eq!(inv.gpus[0].name, "NVIDIA A100-SXM4-40GB");
        assert_eq!(inv.gpus[0].uuid, "GPU-1-0000:17:00.0");
        assert_eq!(inv.gpus[1].numa_node, Some(1));
        assert_eq!(inv.gpus[1].local_cpus.as_deref(), Some("0-3"));
        assert_eq!(inv.gpus[0].memory_bytes, 0);
        assert_eq!(inv.link(0, 1), Some(Link::CrossSocket));
        let nodes = [
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-uvm", 234, 0),
            node("/dev/nvidia-uvm-tools", 234, 1),
        ];
        assert_eq!(inv.control_nodes, nodes);
    }

    #[test]
    fn old_drivers_name_the_major_nvidia_frontend() {
        let f = fixture("Character devices:\n195 nvidia-frontend\n249 nvidia-uvm\n");
        f.gpu("0000:17:00.0", 0, None, "pci0000:16");
        fs::write(f.roots.dev.join("nvidia-modeset"), "").unwrap();
        let inv = probe_at(&f.roots).unwrap();
        assert_eq!(inv.gpu_major, 195);
        assert!(
            inv.control_nodes
                .contains(&node("/dev/nvidia-modeset", 195, 254))
        );
        assert!(inv.control_nodes.contains(&node("/dev/nvidia-uvm", 249, 0)));
    }

    #[test]
    fn missing_or_negative_numa_node_is_none() {
        let f = fixture(DEVICES);
        f.gpu("0000:17:00.0", 0, Some("-1"), "pci0000:00/0000:00:01.0");
        f.gpu("0000:18:00.0", 1, None, "pci0000:00/0000:00:02.0");
        let inv = probe_at(&f.roots).unwrap();
        assert_eq!(inv.gpus[0].numa_node, None);
        assert_eq!(inv.gpus[1].numa_node, None);
        assert_eq!(inv.gpus[1].local_cpus, None);
        assert_eq!(inv.link(0, 1), Some(Link::HostBridge));
    }

    #[test]
    fn pcie_distance_follows_the_device_tree() {
        let f = fixture(DEVICES);
        let switch = "pci0000:00/0000:00:01.0/0000:01:00.0";
        f.gpu(
            "0000:03:00.0",
            0,
            Some("0"),
            &format!("{switch}/0000:02:08.0"),
        );
        f.gpu(
            "0000:04:00.0",
            1,
            Some("0"),
            &format!("{switch}/0000:02:10.0"),
        );
        f.gpu(
            "0000:07:00.0",
            2,
            Some("0"),
            &format!("{switch}/0000:02:18.0/0000:05:00.0/0000:06:00.0"),
        );
        f.gpu("0000:41:00.0", 3, Some("0"), "pci0000:40/0000:40:01.0");
        let inv = probe_at(&f.roots).unwrap();
        assert_eq!(inv.link(0, 1), Some(Link::PcieSwitch));
        assert_eq!(inv.link(0, 2), Some(Link::PcieMultiSwitch));
        assert_eq!(inv.link(3, 0), Some(Link::SameNuma));
        assert_eq!(inv.link(2, 2), Some(Link::SelfLink));
    }

    #[test]
    fn excluded_gpus_are_left_out() {
        let f = fixture(DEVICES);
        f.gpu("0000:17:00.0", 0, None, "pci0000:16");
        let info = f
            .roots
            .proc
            .join("driver/nvidia/gpus/0000:17:00.0/information");
        let text = fs::read_to_string(&info)
            .unwrap()
            .replace("Excluded:\t No", "Excluded:\t Yes");
        fs::write(&info, text).unwrap();
        let err = probe_at(&f.roots).unwrap_err();
        assert!(
            matches!(err, InventoryError::NoGpusInProcfs { .. }),
            "{err}"
        );
    }

    #[test]
    fn unknown_uuid_and_missing_driver_are_errors() {
        let f = fixture("Character devices:\n  1 mem\n");
        f.gpu("0000:17:00.0", 0, None, "pci0000:16");
        let err = probe_at(&f.roots).unwrap_err().to_string();
        assert!(err.contains("no nvidia or nvidia-frontend"), "{err}");
        let info = f
            .roots
            .proc
            .join("driver/nvidia/gpus/0000:17:00.0/information");
        fs::write(
            &info,
            "Model: X\nGPU UUID: GPU-????????-????\nDevice Minor: 0\n",
        )
        .unwrap();
        let err = probe_at(&f.roots).unwrap_err().to_string();
        assert!(
            err.contains("is not known yet") && err.contains("information"),
            "{err}"
        );
        let empty = fixture(DEVICES);
        fs::remove_dir(empty.roots.proc.join("driver/nvidia/gpus")).unwrap();
        let err = probe_at(&empty.roots).unwrap_err();
        assert!(
            matches!(err, InventoryError::NoGpusInProcfs { .. }),
            "{err}"
        );
    }

    impl Fixture {
        /// A compute instance in the capabilities tree, in the driver's format.
        fn mig(&self, gpu_minor: u32, gi: u32, ci: u32, minors: Option<(u32, u32)>) {
            let gi_dir = self.roots.proc.join(format!(
                "driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"
            ));
            fs::create_dir_all(gi_dir.join(format!("ci{ci}"))).unwrap();
            if let Some((gi_minor, ci_minor)) = minors {
                let access = |minor| {
                    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
                };
                fs::write(gi_dir.join("access"), access(gi_minor)).unwrap();
                fs::write(gi_dir.join(format!("ci{ci}/access")), access(ci_minor)).unwrap();
            }
        }
    }

    /// What the NVML backend asks: the minors of GI/CI ids NVML gave, from the access
    /// files, else from mig-minors; neither is an error naming the file.
    #[test]
    fn mig_access_of_known_ids() {
        let f = fixture(DEVICES);
        f.mig(3, 2, 0, Some((426, 427)));
        f.mig(3, 9, 0, None);
        let minors = HashMap::from([
            ("gpu3/gi9/access".to_string(), 489),
            ("gpu3/gi9/ci0/access".to_string(), 490),
        ]);
        let a = mig_access(&f.roots, 3, 2, 0, &minors).unwrap();
        assert_eq!((a.gi, a.ci, a.gi_minor, a.ci_minor), (2, 0, 426, 427));
        let b = mig_access(&f.roots, 3, 9, 0, &minors).unwrap();
        assert_eq!((b.gi_minor, b.ci_minor), (489, 490));
        let err = mig_access(&f.roots, 3, 4, 0, &minors)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gpu3/mig/gi4/access") && err.contains("no gpu3/gi4/access line"),
            "{err}"
        );
    }

    #[test]
    fn mig_instances_come_from_the_capabilities_tree() {
        let f = fixture(DEVICES);
        f.gpu("0000:17:00.0", 0, None, "pci0000:16");
        f.gpu("0000:18:00.0", 1, None, "pci0000:16");
        f.mig(1, 2, 0, Some((21, 22)));
        f.mig(1, 1, 0, Some((12, 13)));
        f.mig(1, 1, 1, Some((12, 14)));
        // A monitor and a config line, as the real file starts, then the fixed table.
        let caps = f.roots.proc.join("driver/nvidia-caps");
        fs::create_dir_all(&caps).unwrap();
        fs::write(
            caps.join("mig-minors"),
            "config 1\nmonitor 2\ngpu1/gi9/access 84\ngpu1/gi9/ci0/access 85\n",
        )
        .unwrap();
        f.mig(1, 9, 0, None);
        let inv = probe_at(&f.roots).unwrap();
        assert!(!inv.gpus[0].in_mig_mode());
        let parent = &inv.gpus[1];
        let found: Vec<_> = parent
            .mig_instances()
            .iter()
            .map(|m| {
                let a = m.access.unwrap();
                (m.index, a.gi, a.ci, a.gi_minor, a.ci_minor)
            })
            .collect();
        assert_eq!(
            found,
            [
                (0, 1, 0, 12, 13),
                (1, 1, 1, 12, 14),
                (2, 2, 0, 21, 22),
                (3, 9, 0, 84, 85)
            ]
        );
        assert_eq!(inv.caps_major, Some(237));
        let m = inv.find_mig("1:3").unwrap();
        let nodes: Vec<_> = inv
            .mig_nodes(m)
            .into_iter()
            .map(|n| (n.path, n.major, n.minor))
            .collect();
        assert_eq!(
            nodes,
            [
                ("/dev/nvidia1".to_string(), 195, 1),
                ("/dev/nvidia-caps/nvidia-cap84".to_string(), 237, 84),
                ("/dev/nvidia-caps/nvidia-cap85".to_string(), 237, 85),
            ]
        );
        assert_eq!(m.uuid, format!("MIG-{}/9/0", parent.uuid));
        assert_eq!((m.parent_minor, m.profile_name()), (1, "unknown"));
        // The cache keeps what procfs found.
        let back = crate::host::inventory::from_json(
            &crate::host::inventory::to_json(&inv),
            Path::new("cache"),
        )
        .unwrap();
        assert_eq!(back.gpus, inv.gpus);
    }

    #[test]
    fn a_compute_instance_without_a_minor_is_an_error() {
        let f = fixture(DEVICES);
        f.gpu("0000:17:00.0", 0, None, "pci0000:16");
        f.mig(0, 3, 0, None);
        let err = probe_at(&f.roots).unwrap_err().to_string();
        assert!(
            err.contains("no gpu0/gi3/access line in /proc/driver/nvidia-caps/mig-minors"),
            "{err}"
        );
    }

    #[test]
    fn converts_bus_ids_between_forms() {
        assert_eq!(
            nvml_bus_id("0000:b1:00.0").as_deref(),
            Some("00000000:B1:00.0")
        );
        assert_eq!(
            sysfs_bus_id("00000000:B1:00.0").as_deref(),
            Some("0000:b1:00.0")
        );
        assert_eq!(nvml_bus_id("0000:b1:00"), None);
        assert_eq!(sysfs_bus_id("garbage"), None);
    }
}
