//! The JSON inventory format: simulated machines, users' what-if runs, and the cache.
//!
//! ```json
//! {
//!   "gpu_major": 195,
//!   "control_nodes": [
//!     {"path": "/dev/nvidiactl", "major": 195, "minor": 255},
//!     {"path": "/dev/nvidia-uvm", "major": 510, "minor": 0},
//!     {"path": "/dev/nvidia-uvm-tools", "major": 510, "minor": 1}
//!   ],
//!   "gpus": [
//!     {"index": 0, "uuid": "GPU-5a1e0001-0000-4000-8000-000000000000",
//!      "name": "NVIDIA H100 80GB HBM3", "memory": "80GiB", "pci_bus_id": "00000000:18:00.0",
//!      "minor": 0, "numa_node": 0, "local_cpus": "0-15"},
//!     {"index": 1, "uuid": "GPU-5a1e0001-0000-4000-8000-000000000001",
//!      "name": "NVIDIA H100 80GB HBM3", "memory": 85899345920, "pci_bus_id": "00000000:2A:00.0",
//!      "minor": 1, "numa_node": 0, "local_cpus": "0-15"}
//!   ],
//!   "topology": [["X", "NVS"], ["NVS", "X"]]
//! }
//! ```
//!
//! - `gpu_major` (optional, default 195): major number of `/dev/nvidia<minor>`.
//! - `control_nodes` (optional): the nodes every GPU container needs, each with a `path`
//!   under `/dev/`. Default: `/dev/nvidiactl` gpu_major:255, `/dev/nvidia-uvm` 510:0 and
//!   `/dev/nvidia-uvm-tools` 510:1. On a real host the uvm major is assigned dynamically
//!   (see `/proc/devices`), so 510 is only a stand-in for simulated machines; list the nodes
//!   explicitly to describe a real one. No `nvidia-modeset` by default: CUDA does not need it.
//! - `gpus` (required, at least one), each with:
//!   - `index` (required): the NVML / nvidia-smi index;
//!   - `uuid` (required): `GPU-...`, without spaces or commas;
//!   - `name` (required): the model, e.g. `NVIDIA H100 80GB HBM3`;
//!   - `memory` (optional, default 0 = unknown): total memory, either a number of bytes or a
//!     string with a binary unit: `B`, `KiB`, `MiB`, `GiB`, `TiB` (`"81559MiB"`, `"80GiB"`);
//!     decimal units such as `GB` are refused as ambiguous;
//!   - `pci_bus_id` (required): in NVML's form, `00000000:17:00.0`;
//!   - `minor` (required): the device minor, `/dev/nvidia<minor>`; need not equal `index`;
//!   - `numa_node` (optional): the NUMA node the GPU is attached to;
//!   - `local_cpus` (optional): the host CPUs near the GPU as a cpulist, `0-15,32-47`;
//!   - `mig` (optional): present when the GPU is in MIG mode, its instances (`mig_file`).
//! - `caps_major` (optional): major of the MIG capability nodes (`nvidia-caps` in
//!   `/proc/devices`, assigned dynamically). Default where a GPU is in MIG mode: 511, a
//!   stand-in as the uvm major is; none otherwise.
//! - `topology` (optional): an n x n matrix in `nvidia-smi topo -m` notation (`X`, `NVS`,
//!   `NV<n>`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`), rows and columns in the order of `gpus` in
//!   the file. `X` on the diagonal and only there; the matrix must be symmetric.
//!
//! Unknown keys are errors, as are duplicate indexes, UUIDs (case-insensitive), minors and
//! bus ids, and a GPU node that collides with a control node. GPUs are sorted by index on
//! load. `to_json` writes this format with memory in bytes; the `source` of an inventory
//! is not part of it: `from_json` takes it from the file's path.

use super::{InventoryError, cpulist, mig_file};
use crate::base::safe_open::{self, Links};
use crate::model::gpu::{DeviceNode, Gpu, Inventory};
use crate::model::link::Link;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::path::Path;

