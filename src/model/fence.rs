//! GPUs taken out of allocation: an admin's drain (`gpupin drain`), and, from the GPU's
//! health, a GPU that needs a reset or the machine a reboot. A fenced GPU is never
//! handed out; its holders keep it until they end. It comes back with `gpupin undrain`
//! (any fence), and a health fence also with the reset or reboot it asked for. A health
//! fence may take out one MIG instance only, where the driver says the error was its.

use super::gpu::Gpu;
use super::mig::MigInstance;
use serde::{Deserialize, Serialize};

/// Why a GPU is out of allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FenceState {
    /// An admin took it out (maintenance), until `gpupin undrain`. It outlives a reboot
    /// where the state dir does.
    Drained,
    /// Its health says it needs a reset (NVIDIA's XID catalog: "reset GPU").
    NeedsReset,
    /// Its health says the machine needs a reboot.
    NeedsReboot,
}

impl FenceState {
    /// The word status, refusals and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceState::Drained => "drained",
            FenceState::NeedsReset => "needs-reset",
            FenceState::NeedsReboot => "needs-reboot",
        }
    }

    /// Whether a reboot ends it: the GPU was reset by it.
    pub fn ends_at_reboot(self) -> bool {
        !matches!(self, FenceState::Drained)
    }
}

/// One GPU, or one MIG instance, out of allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The GPU's UUID, or the MIG instance's.
    pub uuid: String,
    /// The GPU's index when it was fenced, as people name it (an instance's parent's).
    pub index: u32,
    /// The MIG instance's index under GPU `index`, where the fence is an instance's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<u32>,
    pub state: FenceState,
    /// What the admin said (`--reason`), or what the GPU reported.
    pub reason: String,
    /// Who: the admin's user name, or `gpupin serve` for a health fence.
    pub by: String,
    /// Unix seconds.
    pub since: u64,
    /// A health fence set by a condition that holds until a reset (a row remap pending,
    /// double-bit errors counted, the driver's recovery action), or an XID's fence that
    /// follows one: it goes by itself once the GPU no longer reports it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_clear: bool,
}

/// What a fence takes out of allocation: a whole GPU, or one MIG instance of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceTarget<'a> {
    pub uuid: &'a str,
    pub index: u32,
    pub mig: Option<u32>,
}

impl<'a> From<&'a Gpu> for FenceTarget<'a> {
    fn from(gpu: &'a Gpu) -> Self {
        FenceTarget {
            uuid: &gpu.uuid,
            index: gpu.index,
            mig: None,
        }
    }
}

impl<'a> From<&'a MigInstance> for FenceTarget<'a> {
    fn from(instance: &'a MigInstance) -> Self {
        FenceTarget {
            uuid: &instance.uuid,
            index: instance.parent_index,
            mig: Some(instance.index),
        }
    }
}

impl FenceTarget<'_> {
    /// How people name it: `3`, or an instance's `3:1` (nvidia-ctk's form).
    pub fn address(self) -> String {
        match self.mig {
            Some(mig) => format!("{}:{mig}", self.index),
            None => self.index.to_string(),
        }
    }

    /// The fence on it, in `state`, saying `reason`, by `by`, from `since`.
    pub fn fence(self, state: FenceState, reason: &str, by: &str, since: u64) -> Fence {
        Fence {
            uuid: self.uuid.to_string(),
            index: self.index,
            mig: self.mig,
            state,
            reason: reason.to_string(),
            by: by.to_string(),
            since,
            until_clear: false,
        }
    }
}

impl Fence {
    /// What it fences.
    pub fn target(&self) -> FenceTarget<'_> {
        FenceTarget {
            uuid: &self.uuid,
            index: self.index,
            mig: self.mig,
        }
    }

    /// How people name what it fences: `3`, or an instance's `3:1`.
    pub fn address(&self) -> String {
        self.target().address()
    }

    /// `GPU 3`, or `MIG instance 3:1`: what it fences, for a sentence.
    pub fn named(&self) -> String {
        match self.mig {
            Some(_) => format!("MIG instance {}", self.address()),
            None => format!("GPU {}", self.index),
        }
    }

    /// `is drained by alice: fan swap; it comes back with gpupin undrain 3`, or for a GPU
    /// its health took out, `needs a reset (XID 79 ...); it comes back after the reset, or
    /// with gpupin undrain 3`: after "it" in a refusal, after "GPU 3" elsewhere.
    pub fn why(&self) -> String {
        let index = self.address();
        match self.state {
            FenceState::Drained => format!(
                "is drained by {}: {}; it comes back with gpupin undrain {index}",
                self.by, self.reason
            ),
            FenceState::NeedsReset => format!(
                "needs a reset ({}); it comes back after the reset, or with gpupin undrain {index}",
                self.reason
            ),
            FenceState::NeedsReboot => format!(
                "needs the machine rebooted ({}); it comes back after the reboot, or with gpupin undrain {index}",
                self.reason
            ),
        }
    }
}

/// Every fence, at most one a GPU (the latest replaces the one before).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fences {
    #[serde(default)]
    pub gpus: Vec<Fence>,
}

impl Fences {
    /// The fence of the GPU (or MIG instance) with this UUID, if it has one.
    pub fn of(&self, uuid: &str) -> Option<&Fence> {
        self.gpus.iter().find(|f| f.uuid == uuid)
    }

