//! `gpupin inventory import`: an inventory file from what `nvidia-smi` prints, so that
//! users can model their own machine (and what-if with `gpupin pick`) without NVML.
//!
//! The matrix of `nvidia-smi topo -m` gives the GPUs, their links and (where printed)
//! their CPU and NUMA affinity; an optional GPU list (`nvidia-smi -L`, or the CSV of
//! `--query-gpu`) gives UUIDs, names, memory and bus ids. Without a list, or where it is
//! silent, GPUs get stand-ins: UUID `GPU-1e0a0000-0000-4000-8000-<index>`, name
//! `unknown` (the bandwidth table's defaults), memory 0 (unknown), bus id
//! `00000000:<index + 1>:00.0`. The device minor is taken to be the index, as it is on
//! most machines; edit the file where it is not.
//!
//! The MIG devices `nvidia-smi -L` lists under a GPU make it a GPU in MIG mode with
//! those instances (index, profile, UUID). That list names no GPU or compute instance
//! ids, so the instances can be modelled (`gpupin pick`) but not given to anyone until
//! `gi` and `ci` are added from `nvidia-smi mig -lgi` and `-lci` (or the inventory comes
//! from NVML or procfs). A GPU in MIG mode with no instances is not told apart there.

mod listing;
mod topo;

use super::file::{DEFAULT_GPU_MAJOR, default_control_nodes};
use crate::model::gpu::{Gpu, Inventory};
use crate::model::link::Link;
use crate::model::mig::MigInstance;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "no GPU columns in the topology text: expected the matrix of `nvidia-smi topo -m`, with a header line GPU0 GPU1 ..."
    )]
    NoHeader,
    #[error("no row for {gpu} in the topology text: expected one row per GPU column")]
    MissingRow { gpu: String },
    #[error("row {gpu} has {found} link entries: expected {expected}, one per column")]
    ShortRow {
        gpu: String,
        found: usize,
        expected: usize,
    },
    #[error(
        "row {row}, column {column}: {cell:?} is not a link: expected X, NV<n>, NVS, PIX, PXB, PHB, NODE, SYS or SOC"
    )]
    BadCell {
        row: String,
        column: String,
        cell: String,
    },
    #[error(
        "GPU list line {line} {text:?}: expected `GPU <index>: <name> (UUID: GPU-...)` (nvidia-smi -L) or a CSV row (nvidia-smi --query-gpu=index,uuid,... --format=csv)"
    )]
    BadListLine { line: usize, text: String },
    #[error("the GPU list has no `{0}` column: expected a CSV header with index and uuid")]
    MissingColumn(&'static str),
    #[error("GPU{index} of the matrix is not in the GPU list: expected every GPU listed")]
    NotListed { index: u32 },
    #[error("the GPU list has GPU {index}, which the matrix has not: expected the same GPUs")]
    NotInMatrix { index: u32 },
    #[error("the result is not a valid inventory: {0}")]
    Invalid(String),
}