/// The GPU major on every driver seen; the default of `gpu_major`.
pub(super) const DEFAULT_GPU_MAJOR: u32 = 195;
/// A stand-in for the dynamically assigned `nvidia-uvm` major (see the module docs).
pub(super) const DEFAULT_UVM_MAJOR: u32 = 510;
/// A stand-in for the dynamically assigned `nvidia-caps` major (see the module docs).
pub(super) const DEFAULT_CAPS_MAJOR: u32 = 511;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    #[serde(default = "default_gpu_major")]
    gpu_major: u32,
    #[serde(default)]
    control_nodes: Option<Vec<Node>>,
    gpus: Vec<DocGpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topology: Option<Vec<Vec<Link>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    caps_major: Option<u32>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Node {
    path: String,
    major: u32,
    minor: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DocGpu {
    index: u32,
    uuid: String,
    name: String,
    /// Kept as a `Value` so a bad size is reported with its field, not as a serde type error.
    #[serde(default)]
    memory: Value,
    pci_bus_id: String,
    minor: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    numa_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    local_cpus: Option<String>,
    /// Present when the GPU is in MIG mode (`mig_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mig: Option<Vec<mig_file::DocMig>>,
}

fn default_gpu_major() -> u32 {
    DEFAULT_GPU_MAJOR
}

/// The control nodes of a file without `control_nodes`, and of the simulated machines.
pub(super) fn default_control_nodes(gpu_major: u32) -> Vec<DeviceNode> {
    vec![
        node(super::CTL_NODE, gpu_major, 255),
        node(super::UVM_NODE, DEFAULT_UVM_MAJOR, 0),
        node(super::UVM_TOOLS_NODE, DEFAULT_UVM_MAJOR, 1),
    ]
}

pub(super) fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
    DeviceNode {
        path: path.to_string(),
        major,
        minor,
    }
}

/// Reads an inventory file; a link is followed (admins name it), anything but a regular
/// file is refused without blocking.
pub(crate) fn load(path: &Path) -> Result<Inventory, InventoryError> {
    let text =
        safe_open::read_to_string(path, Links::Follow).map_err(|source| InventoryError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    from_json(&text, path)
}

/// Parses the JSON inventory format; `origin` names the source in errors.
pub fn from_json(text: &str, origin: &Path) -> Result<Inventory, InventoryError> {
    let doc: Doc = serde_json::from_str(text).map_err(|e| invalid(origin, e.to_string()))?;
    build(doc, origin.display().to_string()).map_err(|reason| invalid(origin, reason))
}

/// Like `from_json`, for an inventory embedded in a larger document (the cache).
pub(super) fn from_value(value: Value, origin: &Path) -> Result<Inventory, InventoryError> {
    let doc: Doc = serde_json::from_value(value).map_err(|e| invalid(origin, e.to_string()))?;
    build(doc, origin.display().to_string()).map_err(|reason| invalid(origin, reason))
}

/// Serializes to the JSON inventory format (the same one `from_json` reads).
pub fn to_json(inv: &Inventory) -> String {
    pretty(&to_doc(inv))
}

pub(super) fn to_value(inv: &Inventory) -> Value {
    // Only strings, numbers and lists: serializing cannot fail.
    serde_json::to_value(to_doc(inv)).expect("an inventory always serializes")
}

fn invalid(path: &Path, reason: String) -> InventoryError {
    InventoryError::Invalid {
        path: path.to_path_buf(),
        reason,
    }
}

fn build(doc: Doc, source: String) -> Result<Inventory, String> {
    if doc.gpus.is_empty() {
        return Err("gpus is empty: list at least one GPU".to_string());
    }
    let gpus = doc
        .gpus
        .into_iter()
        .enumerate()
        .map(|(i, g)| convert_gpu(i, g))
        .collect::<Result<Vec<_>, _>>()?;
    check_unique(&gpus, "index", |g| g.index)?;
    check_unique(&gpus, "uuid", |g| g.uuid.to_ascii_lowercase())?;
    check_unique(&gpus, "minor", |g| g.minor)?;
    check_unique(&gpus, "pci_bus_id", |g| g.pci_bus_id.to_ascii_lowercase())?;
    mig_file::check_unique(&gpus)?;
    let control_nodes = match doc.control_nodes {
        Some(nodes) => nodes
            .into_iter()
            .map(|n| node(&n.path, n.major, n.minor))
            .collect(),
        None => default_control_nodes(doc.gpu_major),
    };
    check_control_nodes(&control_nodes, &gpus, doc.gpu_major)?;
    if let Some(matrix) = &doc.topology {
        check_topology(matrix, gpus.len())?;
    }
    let (gpus, links) = sort_by_index(gpus, doc.topology);
    let has_mig = gpus.iter().any(Gpu::in_mig_mode);
    Ok(Inventory {
        source,
        gpu_major: doc.gpu_major,
        gpus,
        control_nodes,
        links,
        caps_major: doc.caps_major.or(has_mig.then_some(DEFAULT_CAPS_MAJOR)),
    })
}

fn convert_gpu(i: usize, g: DocGpu) -> Result<Gpu, String> {
    check_uuid(&g.uuid).map_err(|why| format!("gpus[{i}].uuid {:?}: {why}", g.uuid))?;
    if g.pci_bus_id.is_empty() || g.pci_bus_id.contains(char::is_whitespace) {
        return Err(format!(
            "gpus[{i}].pci_bus_id {:?}: expected a bus id such as 00000000:17:00.0",
            g.pci_bus_id
        ));
    }
    if let Some(cpus) = &g.local_cpus
        && (cpus.trim().is_empty() || cpulist::parse(cpus).is_none())
    {
        return Err(format!(
            "gpus[{i}].local_cpus {cpus:?}: expected a cpulist such as 0-15,32-47 (omit the key when unknown)"
        ));
    }
    let memory_bytes =
        memory_bytes(&g.memory).map_err(|why| format!("gpus[{i}].memory {}: {why}", g.memory))?;
    let mut gpu = Gpu {
        index: g.index,
        uuid: g.uuid,
        name: g.name,
        memory_bytes,
        pci_bus_id: g.pci_bus_id,
        minor: g.minor,
        numa_node: g.numa_node,
        local_cpus: g.local_cpus,
        mig: None,
    };
    if let Some(docs) = g.mig {
        gpu.mig = Some(mig_file::convert(i, &gpu, docs, self::memory_bytes)?);
    }
    Ok(gpu)
}

/// UUIDs end up in NVIDIA_VISIBLE_DEVICES, a comma-separated list where a `GPU-` prefix
/// tells a UUID from an index.
fn check_uuid(uuid: &str) -> Result<(), &'static str> {
    if !uuid.starts_with("GPU-") || uuid.len() == 4 {
        return Err("expected GPU- followed by the UUID");
    }
    if uuid.contains(|c: char| c.is_whitespace() || c == ',') {
        return Err("must not contain spaces or commas");
    }
    Ok(())
}

