//! Built-in simulated machines, for trying gpupin (and testing it) without GPUs.
//!
//! - `nvswitch8`: eight `NVIDIA H100 80GB HBM3` (81559 MiB, as NVML reports it) on an
//!   NVSwitch, like a DGX/HGX H100: every pair is `NVS`; GPUs 0-3 on NUMA node 0, 4-7 on 1.
//! - `pcie8`: eight `NVIDIA L40S` (46068 MiB) without NVLink in a two-socket server. Each
//!   socket has two PCIe switches with two GPUs each: GPUs on one switch are `PIX`, on the
//!   same socket but different switches `NODE`, across sockets `SYS`. `NODE` rather than
//!   `PXB` because on current Intel and AMD servers each x16 root port sits behind its own
//!   host bridge, so two switches on one socket meet only at the CPU's internal fabric;
//!   `PXB` would need both switches under one upstream switch.
//! - `cubemesh8`: eight `Tesla V100-SXM2-32GB` (32768 MiB) in the NVLink hybrid cube-mesh
//!   of the first NVLink servers (DGX-1 with V100), with that machine's `topo -m` matrix.
//!   Two quads (GPUs 0-3 on NUMA node 0, 4-7 on 1), each fully linked: in each quad the
//!   pairs (0,3), (1,2), (2,3) (counted within the quad) have two links (`NV2`), the
//!   others one (`NV1`). Across quads only GPU i and i+4 are linked: `NV2` for i = 0, 1,
//!   `NV1` for i = 2, 3. Every GPU uses its six V100 links. The unlinked pairs all cross
//!   the sockets, so they are `SYS`, as nvidia-smi shows them there. So the best pairs are
//!   the `NV2` pairs, and the only fully linked quads are the two halves.
//! - `nvswitch16`: sixteen `Tesla V100-SXM3-32GB` (32768 MiB) on NVSwitches, like a DGX-2:
//!   every pair is `NVS`; GPUs 0-7 on NUMA node 0, 8-15 on 1.
//! - `dgxa100`: eight `NVIDIA A100-SXM4-80GB` (81920 MiB) as a DGX A100 shows them:
//!   every pair `NV12` (the twelve links of each GPU, through the NVSwitches).
//! - `hgxh200`: eight `NVIDIA H200` (143771 MiB) on an HGX board (H100, H200 and B200
//!   boards look the same): every pair `NV18`.
//! - `gh200pair`: two `NVIDIA GH200 480GB` (97871 MiB) superchips in one node, each with
//!   its own Grace CPU (NUMA node 0 and 1), joined by all eighteen links of each
//!   Hopper (`NV18`).
//! - `pcie8pxb`: eight `NVIDIA RTX 6000 Ada Generation` (49140 MiB), no NVLink, in a
//!   two-socket server whose sockets each have one PCIe switch feeding two switches of
//!   two GPUs: `PIX` under a switch, `PXB` between the two switches of a socket, `SYS`
//!   across sockets.
//! - `nvbridge4`: four `NVIDIA RTX A6000` (49140 MiB) with NVLink bridges in pairs, 0-1
//!   and 2-3 (`NV4`), one pair per socket: `SYS` between the pairs.
//!
//! - `dgxa100mig`: `dgxa100` with MIG: GPU 0 in MIG mode cut into `3g.40gb` (GI 2),
//!   `2g.20gb` (GI 3) and two `1g.10gb` (GI 9 and 10), GPU 7 in MIG mode with no
//!   instances yet, the others whole.
//! - `nvswitch8mig`: `nvswitch8` with GPUs 0 and 1 each in MIG mode cut into seven
//!   `1g.10gb` (GI 7 to 13), the others whole.
//!
//! MIG instances have compute instance 0 of their GPU instance, capability minors from
//! the driver's fixed table (`MigAccess::standard`) and UUIDs
//! `MIG-5a1e<machine>-<gpu>-4000-8000-<mig index>`.
//!
//! All use GPU major 195, minors equal to indexes, and the default control nodes of the
//! file format (nvidiactl 195:255, nvidia-uvm 510:0, nvidia-uvm-tools 510:1). These are
//! fake: a container gets nodes with these numbers, nothing on the host is touched. UUIDs
//! are `GPU-5a1e<machine>-0000-4000-8000-<index>`, distinct across machines.
//!
//! The two simulated NUMA nodes map onto the host's real online CPUs (first half, second
//! half; all of them for both with a single CPU), so cpusets built from `local_cpus` are
//! valid on the host that runs the simulation.

