//! GPUs taken out of allocation and put back (`model::fence`): an admin's drain and
//! undrain, under the lock, each in the audit trail. A fence keeps the GPU from new
//! requests only: its holders keep it until they end (`Ledger::holders_of_gpus` says
//! who still has it, for `gpupin drain --wait`).

use crate::model::fence::{Fence, FenceState, Fences};
use crate::model::gpu::Gpu;
use crate::state::audit::{Event, EventKind, GpuRef};
use crate::state::ledger::record::Record;
use crate::state::ledger::{Ledger, LedgerError, store};

impl Ledger {
    /// The GPUs out of allocation now. A fences file that cannot be trusted is an error
    /// (`LedgerError::CorruptFences`), as it is to every allocation.
    pub fn fences(&self) -> Result<Fences, LedgerError> {
        store::fences::load(self.dir())
    }

    /// Takes `gpus` out of allocation (`gpupin drain`): a fence each, `Drained`, with
    /// `reason`, by `by`, replacing a fence it had; one audit line a GPU. The fences set.
    pub fn drain(&self, gpus: &[&Gpu], reason: &str, by: &str) -> Result<Vec<Fence>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        let since = crate::state::ledger::record::unix_now();
        let set: Vec<Fence> = gpus
            .iter()
            .map(|gpu| Fence {
                uuid: gpu.uuid.clone(),
                index: gpu.index,
                state: FenceState::Drained,
                reason: reason.to_string(),
                by: by.to_string(),
                since,
            })
            .collect();
        for fence in &set {
            fences.set(fence.clone());
        }
        store::fences::store(self.dir(), &fences)?;
        for fence in &set {
            self.audit_fence(EventKind::Drain, fence, by);
        }
        self.changed();
        Ok(set)
    }

    /// Puts `gpus` back into allocation (`gpupin undrain`): whatever fence each had, an
    /// admin's or its health's, goes. The fences taken away (a GPU that had none is not
    /// among them).
    pub fn undrain(&self, gpus: &[&Gpu], by: &str) -> Result<Vec<Fence>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        let cleared: Vec<Fence> = gpus.iter().filter_map(|g| fences.clear(&g.uuid)).collect();
        if cleared.is_empty() {
            return Ok(cleared);
        }
        store::fences::store(self.dir(), &fences)?;
        for fence in &cleared {
            self.audit_fence(EventKind::Undrain, fence, by);
        }
        self.changed();
        Ok(cleared)
    }

    /// The live holders that hold any of `gpus` (a MIG instance of one included): who a
    /// drained GPU waits for.
    pub fn holders_of_gpus(&self, gpus: &[&Gpu]) -> Result<Vec<Record>, LedgerError> {
        let uuids: Vec<&str> = gpus
            .iter()
            .flat_map(|g| {
                std::iter::once(g.uuid.as_str())
                    .chain(g.mig_instances().iter().map(|m| m.uuid.as_str()))
            })
            .collect();
        let records = self.records()?;
        let stale: Vec<String> = self
            .stale_ids(&records)
            .into_iter()
            .map(str::to_string)
            .collect();
        Ok(records
            .into_iter()
            .filter(|r| !stale.contains(&r.id))
            .filter(|r| r.gpus.iter().any(|u| uuids.contains(&u.as_str())))
            .collect())
    }

    /// One audit line for a fence set or taken away: the GPU, who, and why.
    fn audit_fence(&self, kind: EventKind, fence: &Fence, by: &str) {
        let mut event = Event::new(kind, &format!("gpu-{}", fence.index));
        event.user = Some(by.to_string());
        event.gpus = vec![GpuRef {
            index: Some(fence.index),
            uuid: fence.uuid.clone(),
        }];
        event.reason = Some(match kind {
            EventKind::Undrain => format!("was {}: {}", fence.state.as_str(), fence.reason),
            _ => fence.reason.clone(),
        });
        event.code = Some(fence.state.as_str().to_string());
        if let Err(source) = self.audit.append(&event) {
            self.audit_failed(&source, Some(&event));
        }
    }
}