fn memory_bytes(value: &Value) -> Result<u64, String> {
    match value {
        Value::Null => Ok(0),
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| "expected a whole number of bytes".to_string()),
        Value::String(s) => crate::base::units::parse_size(s),
        _ => Err("expected a number of bytes or a size such as \"80GiB\"".to_string()),
    }
}

/// Rejects the second GPU that has the same `key` as an earlier one.
fn check_unique<K: Eq + Hash + Debug>(
    gpus: &[Gpu],
    field: &str,
    key: impl Fn(&Gpu) -> K,
) -> Result<(), String> {
    let mut seen = HashMap::new();
    for (i, gpu) in gpus.iter().enumerate() {
        if let Some(first) = seen.insert(key(gpu), i) {
            return Err(format!(
                "gpus[{i}].{field} {:?} is also used by gpus[{first}]",
                key(gpu)
            ));
        }
    }
    Ok(())
}

fn check_control_nodes(nodes: &[DeviceNode], gpus: &[Gpu], gpu_major: u32) -> Result<(), String> {
    let mut seen = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        if !is_dev_path(&n.path) {
            return Err(format!(
                "control_nodes[{i}].path {:?}: expected a normalized path under /dev/",
                n.path
            ));
        }
        if let Some(first) = seen.insert(n.path.as_str(), i) {
            return Err(format!(
                "control_nodes[{i}].path {:?} is also used by control_nodes[{first}]",
                n.path
            ));
        }
        if let Some(g) = gpus.iter().find(|g| {
            n.path == crate::model::nvidia::gpu_node(g.minor)
                || (n.major, n.minor) == (gpu_major, g.minor)
        }) {
            return Err(format!(
                "control_nodes[{i}] {} {}:{} collides with the node of GPU index {} (minor {})",
                n.path, n.major, n.minor, g.index, g.minor
            ));
        }
    }
    Ok(())
}

/// `/dev/x/y` with no empty, `.` or `..` segment: the path is created inside a container.
fn is_dev_path(path: &str) -> bool {
    path.strip_prefix("/dev/").is_some_and(|rest| {
        rest.split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
    })
}