use super::file::{DEFAULT_CAPS_MAJOR, DEFAULT_GPU_MAJOR, default_control_nodes};
use super::{InventoryError, cpulist};
use crate::model::gpu::{Gpu, Inventory};
use crate::model::link::Link;
use crate::model::mig::{MigAccess, MigInstance};

/// The names of the simulated machines; `machine` accepts exactly these.
pub(crate) fn names() -> &'static [&'static str] {
    &[
        "nvswitch8",
        "pcie8",
        "cubemesh8",
        "nvswitch16",
        "dgxa100",
        "hgxh200",
        "gh200pair",
        "pcie8pxb",
        "nvbridge4",
        "dgxa100mig",
        "nvswitch8mig",
    ]
}

pub(crate) fn machine(name: &str) -> Result<Inventory, InventoryError> {
    let spec = MACHINES
        .iter()
        .find(|m| m.name == name && names().contains(&name))
        .ok_or_else(|| InventoryError::UnknownSim {
            name: name.to_string(),
        })?;
    Ok(spec.build(&host_online_cpus()))
}

const NUMA_NODES: usize = 2;

struct Spec {
    name: &'static str,
    /// Goes into the UUIDs, so machines never share one.
    id: u16,
    gpu_name: &'static str,
    memory_mib: u64,
    /// PCI bus numbers, one per GPU; domain 0, device 0, function 0.
    buses: &'static [u8],
    link: fn(usize, usize) -> Link,
    /// GPUs in MIG mode, with their instances (maybe none).
    mig: &'static [SimMig],
}

/// A GPU of a simulated machine in MIG mode.
struct SimMig {
    gpu: usize,
    /// Profile, GPU instance id, memory in MiB, in MIG index order.
    instances: &'static [(&'static str, u32, u64)],
}

const H100_7X1G: &[(&str, u32, u64)] = &[
    ("1g.10gb", 7, 9856),
    ("1g.10gb", 8, 9856),
    ("1g.10gb", 9, 9856),
    ("1g.10gb", 10, 9856),
    ("1g.10gb", 11, 9856),
    ("1g.10gb", 12, 9856),
    ("1g.10gb", 13, 9856),
];