    /// What keeps MIG instance `m` out of allocation: its own fence, else its GPU's.
    pub fn of_instance(&self, m: &MigInstance) -> Option<&Fence> {
        self.of(&m.uuid).or_else(|| self.of(&m.parent_uuid))
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Sets `fence`, replacing the GPU's fence before; the one replaced.
    pub fn set(&mut self, fence: Fence) -> Option<Fence> {
        let before = self
            .gpus
            .iter()
            .position(|f| f.uuid == fence.uuid)
            .map(|p| self.gpus.remove(p));
        self.gpus.push(fence);
        self.gpus.sort_by_key(|f| (f.index, f.mig));
        before
    }

    /// Takes the GPU's fence away; the one taken.
    pub fn clear(&mut self, uuid: &str) -> Option<Fence> {
        let at = self.gpus.iter().position(|f| f.uuid == uuid)?;
        Some(self.gpus.remove(at))
    }

    /// Without the fences a reboot at `boot` (unix seconds) ended: a health fence set
    /// before it asked for the reset the reboot made.
    pub fn after_boot(mut self, boot: Option<u64>) -> Fences {
        if let Some(boot) = boot {
            self.gpus
                .retain(|f| !(f.state.ends_at_reboot() && f.since < boot));
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(uuid: &str, index: u32, state: FenceState, since: u64) -> Fence {
        Fence {
            uuid: uuid.into(),
            index,
            mig: None,
            state,
            reason: "why".into(),
            by: "root".into(),
            since,
            until_clear: false,
        }
    }

    #[test]
    fn one_fence_a_gpu_the_latest_and_in_index_order() {
        let mut fences = Fences::default();
        assert_eq!(fences.set(fence("GPU-b", 3, FenceState::Drained, 1)), None);
        assert_eq!(
            fences.set(fence("GPU-a", 1, FenceState::NeedsReset, 2)),
            None
        );
        let replaced = fences.set(fence("GPU-b", 3, FenceState::NeedsReboot, 3));
        assert_eq!(replaced.map(|f| f.state), Some(FenceState::Drained));
        let order: Vec<u32> = fences.gpus.iter().map(|f| f.index).collect();
        assert_eq!(order, [1, 3]);
        assert_eq!(
            fences.of("GPU-b").map(|f| f.state),
            Some(FenceState::NeedsReboot)
        );
        assert_eq!(fences.clear("GPU-a").map(|f| f.index), Some(1));
        assert_eq!(fences.clear("GPU-a"), None);
        assert!(fences.of("GPU-a").is_none());
    }

    #[test]
    fn an_instances_fence_is_named_by_its_address_and_keeps_only_it_out() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let parent = inv.gpus.iter().find(|g| g.in_mig_mode()).unwrap();
        let (one, other) = (&parent.mig_instances()[2], &parent.mig_instances()[3]);
        let mut fences = Fences::default();
        fences.set(FenceTarget::from(one).fence(FenceState::NeedsReset, "XID 48", "s", 5));
        let fence = fences.of(&one.uuid).unwrap();
        assert_eq!(fence.address(), format!("{}:2", parent.index));
        assert_eq!(fence.named(), format!("MIG instance {}:2", parent.index));
        assert!(
            fence
                .why()
                .ends_with(&format!("gpupin undrain {}:2", parent.index))
        );
        assert_eq!(fences.of_instance(one), Some(fence));
        assert_eq!(fences.of_instance(other), None);
        // The GPU's own fence keeps every instance out, and sorts before them.
        fences.set(FenceTarget::from(parent).fence(FenceState::Drained, "fan", "root", 6));
        assert_eq!(
            fences.of_instance(other).map(|f| f.state),
            Some(FenceState::Drained)
        );
        assert_eq!(
            fences.of_instance(one).map(|f| f.state),
            Some(FenceState::NeedsReset)
        );
        let order: Vec<String> = fences.gpus.iter().map(Fence::address).collect();
        assert_eq!(
            order,
            [parent.index.to_string(), format!("{}:2", parent.index)]
        );
        let whole = fences.of(&parent.uuid).unwrap();
        assert_eq!(
            (whole.address(), whole.named()),
            (parent.index.to_string(), format!("GPU {}", parent.index))
        );
    }

    #[test]
    fn a_reboot_ends_health_fences_set_before_it_not_drains() {
        let mut fences = Fences::default();
        fences.set(fence("GPU-a", 0, FenceState::Drained, 10));
        fences.set(fence("GPU-b", 1, FenceState::NeedsReset, 10));
        fences.set(fence("GPU-c", 2, FenceState::NeedsReboot, 10));
        fences.set(fence("GPU-d", 3, FenceState::NeedsReset, 30));
        let left: Vec<String> = fences
            .after_boot(Some(20))
            .gpus
            .into_iter()
            .map(|f| f.uuid)
            .collect();
        assert_eq!(left, ["GPU-a", "GPU-d"]);
    }

    #[test]
    fn states_are_written_as_people_read_them() {
        let text = serde_json::to_string(&fence("GPU-a", 0, FenceState::NeedsReset, 1)).unwrap();
        assert!(text.contains("\"state\":\"needs-reset\""), "{text}");
        for state in [
            FenceState::Drained,
            FenceState::NeedsReset,
            FenceState::NeedsReboot,
        ] {
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json, state.as_str());
        }
    }
}