fn check_topology(matrix: &[Vec<Link>], n: usize) -> Result<(), String> {
    if matrix.len() != n {
        return Err(format!(
            "topology has {} rows for {n} gpus: expected an {n} x {n} matrix",
            matrix.len()
        ));
    }
    if let Some((a, row)) = matrix.iter().enumerate().find(|(_, row)| row.len() != n) {
        return Err(format!(
            "topology[{a}] has {} entries: expected {n}",
            row.len()
        ));
    }
    for a in 0..n {
        for b in 0..n {
            check_link(matrix, a, b)?;
        }
    }
    Ok(())
}

fn check_link(matrix: &[Vec<Link>], a: usize, b: usize) -> Result<(), String> {
    let link = matrix[a][b];
    if a == b && link != Link::SelfLink {
        return Err(format!(
            "topology[{a}][{a}] is {link}: the diagonal must be X"
        ));
    }
    if a != b && link == Link::SelfLink {
        return Err(format!(
            "topology[{a}][{b}] is X: X belongs on the diagonal only"
        ));
    }
    if matrix[b][a] != link {
        return Err(format!(
            "topology[{a}][{b}] is {link} but topology[{b}][{a}] is {}: the matrix must be symmetric",
            matrix[b][a]
        ));
    }
    Ok(())
}

/// Sorts GPUs by index and permutes the matrix with them (its rows follow the file's order).
fn sort_by_index(
    gpus: Vec<Gpu>,
    links: Option<Vec<Vec<Link>>>,
) -> (Vec<Gpu>, Option<Vec<Vec<Link>>>) {
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    order.sort_by_key(|&i| gpus[i].index);
    let links = links.map(|m| {
        order
            .iter()
            .map(|&a| order.iter().map(|&b| m[a][b]).collect())
            .collect()
    });
    let gpus = order.iter().map(|&i| gpus[i].clone()).collect();
    (gpus, links)
}

fn to_doc(inv: &Inventory) -> Doc {
    Doc {
        gpu_major: inv.gpu_major,
        control_nodes: Some(
            inv.control_nodes
                .iter()
                .map(|n| Node {
                    path: n.path.clone(),
                    major: n.major,
                    minor: n.minor,
                })
                .collect(),
        ),
        gpus: inv.gpus.iter().map(to_doc_gpu).collect(),
        topology: inv.links.clone(),
        caps_major: inv.caps_major,
    }
}

fn to_doc_gpu(g: &Gpu) -> DocGpu {
    DocGpu {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        memory: Value::from(g.memory_bytes),
        pci_bus_id: g.pci_bus_id.clone(),
        minor: g.minor,
        numa_node: g.numa_node,
        local_cpus: g.local_cpus.clone(),
        mig: g
            .mig
            .as_ref()
            .map(|list| list.iter().map(mig_file::to_doc).collect()),
    }
}

/// Pretty JSON, except that lists nested in lists (the topology rows) stay on one line,
/// so the matrix reads like `nvidia-smi topo -m`.
pub(super) fn pretty<T: Serialize>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, RowFormatter::default());
    // Writing to a Vec cannot fail, and our documents have string keys only.
    value
        .serialize(&mut ser)
        .expect("a document always serializes");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

#[derive(Default)]
struct RowFormatter {
    pretty: serde_json::ser::PrettyFormatter<'static>,
    array_depth: usize,
}

