//! MIG instances: the slices an admin cuts a GPU into (`nvidia-smi mig -cgi ... -C`),
//! each a device of its own with its own UUID, memory and compute.
//!
//! A GPU in MIG mode is never a unit by itself: its instances are. Each is addressed as
//! nvidia-ctk names it, `<gpu index>:<mig index>` (`0:1`), or by its UUID (`MIG-...`).
//! The ledger keys what it hands out by UUID, and a MIG UUID starts with `MIG-` where a
//! GPU's starts with `GPU-`, so the two can never collide.
//!
//! Besides the parent's `/dev/nvidia<minor>`, a process needs two capability nodes to use
//! an instance: `/dev/nvidia-caps/nvidia-cap<minor>` of its GPU instance's `access` and
//! of its compute instance's `access` (NVIDIA's `internal/nvcaps` reads them the same way).

use serde::{Deserialize, Serialize};

/// Where a holder's capability nodes live.
pub(crate) const CAPS_DIR: &str = "/dev/nvidia-caps";

/// The `/proc/devices` name of the capability nodes' major.
pub(crate) const CAPS_DEVICE_NAME: &str = "nvidia-caps";

/// One MIG instance (a GPU instance with one compute instance) of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// The MIG device index under its parent (NVML's `mig_device_by_index`, the `Device N`
    /// of `nvidia-smi -L`, the `<mig>` of nvidia-ctk's `<gpu>:<mig>`).
    pub index: u32,
    /// `MIG-...`: NVML's UUID, or the legacy `MIG-GPU-<uuid>/<gi>/<ci>` form CUDA also
    /// accepts, where the source knows no UUID (procfs).
    pub uuid: String,
    /// The profile, e.g. `1g.10gb`; `None` where the source does not say (procfs).
    pub profile: Option<String>,
    /// Memory in bytes; 0 when unknown.
    pub memory_bytes: u64,
    /// The GI and CI ids and their capability minors; `None` where the source does not
    /// say (an import of `nvidia-smi -L`): such an instance can be modelled, not given.
    pub access: Option<MigAccess>,
    /// The parent's NVML index, UUID and device minor (`/dev/nvidia<minor>`).
    pub parent_index: u32,
    pub parent_uuid: String,
    pub parent_minor: u32,
}

/// What the driver checks before a process may use an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigAccess {
    /// GPU instance id.
    pub gi: u32,
    /// Compute instance id within the GPU instance.
    pub ci: u32,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<N>` for `gpu<minor>/gi<gi>/access`.
    pub gi_minor: u32,
    /// Minor for `gpu<minor>/gi<gi>/ci<ci>/access`.
    pub ci_minor: u32,
}

impl MigAccess {
    /// The access with the minors the driver assigns in its fixed table, the one
    /// `/proc/driver/nvidia-caps/mig-minors` lists: `config` 1, `monitor` 2, then for each
    /// GPU minor 15 GPU instances of 9 minors each (the GI's access, then CI 0..=7). Used
    /// where a source names GI and CI but no minors (sims, files that leave them out).
    pub fn standard(gpu_minor: u32, gi: u32, ci: u32) -> MigAccess {
        let gi_minor = 3 + gpu_minor * 15 * 9 + gi * 9;
        MigAccess {
            gi,
            ci,
            gi_minor,
            ci_minor: gi_minor + 1 + ci,
        }
    }
}

impl MigInstance {
    /// `<gpu index>:<mig index>`, as nvidia-ctk names it.
    pub fn address(&self) -> String {
        format!("{}:{}", self.parent_index, self.index)
    }

    /// The profile for people: `1g.10gb`, or `unknown`.
    pub fn profile_name(&self) -> &str {
        self.profile.as_deref().unwrap_or("unknown")
    }

    /// The capability nodes' paths, GI's first.
    pub fn cap_paths(&self) -> Option<[String; 2]> {
        self.access
            .map(|a| [cap_path(a.gi_minor), cap_path(a.ci_minor)])
    }

    /// `1g.10gb` -> 1: the compute slices, for "smallest first" orders.
    pub fn slices(&self) -> u32 {
        profile_slices(self.profile_name())
    }
}

/// `/dev/nvidia-caps/nvidia-cap<minor>`.
pub(crate) fn cap_path(minor: u32) -> String {
    format!("{CAPS_DIR}/nvidia-cap{minor}")
}

/// The compute slices a profile names (`3g.40gb` -> 3; `1c.3g.40gb` -> 1); u32::MAX when
/// the name is not of that shape, so unknown profiles sort last.
pub(crate) fn profile_slices(profile: &str) -> u32 {
    let first = profile.split('.').next().unwrap_or("");
    first
        .strip_suffix('g')
        .or_else(|| first.strip_suffix('c'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

/// `0:1` to (0, 1): the address form of an instance.
pub(crate) fn parse_address(key: &str) -> Option<(u32, u32)> {
    let (gpu, mig) = key.trim().split_once(':')?;
    Some((gpu.parse().ok()?, mig.parse().ok()?))
}

/// A profile name as NVIDIA writes them: `1g.10gb`, `1g.10gb+me`, `1c.3g.40gb`. Checked
/// where people type one, so a typo is refused rather than matching nothing.
pub(crate) fn is_profile_name(name: &str) -> bool {
    let base = name.strip_suffix("+me").unwrap_or(name);
    let parts: Vec<&str> = base.split('.').collect();
    let unit = |p: &str, suffix: &str| {
        p.strip_suffix(suffix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match parts.as_slice() {
        [g, mem] => unit(g, "g") && unit(mem, "gb"),
        [c, g, mem] => unit(c, "c") && unit(g, "g") && unit(mem, "gb"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_minors_follow_the_drivers_table() {
        // gpu0/gi0/access 3, gpu0/gi0/ci0/access 4, gpu0/gi1/access 12,
        // gpu1/gi0/access 138 in /proc/driver/nvidia-caps/mig-minors.
        assert_eq!(MigAccess::standard(0, 0, 0).gi_minor, 3);
        assert_eq!(MigAccess::standard(0, 0, 0).ci_minor, 4);
        assert_eq!(MigAccess::standard(0, 1, 0).gi_minor, 12);
        assert_eq!(MigAccess::standard(0, 1, 7).ci_minor, 20);
        assert_eq!(MigAccess::standard(1, 0, 0).gi_minor, 138);
    }

    #[test]
    fn profiles_and_addresses() {
        assert!(is_profile_name("1g.10gb"));
        assert!(is_profile_name("1g.10gb+me"));
        assert!(is_profile_name("1c.3g.40gb"));
        assert!(!is_profile_name("1g"));
        assert!(!is_profile_name("g.10gb"));
        assert!(!is_profile_name("any"));
        assert_eq!(profile_slices("3g.40gb"), 3);
        assert_eq!(profile_slices("1c.3g.40gb"), 1);
        assert_eq!(profile_slices("unknown"), u32::MAX);
        assert_eq!(parse_address("0:1"), Some((0, 1)));
        assert_eq!(parse_address("0"), None);
        assert_eq!(parse_address("00000000:17:00.0"), None);
    }
}