const MACHINES: &[Spec] = &[
    Spec {
        name: "nvswitch8",
        id: 1,
        gpu_name: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        // The bus numbers of a DGX H100.
        buses: &[0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb],
        link: |_, _| Link::NvSwitch,
        mig: &[],
    },
    Spec {
        name: "pcie8",
        id: 2,
        gpu_name: "NVIDIA L40S",
        memory_mib: 46068,
        buses: &[0x1b, 0x1c, 0x3d, 0x3e, 0x89, 0x8a, 0xb1, 0xb2],
        link: pcie_link,
        mig: &[],
    },
    Spec {
        name: "cubemesh8",
        id: 3,
        gpu_name: "Tesla V100-SXM2-32GB",
        memory_mib: 32768,
        // A DGX-1's first socket; the second moved off 0x89/0x8a, which pcie8 uses.
        buses: &[0x06, 0x07, 0x0a, 0x0b, 0x85, 0x86, 0x8c, 0x8d],
        link: cube_mesh_link,
        mig: &[],
    },
    Spec {
        name: "nvswitch16",
        id: 4,
        gpu_name: "Tesla V100-SXM3-32GB",
        memory_mib: 32768,
        // The bus numbers of a DGX-2.
        buses: &[
            0x34, 0x36, 0x39, 0x3b, 0x57, 0x59, 0x5c, 0x5e, 0xb7, 0xb9, 0xbc, 0xbe, 0xe0, 0xe2,
            0xe5, 0xe7,
        ],
        link: |_, _| Link::NvSwitch,
        mig: &[],
    },
    Spec {
        name: "dgxa100",
        id: 5,
        gpu_name: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        // A DGX A100's, but for two that other machines here use.
        buses: &[0x0f, 0x15, 0x47, 0x4e, 0x87, 0x90, 0xb6, 0xbd],
        link: |_, _| Link::NvLink(12),
        mig: &[],
    },
    Spec {
        name: "hgxh200",
        id: 6,
        gpu_name: "NVIDIA H200",
        memory_mib: 143771,
        buses: &[0x19, 0x3c, 0x4c, 0x5b, 0x9b, 0xbb, 0xcb, 0xdc],
        link: |_, _| Link::NvLink(18),
        mig: &[],
    },
    Spec {
        name: "gh200pair",
        id: 7,
        gpu_name: "NVIDIA GH200 480GB",
        memory_mib: 97871,
        buses: &[0x01, 0x81],
        link: |_, _| Link::NvLink(18),
        mig: &[],
    },
    Spec {
        name: "pcie8pxb",
        id: 8,
        gpu_name: "NVIDIA RTX 6000 Ada Generation",
        memory_mib: 49140,
        buses: &[0x16, 0x17, 0x1e, 0x1f, 0x96, 0x97, 0x9e, 0x9f],
        link: pxb_link,
        mig: &[],
    },
    Spec {
        name: "nvbridge4",
        id: 9,
        gpu_name: "NVIDIA RTX A6000",
        memory_mib: 49140,
        buses: &[0x21, 0x22, 0xc1, 0xc2],
        link: |a, b| {
            if a / 2 == b / 2 {
                Link::NvLink(4)
            } else {
                Link::CrossSocket
            }
        },
        mig: &[],
    },
    Spec {
        name: "dgxa100mig",
        id: 10,
        gpu_name: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        buses: &[0x0e, 0x14, 0x46, 0x4d, 0x88, 0x8f, 0xb5, 0xc3],
        link: |_, _| Link::NvLink(12),
        mig: &[
            SimMig {
                gpu: 0,
                instances: &[
                    ("3g.40gb", 2, 40192),
                    ("2g.20gb", 3, 19968),
                    ("1g.10gb", 9, 9728),
                    ("1g.10gb", 10, 9728),
                ],
            },
            SimMig {
                gpu: 7,
                instances: &[],
            },
        ],
    },
    Spec {
        name: "nvswitch8mig",
        id: 11,
        gpu_name: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        buses: &[0x1a, 0x2b, 0x3f, 0x5f, 0x9c, 0xac, 0xbf, 0xdd],
        link: |_, _| Link::NvSwitch,
        mig: &[
            SimMig {
                gpu: 0,
                instances: H100_7X1G,
            },
            SimMig {
                gpu: 1,
                instances: H100_7X1G,
            },
        ],
    },
];

/// Two GPUs per PCIe switch, two switches under one upstream switch per socket.
fn pxb_link(a: usize, b: usize) -> Link {
    if a / 2 == b / 2 {
        Link::PcieSwitch
    } else if a / 4 == b / 4 {
        Link::PcieMultiSwitch
    } else {
        Link::CrossSocket
    }
}

/// Two GPUs per PCIe switch, two switches per socket.
fn pcie_link(a: usize, b: usize) -> Link {
    if a / 2 == b / 2 {
        Link::PcieSwitch
    } else if a / 4 == b / 4 {
        Link::SameNuma
    } else {
        Link::CrossSocket
    }
}

/// DGX-1 (V100) hybrid cube-mesh: see the module docs.
fn cube_mesh_link(a: usize, b: usize) -> Link {
    let (lo, hi) = (a.min(b), a.max(b));
    if lo / 4 == hi / 4 {
        match (lo % 4, hi % 4) {
            (0, 3) | (1, 2) | (2, 3) => Link::NvLink(2),
            _ => Link::NvLink(1),
        }
    } else if hi == lo + 4 {
        Link::NvLink(if lo < 2 { 2 } else { 1 })
    } else {
        Link::CrossSocket
    }
}