impl serde_json::ser::Formatter for RowFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.array_depth += 1;
        match self.array_depth {
            1 => self.pretty.begin_array(w),
            _ => w.write_all(b"["),
        }
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.array_depth -= 1;
        match self.array_depth {
            0 => self.pretty.end_array(w),
            _ => w.write_all(b"]"),
        }
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        match (self.array_depth, first) {
            (1, _) => self.pretty.begin_array_value(w, first),
            (_, true) => Ok(()),
            (_, false) => w.write_all(b", "),
        }
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        match self.array_depth {
            1 => self.pretty.end_array_value(w),
            _ => Ok(()),
        }
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.pretty.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.pretty.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.pretty.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.pretty.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.pretty.end_object_value(w)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::mig::MigAccess;

    const ORIGIN: &str = "/etc/gpupin/machine.json";

    fn parse(text: &str) -> Result<Inventory, String> {
        from_json(text, Path::new(ORIGIN)).map_err(|e| e.to_string())
    }

    fn gpu_json(index: u32, minor: u32, bus: &str) -> String {
        format!(
            r#"{{"index":{index},"uuid":"GPU-{index}","name":"NVIDIA A100","memory":"40GiB","pci_bus_id":"{bus}","minor":{minor}}}"#
        )
    }

    fn two_gpus(extra: &str) -> String {
        format!(
            r#"{{"gpus":[{},{}]{extra}}}"#,
            gpu_json(1, 3, "00000000:2A:00.0"),
            gpu_json(0, 7, "00000000:18:00.0")
        )
    }

    fn assert_err(text: &str, wanted: &str) {
        let err = parse(text).unwrap_err();
        assert!(err.contains(ORIGIN), "{err}");
        assert!(err.contains(wanted), "wanted {wanted:?} in {err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn fills_defaults_and_parses_sizes() {
        let inv = parse(&two_gpus("")).unwrap();
        assert_eq!(inv.source, ORIGIN);
        assert_eq!(inv.gpu_major, 195);
        assert_eq!(inv.control_nodes, default_control_nodes(195));
        assert_eq!(inv.gpus[0].memory_bytes, 40 << 30);
        assert_eq!(inv.gpus[0].numa_node, None);
        assert_eq!(inv.links, None);
    }

    #[test]
    fn accepts_memory_as_bytes_and_units() {
        for (memory, bytes) in [
            ("81559MiB", 81559u64 << 20),
            ("1024", 1024),
            ("2 TiB", 2 << 40),
        ] {
            assert_eq!(
                crate::base::units::parse_size(memory),
                Ok(bytes),
                "{memory}"
            );
        }
        let text = two_gpus("").replace(r#""40GiB""#, "85899345920");
        assert_eq!(parse(&text).unwrap().gpus[1].memory_bytes, 85899345920);
    }

    #[test]
    fn sorts_gpus_by_index_and_permutes_the_matrix() {
        let rows = r#","topology":[["X","PIX","SYS"],["PIX","X","NV4"],["SYS","NV4","X"]]"#;
        let text = format!(
            r#"{{"gpus":[{},{},{}]{rows}}}"#,
            gpu_json(2, 2, "c"),
            gpu_json(0, 0, "a"),
            gpu_json(1, 1, "b")
        );
        let inv = parse(&text).unwrap();
        let indexes: Vec<u32> = inv.gpus.iter().map(|g| g.index).collect();
        assert_eq!(indexes, [0, 1, 2]);
        // File rows were 2, 0, 1: now 0 (file row 1), 1 (file row 2), 2 (file row 0).
        assert_eq!(inv.link(0, 1), Some(Link::NvLink(4)));
        assert_eq!(inv.link(0, 2), Some(Link::PcieSwitch));
        assert_eq!(inv.link(1, 2), Some(Link::CrossSocket));
    }

    #[test]
    fn round_trips_through_to_json() {
        let text = two_gpus(r#","topology":[["X","NV12"],["NV12","X"]],"gpu_major":200"#).replace(
            r#""minor":7}"#,
            r#""minor":7,"numa_node":1,"local_cpus":"0-3,8"}"#,
        );
        let inv = parse(&text).unwrap();
        let written = to_json(&inv);
        assert_eq!(parse(&written).unwrap(), inv);
        assert!(written.contains(r#"["X", "NV12"]"#), "{written}");
        let value = to_value(&inv);
        assert_eq!(from_value(value, Path::new(ORIGIN)).unwrap(), inv);
    }

    fn with_mig(mig: &str) -> String {
        two_gpus("").replace(r#""minor":7}"#, &format!(r#""minor":7,"mig":{mig}}}"#))
    }

    const MIG_1G: &str =
        r#"{"index":1,"uuid":"MIG-b","profile":"1g.10gb","memory":"9728MiB","gi":9,"ci":0}"#;
    const MIG_3G: &str = r#"{"index":0,"uuid":"MIG-a","profile":"3g.40gb","gi":2,"ci":0,"gi_minor":500,"ci_minor":501}"#;

    #[test]
    fn mig_instances_sit_under_their_parent_and_round_trip() {
        let inv = parse(&with_mig(&format!("[{MIG_1G},{MIG_3G}]"))).unwrap();
        let parent = &inv.gpus[0];
        assert_eq!((parent.index, parent.minor), (0, 7));
        let mig = parent.mig_instances();
        assert_eq!(mig[0].profile_name(), "3g.40gb");
        assert_eq!(mig[0].access.unwrap().gi_minor, 500);
        // Minors left out come from the driver's table, for the parent's minor 7.
        assert_eq!(mig[1].access, Some(MigAccess::standard(7, 9, 0)));
        assert_eq!(mig[1].memory_bytes, 9728 << 20);
        assert_eq!((mig[1].parent_index, mig[1].parent_minor), (0, 7));
        assert_eq!(mig[1].parent_uuid, "GPU-0");
        assert!(!inv.gpus[1].in_mig_mode());
        assert_eq!(inv.find_mig("0:1").unwrap().uuid, "MIG-b");
        assert_eq!(parse(&to_json(&inv)).unwrap(), inv);
        // MIG mode with no instances is kept as such.
        let empty = parse(&with_mig("[]")).unwrap();
        assert!(empty.gpus[0].in_mig_mode());
        assert_eq!(parse(&to_json(&empty)).unwrap(), empty);
        // An instance without ids: modelled, not given.
        let bare = parse(&with_mig(r#"[{"index":0,"uuid":"MIG-c"}]"#)).unwrap();
        assert_eq!(bare.gpus[0].mig_instances()[0].access, None);
        assert_eq!(bare.gpus[0].mig_instances()[0].profile_name(), "unknown");
    }

    #[test]
    fn rejects_bad_mig_instances() {
        assert_err(
            &with_mig(r#"[{"index":0,"uuid":"GPU-x"}]"#),
            "gpus[1].mig[0].uuid \"GPU-x\": expected MIG-",
        );
        assert_err(
            &with_mig(r#"[{"index":0,"uuid":"MIG-x","profile":"big"}]"#),
            "gpus[1].mig[0].profile \"big\": expected a MIG profile such as 1g.10gb",
        );
        assert_err(
            &with_mig(r#"[{"index":0,"uuid":"MIG-x","gi":1}]"#),
            "gpus[1].mig[0]: gi and ci go together",
        );
        assert_err(
            &with_mig(&format!("[{MIG_1G},{}]", MIG_1G.replace("MIG-b", "MIG-c"))),
            "MIG instance 0:1: index 1 is listed twice under GPU index 0",
        );
        assert_err(
            &with_mig(&format!("[{MIG_1G},{}]", MIG_3G.replace("MIG-a", "MIG-B"))),
            "MIG instance 0:1: uuid \"MIG-b\" is also used by MIG instance 0:0",
        );
        assert_err(
            &with_mig(&format!(
                "[{MIG_3G},{}]",
                MIG_1G.replace("\"gi\":9", "\"gi\":2")
            )),
            "MIG instance 0:1: gi 2 ci 0 is also used by MIG instance 0:0",
        );
        assert_err(
            &with_mig(&format!(
                "[{MIG_3G},{}]",
                MIG_1G.replace("\"ci\":0", "\"ci\":0,\"gi_minor\":9,\"ci_minor\":501")
            )),
            "capability minor 501 is also used by MIG instance 0:0",
        );
        assert_err(
            &with_mig(r#"[{"index":0,"uuid":"MIG-x","size":1}]"#),
            "unknown field `size`",
        );
    }

    #[test]
    fn rejects_duplicates() {
        let dup_index =
            two_gpus("").replace(r#""index":1,"uuid":"GPU-1""#, r#""index":0,"uuid":"GPU-1""#);
        assert_err(&dup_index, "gpus[1].index 0 is also used by gpus[0]");
        let dup_uuid = two_gpus("")
            .replace("\"GPU-1\"", "\"GPU-A\"")
            .replace("\"GPU-0\"", "\"GPU-a\"");
        assert_err(&dup_uuid, "gpus[1].uuid \"gpu-a\" is also used by gpus[0]");
        let dup_minor = two_gpus("").replace(r#""minor":7"#, r#""minor":3"#);
        assert_err(&dup_minor, "gpus[1].minor 3 is also used by gpus[0]");
        let dup_bus = two_gpus("").replace("2A:00", "18:00");
        assert_err(&dup_bus, "pci_bus_id");
    }

    #[test]
    fn rejects_bad_gpu_fields() {
        assert_err(
            &two_gpus("").replace("\"GPU-1\"", "\"\""),
            "gpus[0].uuid \"\"",
        );
        assert_err(
            &two_gpus("").replace("\"GPU-1\"", "\"GPU-1,GPU-2\""),
            "commas",
        );
        assert_err(
            &two_gpus("").replace("\"40GiB\"", "\"40 gigs\""),
            "gpus[0].memory \"40 gigs\"",
        );
        assert_err(
            &two_gpus("").replace("\"40GiB\"", "-1"),
            "gpus[0].memory -1",
        );
        assert_err(
            &two_gpus("").replace(r#""minor":3"#, r#""minor":3,"local_cpus":"x""#),
            "gpus[0].local_cpus \"x\"",
        );
        assert_err(r#"{"gpus":[]}"#, "gpus is empty");
    }

    #[test]
    fn rejects_unknown_fields() {
        assert_err(&two_gpus(r#","gpu_count":2"#), "unknown field `gpu_count`");
        let text = two_gpus("").replace(r#""minor":3"#, r#""minor":3,"uuid2":"x""#);
        assert_err(&text, "unknown field `uuid2`");
    }

    #[test]
    fn rejects_bad_matrices() {
        assert_err(
            &two_gpus(r#","topology":[["X","NVS"]]"#),
            "topology has 1 rows for 2 gpus",
        );
        assert_err(
            &two_gpus(r#","topology":[["X"],["NVS","X"]]"#),
            "topology[0] has 1 entries",
        );
        assert_err(
            &two_gpus(r#","topology":[["NVS","NVS"],["NVS","X"]]"#),
            "topology[0][0] is NVS: the diagonal must be X",
        );
        assert_err(
            &two_gpus(r#","topology":[["X","X"],["X","X"]]"#),
            "topology[0][1] is X",
        );
        assert_err(
            &two_gpus(r#","topology":[["X","PIX"],["SYS","X"]]"#),
            "topology[0][1] is PIX but topology[1][0] is SYS",
        );
        assert_err(
            &two_gpus(r#","topology":[["X","NV0"],["NV0","X"]]"#),
            "invalid link \"NV0\"",
        );
    }

    #[test]
    fn rejects_bad_control_nodes() {
        let nodes = |path: &str| {
            two_gpus(&format!(
                r#","control_nodes":[{{"path":"{path}","major":195,"minor":255}}]"#
            ))
        };
        for bad in [
            "/etc/passwd",
            "/dev/",
            "/dev/../etc/x",
            "dev/nvidiactl",
            "/dev//x",
        ] {
            assert_err(&nodes(bad), "control_nodes[0].path");
        }
        assert_err(
            &nodes("/dev/nvidia3"),
            "collides with the node of GPU index 1",
        );
        let twice = two_gpus(
            r#","control_nodes":[{"path":"/dev/a","major":1,"minor":1},{"path":"/dev/a","major":1,"minor":2}]"#,
        );
        assert_err(
            &twice,
            "control_nodes[1].path \"/dev/a\" is also used by control_nodes[0]",
        );
        let explicit = parse(&nodes("/dev/nvidiactl")).unwrap();
        assert_eq!(
            explicit.control_nodes,
            vec![node("/dev/nvidiactl", 195, 255)]
        );
    }

    #[test]
    fn reports_syntax_errors_with_the_file() {
        assert_err("{", "EOF");
    }

    /// A FIFO at `name` in a new temp dir (kept alive by the returned guard).
    pub(in crate::host::inventory) fn fifo(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        (dir, path)
    }

    /// Runs `f` on a thread and fails if it has not returned within 5 s: opening a FIFO
    /// for reading blocks until a writer comes, which may be never.
    pub(in crate::host::inventory) fn within_5s<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("still blocked after 5 s")
    }

    #[test]
    fn a_fifo_as_inventory_file_is_refused_without_blocking() {
        let (_dir, path) = fifo("machine.json");
        let shown = path.clone();
        let err = within_5s(move || load(&path).unwrap_err());
        let line = crate::base::message::one_line(&err);
        assert!(line.contains(&shown.display().to_string()), "{line}");
        assert!(line.contains("FIFO"), "{line}");
    }

    #[test]
    fn a_symlinked_inventory_file_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.json");
        std::fs::write(&target, two_gpus("")).unwrap();
        let link = dir.path().join("machine.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(load(&link).unwrap().gpus.len(), 2);
    }
}
