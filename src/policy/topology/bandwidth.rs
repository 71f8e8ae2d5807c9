//! What one link between two GPUs carries, per direction, as an estimate: the one table
//! the ranking takes its figures from. Sources and reasoning are in the module docs of
//! [`super`] and in docs/reference.md, section "Policies".
//!
//! - NVLink: the per-link rate of the GPU's NVLink generation times the number of links
//!   `nvidia-smi topo -m` shows (`NV<k>`); `NVS` (an NVSwitch) as every link of the GPU.
//! - PCIe: the x16 rate of the slower GPU's PCIe generation, scaled down by how far the
//!   path climbs (`PIX` > `PXB` > `PHB` > `NODE` > `SYS`).
//!
//! The GPU's generation comes from its name (`NVIDIA A100-SXM4-80GB`); an unknown name
//! gets [`OTHER`].

use crate::model::link::Link;

/// The PCIe path between two GPUs, worst first. `NvLink`: the pair is joined by NVLink
/// (directly or through an NVSwitch), so `nvidia-smi topo -m` names no PCIe path for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Path {
    /// `SYS`: across sockets, over the CPUs' interconnect (UPI, Infinity Fabric).
    Sys,
    /// `NODE`: between host bridges of one NUMA node.
    Node,
    /// `PHB`: through one host bridge (the CPU's root complex).
    Phb,
    /// `PXB`: through several PCIe switches, below the host bridge.
    Pxb,
    /// `PIX`: through at most one PCIe switch.
    Pix,
    /// No PCIe path: NVLink.
    NvLink,
}

impl Path {
    /// The `nvidia-smi topo -m` word; `none` for NVLink.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Sys => "SYS",
            Path::Node => "NODE",
            Path::Phb => "PHB",
            Path::Pxb => "PXB",
            Path::Pix => "PIX",
            Path::NvLink => "none",
        }
    }

    /// The share of the x16 link rate a GPU-to-GPU copy gets on this path, in percent.
    fn percent(self) -> u64 {
        match self {
            Path::Pix => 100,
            Path::Pxb => 90,
            Path::Phb => 75,
            Path::Node => 60,
            Path::Sys => 40,
            Path::NvLink => 0,
        }
    }
}

/// A GPU generation as the table sees it. Rates are MB/s (10^6 bytes) per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Family {
    /// The architecture, for docs and `--explain`.
    pub name: &'static str,
    /// Tokens of a GPU name that mark this family: any one set, all of its tokens
    /// present (case-insensitive; the name is split at spaces and hyphens).
    tokens: &'static [&'static [&'static str]],
    /// One NVLink, per direction.
    pub nvlink_per_link: u64,
    /// NVLinks of one GPU: what an NVSwitch gives it.
    pub nvlinks: u64,
    /// The PCIe generation of the GPU's x16 host link.
    pub pcie_gen: u8,
}

impl Family {
    /// Every NVLink of the GPU: the bandwidth an NVSwitch gives each pair.
    pub(crate) fn nvlink_full(&self) -> u64 {
        self.nvlink_per_link * self.nvlinks
    }
}