impl Spec {
    fn build(&self, online_cpus: &[u32]) -> Inventory {
        let node_cpus = split_cpus(online_cpus, NUMA_NODES);
        let per_node = self.buses.len() / NUMA_NODES;
        let gpus = (0..self.buses.len())
            .map(|i| self.gpu(i, i / per_node, &node_cpus))
            .collect();
        let n = self.buses.len();
        let links = (0..n)
            .map(|a| {
                (0..n)
                    .map(|b| {
                        if a == b {
                            Link::SelfLink
                        } else {
                            (self.link)(a, b)
                        }
                    })
                    .collect()
            })
            .collect();
        Inventory {
            source: format!("sim:{}", self.name),
            gpu_major: DEFAULT_GPU_MAJOR,
            gpus,
            control_nodes: default_control_nodes(DEFAULT_GPU_MAJOR),
            links: Some(links),
            caps_major: (!self.mig.is_empty()).then_some(DEFAULT_CAPS_MAJOR),
        }
    }

    fn gpu(&self, i: usize, node: usize, node_cpus: &[Option<String>]) -> Gpu {
        Gpu {
            index: i as u32,
            uuid: format!("GPU-5a1e{:04x}-0000-4000-8000-{i:012x}", self.id),
            name: self.gpu_name.to_string(),
            memory_bytes: self.memory_mib << 20,
            pci_bus_id: format!("00000000:{:02X}:00.0", self.buses[i]),
            minor: i as u32,
            numa_node: Some(node as u32),
            local_cpus: node_cpus[node].clone(),
            mig: self
                .mig
                .iter()
                .find(|m| m.gpu == i)
                .map(|m| self.instances(i, m)),
        }
    }

    fn instances(&self, gpu: usize, mig: &SimMig) -> Vec<MigInstance> {
        mig.instances
            .iter()
            .enumerate()
            .map(|(n, &(profile, gi, memory_mib))| MigInstance {
                index: n as u32,
                uuid: format!("MIG-5a1e{:04x}-{gpu:04x}-4000-8000-{n:012x}", self.id),
                profile: Some(profile.to_string()),
                memory_bytes: memory_mib << 20,
                access: Some(MigAccess::standard(gpu as u32, gi, 0)),
                parent_index: gpu as u32,
                parent_uuid: format!("GPU-5a1e{:04x}-0000-4000-8000-{gpu:012x}", self.id),
                parent_minor: gpu as u32,
            })
            .collect()
    }
}

/// The host's online CPUs; empty when sysfs is unreadable (then `local_cpus` stay unknown).
fn host_online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| cpulist::parse(&text))
        .unwrap_or_default()
}

