//! Pairwise GPU links in nvidia-smi `topo -m` notation, which users already read.

use std::fmt;
use std::str::FromStr;

/// How two GPUs are connected, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    /// The GPU itself (matrix diagonal, `X`).
    SelfLink,
    /// NVLink through an NVSwitch: every GPU pair is linked at full bandwidth (`NVS`).
    NvSwitch,
    /// Direct NVLink with this many links (`NV1`..`NV18`).
    NvLink(u8),
    /// PCIe, at most one PCIe switch between them (`PIX`).
    PcieSwitch,
    /// PCIe through several switches, not the host bridge (`PXB`).
    PcieMultiSwitch,
    /// PCIe through a host bridge (`PHB`).
    HostBridge,
    /// PCIe plus the interconnect between host bridges of one NUMA node (`NODE`).
    SameNuma,
    /// Across NUMA nodes / sockets (`SYS`).
    CrossSocket,
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::SelfLink => f.write_str("X"),
            Link::NvSwitch => f.write_str("NVS"),
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::PcieSwitch => f.write_str("PIX"),
            Link::PcieMultiSwitch => f.write_str("PXB"),
            Link::HostBridge => f.write_str("PHB"),
            Link::SameNuma => f.write_str("NODE"),
            Link::CrossSocket => f.write_str("SYS"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid link {0:?}: expected X, NVS, NV<n>, PIX, PXB, PHB, NODE or SYS")]
pub struct BadLink(pub String);

impl FromStr for Link {
    type Err = BadLink;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "X" => Link::SelfLink,
            "NVS" => Link::NvSwitch,
            "PIX" => Link::PcieSwitch,
            "PXB" => Link::PcieMultiSwitch,
            "PHB" => Link::HostBridge,
            "NODE" => Link::SameNuma,
            "SYS" => Link::CrossSocket,
            _ => match s.strip_prefix("NV").and_then(|n| n.parse::<u8>().ok()) {
                Some(n) if n > 0 => Link::NvLink(n),
                _ => return Err(BadLink(s.to_string())),
            },
        })
    }
}

impl serde::Serialize for Link {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Link {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_notation() {
        for s in [
            "X", "NVS", "NV1", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS",
        ] {
            assert_eq!(s.parse::<Link>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_unknown_notation() {
        for s in ["NV0", "NV", "nvs", "PCI", ""] {
            let err = s.parse::<Link>().unwrap_err().to_string();
            assert!(err.contains("expected X, NVS"), "{err}");
        }
    }
}