/// The table, first match wins (so "RTX 6000 Ada" is met before the Turing "Quadro RTX
/// 6000"). Per-link rates: NVIDIA's per-GPU NVLink totals (bidirectional) divided by
/// the link count and by two.
pub(crate) const FAMILIES: &[Family] = &[
    Family {
        name: "Blackwell (NVLink 5)",
        tokens: &[&["B100"], &["B200"], &["B300"], &["GB200"], &["GB300"]],
        nvlink_per_link: 50_000,
        nvlinks: 18,
        pcie_gen: 6,
    },
    Family {
        name: "Hopper (NVLink 4)",
        tokens: &[&["H100"], &["H200"], &["H800"], &["H20"], &["GH200"]],
        nvlink_per_link: 25_000,
        nvlinks: 18,
        pcie_gen: 5,
    },
    Family {
        name: "Ampere GA100 (NVLink 3)",
        tokens: &[&["A100"], &["A800"], &["A30"]],
        nvlink_per_link: 25_000,
        nvlinks: 12,
        pcie_gen: 4,
    },
    Family {
        name: "Ada (no NVLink)",
        tokens: &[&["Ada"], &["L40"], &["L40S"], &["L4"], &["L20"], &["4090"]],
        nvlink_per_link: 0,
        nvlinks: 0,
        pcie_gen: 4,
    },
    Family {
        name: "Ampere GA102 (NVLink 3 bridge)",
        tokens: &[
            &["A6000"],
            &["A5500"],
            &["A5000"],
            &["A4500"],
            &["A40"],
            &["3090"],
        ],
        nvlink_per_link: 14_062,
        nvlinks: 4,
        pcie_gen: 4,
    },
    Family {
        name: "Volta (NVLink 2)",
        tokens: &[&["V100"]],
        nvlink_per_link: 25_000,
        nvlinks: 6,
        pcie_gen: 3,
    },
    Family {
        name: "Turing (NVLink 2 bridge)",
        tokens: &[&["Quadro", "RTX"], &["TITAN", "RTX"], &["2080"], &["T4"]],
        nvlink_per_link: 25_000,
        nvlinks: 2,
        pcie_gen: 3,
    },
    Family {
        name: "Pascal (NVLink 1)",
        tokens: &[&["P100"]],
        nvlink_per_link: 20_000,
        nvlinks: 4,
        pcie_gen: 3,
    },
];

/// A GPU the table does not know: the NVLink rate shared by NVLink 2 to 4 and Hopper's
/// link count (so `NVS` is never beaten by an `NV<k>`), PCIe 4.
pub(crate) const OTHER: Family = Family {
    name: "other",
    tokens: &[],
    nvlink_per_link: 25_000,
    nvlinks: 18,
    pcie_gen: 4,
};

/// The family of a GPU by its name.
pub(crate) fn family(gpu_name: &str) -> &'static Family {
    let words: Vec<&str> = gpu_name
        .split(|c: char| c.is_whitespace() || c == '-')
        .filter(|w| !w.is_empty())
        .collect();
    let has = |t: &str| words.iter().any(|w| w.eq_ignore_ascii_case(t));
    FAMILIES
        .iter()
        .find(|f| f.tokens.iter().any(|set| set.iter().all(|t| has(t))))
        .unwrap_or(&OTHER)
}

/// The x16 rate of a PCIe generation per direction, MB/s: lanes x transfer rate x line
/// code (128b/130b for 3 to 5, FLIT 242/256 for 6), from the PCI-SIG specifications.
/// Generations before 3 count as 3.
pub(crate) fn pcie_x16(generation: u8) -> u64 {
    match generation {
        0..=3 => 15_754,
        4 => 31_508,
        5 => 63_015,
        _ => 121_000,
    }
}

/// The estimate for one pair: bandwidth (MB/s per direction) and PCIe path. Between two
/// generations, the slower one's figures count.
pub(crate) fn pair(link: Link, a: &'static Family, b: &'static Family) -> (u64, Path) {
    let (a_nv, b_nv) = (with_nvlink(a), with_nvlink(b));
    let nv = if a_nv.nvlink_full() <= b_nv.nvlink_full() {
        a_nv
    } else {
        b_nv
    };
    let pcie = pcie_x16(a.pcie_gen.min(b.pcie_gen));
    let path = |p: Path| (pcie * p.percent() / 100, p);
    match link {
        Link::SelfLink => (0, Path::NvLink),
        Link::NvSwitch => (nv.nvlink_full(), Path::NvLink),
        // A count beyond the GPU's links would outrank the NVSwitch: cap it there.
        Link::NvLink(k) => (
            u64::from(k).min(nv.nvlinks) * nv.nvlink_per_link,
            Path::NvLink,
        ),
        Link::PcieSwitch => path(Path::Pix),
        Link::PcieMultiSwitch => path(Path::Pxb),
        Link::HostBridge => path(Path::Phb),
        Link::SameNuma => path(Path::Node),
        Link::CrossSocket => path(Path::Sys),
    }
}

/// A family without NVLink whose GPUs the matrix shows NVLinked (a name the table
/// places wrongly) is measured as [`OTHER`]: the matrix knows better than the name.
fn with_nvlink(f: &'static Family) -> &'static Family {
    if f.nvlinks == 0 { &OTHER } else { f }
}