/// Splits the CPUs into `nodes` consecutive, nearly equal parts, as cpulists. With fewer
/// CPUs than nodes every node gets all of them: an empty cpuset is never valid.
fn split_cpus(online: &[u32], nodes: usize) -> Vec<Option<String>> {
    if online.is_empty() {
        return vec![None; nodes];
    }
    if online.len() < nodes {
        return vec![Some(cpulist::format(online)); nodes];
    }
    let len = online.len();
    (0..nodes)
        .map(|n| {
            Some(cpulist::format(
                &online[n * len / nodes..(n + 1) * len / nodes],
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::inventory::{from_json, to_json};
    use std::path::Path;

    #[test]
    fn every_name_builds_and_every_machine_is_named() {
        for name in names() {
            let inv = machine(name).unwrap();
            assert_eq!(inv.source, format!("sim:{name}"));
            assert!([2, 4, 8, 16].contains(&inv.gpus.len()));
        }
        assert_eq!(MACHINES.len(), names().len());
        assert!(matches!(
            machine("dgx"),
            Err(InventoryError::UnknownSim { .. })
        ));
    }

    #[test]
    fn machines_are_valid_inventory_files() {
        for name in names() {
            let inv = machine(name).unwrap();
            let mut back = from_json(&to_json(&inv), Path::new("x.json")).unwrap();
            back.source = inv.source.clone();
            assert_eq!(back, inv);
        }
    }

    #[test]
    fn uuids_and_bus_ids_differ_across_machines() {
        let all: Vec<Inventory> = names().iter().map(|n| machine(n).unwrap()).collect();
        for (x, a) in all.iter().enumerate() {
            for b in &all[x + 1..] {
                for g in &a.gpus {
                    assert!(b.position_of(&g.uuid).is_none());
                    assert!(b.find(&g.pci_bus_id).is_none());
                }
            }
        }
        assert_eq!(
            all[0].gpus[3].uuid,
            "GPU-5a1e0001-0000-4000-8000-000000000003"
        );
        assert_eq!(
            all[1].gpus[3].uuid,
            "GPU-5a1e0002-0000-4000-8000-000000000003"
        );
        assert_eq!(
            all[2].gpus[3].uuid,
            "GPU-5a1e0003-0000-4000-8000-000000000003"
        );
        assert_eq!(
            all[3].gpus[15].uuid,
            "GPU-5a1e0004-0000-4000-8000-00000000000f"
        );
    }

    #[test]
    fn link_matrices_are_symmetric_with_x_on_the_diagonal() {
        for name in names() {
            let inv = machine(name).unwrap();
            let n = inv.gpus.len();
            for a in 0..n {
                for b in 0..n {
                    let l = inv.link(a, b).unwrap();
                    assert_eq!(l, inv.link(b, a).unwrap(), "{name} {a} {b}");
                    assert_eq!(a == b, l == Link::SelfLink, "{name} {a} {b}");
                }
            }
        }
    }

    #[test]
    fn cubemesh8_quads_are_fully_linked_and_every_gpu_uses_six_links() {
        let inv = machine("cubemesh8").unwrap();
        let links = |a: usize, b: usize| match inv.link(a, b) {
            Some(Link::NvLink(k)) => u32::from(k),
            _ => 0,
        };
        for a in 0..8 {
            assert_eq!((0..8).map(|b| links(a, b)).sum::<u32>(), 6, "GPU {a}");
            for b in 0..8 {
                let same_quad = a != b && a / 4 == b / 4;
                assert_eq!(same_quad || a.abs_diff(b) == 4, links(a, b) > 0, "{a} {b}");
            }
        }
        assert_eq!(inv.link(0, 3), Some(Link::NvLink(2)));
        assert_eq!(inv.link(0, 1), Some(Link::NvLink(1)));
        assert_eq!(inv.link(1, 5), Some(Link::NvLink(2)));
        assert_eq!(inv.link(3, 7), Some(Link::NvLink(1)));
        assert_eq!(inv.link(0, 5), Some(Link::CrossSocket));
        assert_eq!(inv.gpus[4].numa_node, Some(1));
    }

    #[test]
    fn nvswitch16_links_every_pair_by_nvswitch_on_two_nodes() {
        let inv = machine("nvswitch16").unwrap();
        assert_eq!(inv.gpus.len(), 16);
        assert_eq!(inv.link(0, 15), Some(Link::NvSwitch));
        assert_eq!(inv.gpus[7].numa_node, Some(0));
        assert_eq!(inv.gpus[8].numa_node, Some(1));
    }

    #[test]
    fn nvswitch8_links_every_pair_by_nvswitch() {
        let inv = machine("nvswitch8").unwrap();
        assert_eq!(inv.link(0, 7), Some(Link::NvSwitch));
        assert_eq!(inv.link(5, 5), Some(Link::SelfLink));
        assert_eq!(inv.gpus[3].numa_node, Some(0));
        assert_eq!(inv.gpus[4].numa_node, Some(1));
    }

    #[test]
    fn pcie8_follows_switches_and_sockets() {
        let inv = machine("pcie8").unwrap();
        assert_eq!(inv.link(0, 1), Some(Link::PcieSwitch));
        assert_eq!(inv.link(0, 2), Some(Link::SameNuma));
        assert_eq!(inv.link(3, 4), Some(Link::CrossSocket));
        assert_eq!(inv.link(6, 7), Some(Link::PcieSwitch));
    }

    #[test]
    fn the_machines_users_have() {
        let all_pairs = |name: &str, want: Link| {
            let inv = machine(name).unwrap();
            let n = inv.gpus.len();
            for a in 0..n {
                for b in (0..n).filter(|&b| b != a) {
                    assert_eq!(inv.link(a, b), Some(want), "{name} {a} {b}");
                }
            }
        };
        all_pairs("dgxa100", Link::NvLink(12));
        all_pairs("hgxh200", Link::NvLink(18));
        all_pairs("gh200pair", Link::NvLink(18));
        let gh = machine("gh200pair").unwrap();
        assert_eq!(gh.gpus[1].numa_node, Some(1));
        let pxb = machine("pcie8pxb").unwrap();
        assert_eq!(pxb.link(0, 1), Some(Link::PcieSwitch));
        assert_eq!(pxb.link(1, 2), Some(Link::PcieMultiSwitch));
        assert_eq!(pxb.link(3, 4), Some(Link::CrossSocket));
        let bridges = machine("nvbridge4").unwrap();
        assert_eq!(bridges.link(2, 3), Some(Link::NvLink(4)));
        assert_eq!(bridges.link(1, 2), Some(Link::CrossSocket));
    }

    #[test]
    fn mig_machines_cut_their_gpus() {
        let a100 = machine("dgxa100mig").unwrap();
        let profiles: Vec<_> = a100.gpus[0]
            .mig_instances()
            .iter()
            .map(|m| m.profile_name())
            .collect();
        assert_eq!(profiles, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]);
        assert!(a100.gpus[7].in_mig_mode());
        assert!(a100.gpus[7].mig_instances().is_empty());
        assert!(!a100.gpus[1].in_mig_mode());
        let third = a100.find_mig("0:2").unwrap();
        assert_eq!(third.parent_uuid, a100.gpus[0].uuid);
        assert_eq!(third.access, Some(MigAccess::standard(0, 9, 0)));
        assert_eq!(
            third.cap_paths().unwrap(),
            [
                "/dev/nvidia-caps/nvidia-cap84",
                "/dev/nvidia-caps/nvidia-cap85"
            ]
        );
        assert_eq!(a100.find_mig(&third.uuid.to_lowercase()), Some(third));
        let h100 = machine("nvswitch8mig").unwrap();
        assert_eq!(h100.mig_instances().count(), 14);
        let uuids: std::collections::HashSet<_> = h100
            .mig_instances()
            .map(|m| m.uuid.as_str())
            .chain(h100.gpus.iter().map(|g| g.uuid.as_str()))
            .collect();
        assert_eq!(uuids.len(), 14 + 8);
        assert_eq!(h100.find_mig("1:6").unwrap().parent_minor, 1);
    }

    #[test]
    fn splits_cpus_by_node() {
        let some = |s: &str| Some(s.to_string());
        assert_eq!(split_cpus(&[0], 2), [some("0"), some("0")]);
        assert_eq!(split_cpus(&[0, 1], 2), [some("0"), some("1")]);
        assert_eq!(split_cpus(&[0, 1, 2], 2), [some("0"), some("1-2")]);
        assert_eq!(
            split_cpus(&(0..16).collect::<Vec<_>>(), 2),
            [some("0-7"), some("8-15")]
        );
        assert_eq!(split_cpus(&[], 2), [None, None]);
    }

    #[test]
    fn local_cpus_are_online_host_cpus() {
        let online = host_online_cpus();
        for gpu in machine("pcie8").unwrap().gpus {
            let cpus = cpulist::parse(gpu.local_cpus.as_deref().unwrap_or("")).unwrap();
            assert!(
                cpus.iter().all(|c| online.contains(c)),
                "{cpus:?} not in {online:?}"
            );
        }
    }
}