/// The inventory described by `topo` (the text of `nvidia-smi topo -m`) and optionally
/// `list` (that of `nvidia-smi -L` or `--query-gpu`); `origin` names it in the result's
/// `source`. It is checked as `gpupin` checks an inventory file.
pub fn import(topo: &str, list: Option<&str>, origin: &Path) -> Result<Inventory, ImportError> {
    let topo = topo::parse(topo)?;
    let listed = list.map(listing::parse).transpose()?.unwrap_or_default();
    if let Some(extra) = listed.iter().find(|l| !topo.indexes.contains(&l.index)) {
        return Err(ImportError::NotInMatrix { index: extra.index });
    }
    let gpus = topo
        .indexes
        .iter()
        .zip(&topo.rows)
        .map(|(&index, row)| {
            let entry = listed.iter().find(|l| l.index == index);
            if list.is_some() && entry.is_none() {
                return Err(ImportError::NotListed { index });
            }
            Ok(gpu(index, row, entry))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let links: Vec<Vec<Link>> = topo.rows.into_iter().map(|r| r.links).collect();
    let inventory = Inventory {
        source: origin.display().to_string(),
        gpu_major: DEFAULT_GPU_MAJOR,
        gpus,
        control_nodes: default_control_nodes(DEFAULT_GPU_MAJOR),
        links: Some(links),
        // The file format's default where there is MIG.
        caps_major: None,
    };
    // Through the file format and back: its checks (a symmetric matrix, X on the
    // diagonal only, unique UUIDs and bus ids) and its order (by index).
    super::from_json(&super::to_json(&inventory), origin).map_err(|e| match e {
        super::InventoryError::Invalid { reason, .. } => ImportError::Invalid(reason),
        other => ImportError::Invalid(crate::base::message::one_line(&other)),
    })
}

fn gpu(index: u32, row: &topo::Row, listed: Option<&listing::Listed>) -> Gpu {
    let stand_in_bus = format!("00000000:{:02X}:00.0", index + 1);
    let mut gpu = Gpu {
        index,
        uuid: listed.map_or_else(
            || format!("GPU-1e0a0000-0000-4000-8000-{index:012x}"),
            |l| l.uuid.clone(),
        ),
        name: listed
            .and_then(|l| l.name.clone())
            .unwrap_or_else(|| "unknown".to_string()),
        memory_bytes: listed.and_then(|l| l.memory_bytes).unwrap_or(0),
        pci_bus_id: listed
            .and_then(|l| l.pci_bus_id.clone())
            .unwrap_or(stand_in_bus),
        minor: index,
        numa_node: row.numa,
        local_cpus: row.cpus.clone(),
        mig: None,
    };
    let listed_mig = listed.map(|l| l.mig.as_slice()).unwrap_or_default();
    if !listed_mig.is_empty() {
        let instances = listed_mig
            .iter()
            .map(|m| MigInstance {
                index: m.index,
                uuid: m.uuid.clone(),
                profile: Some(m.profile.clone()),
                memory_bytes: 0,
                access: None,
                parent_index: gpu.index,
                parent_uuid: gpu.uuid.clone(),
                parent_minor: gpu.minor,
            })
            .collect();
        gpu.mig = Some(instances);
    }
    gpu
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPO: &str = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n\
                        GPU0\t X \tNV4\t0-7\t0\n\
                        GPU1\tNV4\t X \t8-15\t1\n";

    #[test]
    fn without_a_list_gpus_get_stand_ins() {
        let inv = import(TOPO, None, Path::new("topo.txt")).unwrap();
        assert_eq!(inv.source, "topo.txt");
        assert_eq!(inv.gpus[1].uuid, "GPU-1e0a0000-0000-4000-8000-000000000001");
        assert_eq!(inv.gpus[1].pci_bus_id, "00000000:02:00.0");
        assert_eq!(inv.gpus[1].name, "unknown");
        assert_eq!(inv.gpus[1].numa_node, Some(1));
        assert_eq!(inv.gpus[1].local_cpus.as_deref(), Some("8-15"));
        assert_eq!(inv.link(0, 1), Some(Link::NvLink(4)));
    }

    #[test]
    fn mig_devices_of_the_list_become_instances() {
        let list = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-a)\n  MIG 3g.40gb     Device  0: (UUID: MIG-b)\n  MIG 1g.10gb     Device  1: (UUID: MIG-c)\nGPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-d)\n";
        let inv = import(TOPO, Some(list), Path::new("t")).unwrap();
        let mig = inv.gpus[0].mig_instances();
        assert_eq!(mig.len(), 2);
        assert_eq!(
            (mig[1].address(), mig[1].profile_name()),
            ("0:1".into(), "1g.10gb")
        );
        assert_eq!((mig[1].uuid.as_str(), mig[1].access), ("MIG-c", None));
        assert_eq!(mig[1].parent_uuid, "GPU-a");
        assert!(!inv.gpus[1].in_mig_mode());
        let bad = list.replace("1g.10gb ", "10gb ");
        let err = import(TOPO, Some(&bad), Path::new("t"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gpus[0].mig[1].profile \"10gb\""), "{err}");
    }

    #[test]
    fn the_list_must_match_the_matrix() {
        let one = "GPU 0: NVIDIA RTX A6000 (UUID: GPU-a)\n";
        let err = import(TOPO, Some(one), Path::new("t")).unwrap_err();
        assert!(
            err.to_string()
                .contains("GPU1 of the matrix is not in the GPU list")
        );
        let three = "GPU 0: A (UUID: GPU-a)\nGPU 1: A (UUID: GPU-b)\nGPU 2: A (UUID: GPU-c)\n";
        let err = import(TOPO, Some(three), Path::new("t")).unwrap_err();
        assert!(err.to_string().contains("GPU 2, which the matrix has not"));
        let twice = "GPU 0: A (UUID: GPU-a)\nGPU 1: A (UUID: GPU-a)\n";
        let err = import(TOPO, Some(twice), Path::new("t"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("gpus[1].uuid") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn an_asymmetric_matrix_is_refused() {
        let text = "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tPIX\t X \n";
        let err = import(text, None, Path::new("t")).unwrap_err().to_string();
        assert!(err.contains("symmetric"), "{err}");
    }
}
