//! GPUs taken out of allocation and put back (`model::fence`): an admin's drain and
//! undrain, under the lock, each in the audit trail. A fence keeps the GPU from new
//! requests only: its holders keep it until they end (`Ledger::holders_of_gpus` says
//! who still has it, for `gpupin drain --wait`).

use crate::model::fence::{Fence, FenceState, FenceTarget, Fences};
use crate::model::gpu::Gpu;
use crate::model::health::{Action, follows};
use crate::state::audit::{Event, EventKind, GpuRef};
use crate::state::ledger::record::Record;
use crate::state::ledger::{Ledger, LedgerError, store};

/// Who sets and clears health fences, in status and the audit log.
pub(crate) const HEALTH_BY: &str = "gpupin serve";

/// The reason of the drain that keeps a GPU out of allocation while `gpupin reset`
/// resets it.
pub(crate) const RESETTING: &str = "being reset (gpupin reset)";

/// How `gpupin reset` ended for one GPU (`Ledger::end_reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetEnd<'a> {
    /// Refused before nvidia-smi ran (someone holds a GPU of the command).
    NotRun,
    /// nvidia-smi failed, saying this.
    Failed(&'a str),
    /// The GPU was reset.
    Done,
}

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
            .map(|&gpu| FenceTarget::from(gpu).fence(FenceState::Drained, reason, by, since))
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

    /// Puts the GPUs and MIG instances with these UUIDs back into allocation (`gpupin
    /// undrain`): whatever fence each had, an admin's or its health's, goes. The fences
    /// taken away (one that had none is not among them).
    pub fn undrain(&self, uuids: &[&str], by: &str) -> Result<Vec<Fence>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        let cleared: Vec<Fence> = uuids.iter().filter_map(|u| fences.clear(u)).collect();
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

    /// Takes `target` (a GPU, or one MIG instance the driver blamed) out of allocation
    /// for its health (`gpupin serve`): a fence in `state` saying `reason`;
    /// `until_clear`: it goes by itself once the condition is no longer reported
    /// (`clear_health`). An admin's drain stands, as does a health fence as grave or
    /// graver. The fence set, if one was.
    pub fn fence_health(
        &self,
        target: FenceTarget<'_>,
        state: FenceState,
        reason: &str,
        until_clear: bool,
    ) -> Result<Option<Fence>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        if let Some(before) = fences.of(target.uuid)
            && (before.state == FenceState::Drained || before.state >= state)
        {
            return Ok(None);
        }
        let since = crate::state::ledger::record::unix_now();
        let fence = Fence {
            until_clear,
            ..target.fence(state, reason, HEALTH_BY, since)
        };
        fences.set(fence.clone());
        store::fences::store(self.dir(), &fences)?;
        self.audit_fence(EventKind::Drain, &fence, HEALTH_BY);
        self.changed();
        Ok(Some(fence))
    }

    /// Makes `gpu`'s health fence set by an event (an XID) follow a condition the GPU now
    /// reports until its reset (the driver's recovery action, a row remap pending), where
    /// the condition asks for as much (`model::health::follows`): the fence then goes by
    /// itself with the condition (`clear_health`), which is how the reset shows. It takes
    /// the graver state of the two, and its reason says both. An admin's drain, and a
    /// fence that already follows one, stand. The fence changed, if it was.
    pub fn follow_condition(
        &self,
        gpu: &Gpu,
        condition: Action,
        reason: &str,
    ) -> Result<Option<Fence>, LedgerError> {
        let Some(state) = condition.fence() else {
            return Ok(None);
        };
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        let Some(before) = fences.of(&gpu.uuid) else {
            return Ok(None);
        };
        // Only the health's own fences: an admin's drain (or a reset's) is not its.
        if before.by != HEALTH_BY || before.until_clear || !follows(before.state, condition) {
            return Ok(None);
        }
        let fence = Fence {
            state: before.state.max(state),
            reason: format!("{}; {reason}", before.reason),
            until_clear: true,
            ..before.clone()
        };
        fences.set(fence.clone());
        store::fences::store(self.dir(), &fences)?;
        self.changed();
        Ok(Some(fence))
    }

    /// Puts `gpu` back once the condition that fenced it is no longer reported (a reset
    /// remapped its rows, cleared its volatile counters): only a fence set `until_clear`.
    pub fn clear_health(&self, gpu: &Gpu) -> Result<Option<Fence>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        if !fences.of(&gpu.uuid).is_some_and(|f| f.until_clear) {
            return Ok(None);
        }
        let cleared = fences.clear(&gpu.uuid);
        store::fences::store(self.dir(), &fences)?;
        if let Some(fence) = &cleared {
            self.audit_fence(EventKind::Undrain, fence, HEALTH_BY);
        }
        self.changed();
        Ok(cleared)
    }

    /// `gpupin reset`'s first step, under the lock: each of `gpus` out of allocation while
    /// it is reset (a drain saying `RESETTING` by `by`, where it had no fence), so that
    /// nothing is handed out between the look for its holders and the reset. The fences
    /// they had before, in order.
    pub(crate) fn begin_reset(
        &self,
        gpus: &[&Gpu],
        by: &str,
    ) -> Result<Vec<Option<Fence>>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        let before: Vec<Option<Fence>> = gpus.iter().map(|g| fences.of(&g.uuid).cloned()).collect();
        let since = crate::state::ledger::record::unix_now();
        for (gpu, had) in gpus.iter().zip(&before) {
            if had.is_none() {
                let target = FenceTarget::from(*gpu);
                fences.set(target.fence(FenceState::Drained, RESETTING, by, since));
            }
        }
        store::fences::store(self.dir(), &fences)?;
        self.changed();
        Ok(before)
    }

    /// `gpupin reset`'s last step for `gpu`, under the lock. After a reset that went
    /// through (`ResetEnd::Done`): its health fences (its own, its MIG instances') and the
    /// drain `begin_reset` set go, an admin's drain stays, and an audit line says so
    /// (`undrain` where a fence went, else `health` with code `reset`). After one that
    /// failed (`Failed`: nvidia-smi's line), its fence is what it was `before`, and a
    /// `health` line (code `reset-failed`) says why; after none (`NotRun`: refused before
    /// it), the same without a line. The health fence the reset cleared, if any.
    pub(crate) fn end_reset(
        &self,
        gpu: &Gpu,
        before: Option<&Fence>,
        end: ResetEnd<'_>,
        by: &str,
    ) -> Result<Option<Fence>, LedgerError> {
        let _lock = store::lock(self.dir())?;
        let mut fences = store::fences::load(self.dir())?;
        fences.clear(&gpu.uuid);
        let mut cleared = None;
        match (end, before) {
            (ResetEnd::Done, Some(had)) if had.state != FenceState::Drained => {
                for m in gpu.mig_instances() {
                    fences.clear(&m.uuid);
                }
                cleared = Some(had.clone());
            }
            (ResetEnd::Done, None) => {}
            // An admin's drain stays; a reset that did not go through changes nothing.
            (_, Some(had)) => {
                fences.set(had.clone());
            }
            (_, None) => {}
        }
        store::fences::store(self.dir(), &fences)?;
        let address = FenceTarget::from(gpu).address();
        let refs = (gpu.index, address.as_str(), gpu.uuid.as_str());
        match (end, &cleared) {
            (ResetEnd::NotRun, _) => {}
            (ResetEnd::Failed(why), _) => self.audit_gpu(
                EventKind::Health,
                refs,
                by,
                format!("nvidia-smi --gpu-reset failed: {why}"),
                "reset-failed",
            ),
            (ResetEnd::Done, Some(fence)) => self.audit_gpu(
                EventKind::Undrain,
                refs,
                by,
                format!("reset; was {}: {}", fence.state.as_str(), fence.reason),
                fence.state.as_str(),
            ),
            (ResetEnd::Done, None) => self.audit_gpu(
                EventKind::Health,
                refs,
                by,
                "reset with nvidia-smi --gpu-reset".into(),
                "reset",
            ),
        }
        self.changed();
        Ok(cleared)
    }

    /// An audit line for a health event that sets no fence (an XID whose action is to
    /// restart the application): the GPU (or MIG instance), what its holders should do,
    /// and why.
    pub fn note_health(&self, target: FenceTarget<'_>, action: &str, reason: &str) {
        self.audit_gpu(
            EventKind::Health,
            (target.index, &target.address(), target.uuid),
            HEALTH_BY,
            reason.to_string(),
            action,
        );
    }

    /// The live holders that hold any of `gpus` (a MIG instance of one included): who a
    /// drained GPU waits for.
    pub fn holders_of_gpus(&self, gpus: &[&Gpu]) -> Result<Vec<Record>, LedgerError> {
        let uuids: Vec<&str> = gpus.iter().flat_map(|g| g.uuids()).collect();
        self.holders_of(&uuids)
    }

    /// The live holders that hold any of the GPUs or MIG instances with these UUIDs.
    pub fn holders_of(&self, uuids: &[&str]) -> Result<Vec<Record>, LedgerError> {
        let records = self.records()?;
        let stale = self.stale_ids(&records);
        Ok(records
            .iter()
            .filter(|r| !stale.contains(r.id.as_str()))
            .filter(|r| r.gpus.iter().any(|u| uuids.contains(&u.as_str())))
            .cloned()
            .collect())
    }

    /// One audit line for a fence set or taken away: the GPU, who, and why.
    fn audit_fence(&self, kind: EventKind, fence: &Fence, by: &str) {
        let reason = match kind {
            EventKind::Undrain => format!("was {}: {}", fence.state.as_str(), fence.reason),
            _ => fence.reason.clone(),
        };
        self.audit_gpu(
            kind,
            (fence.index, &fence.address(), &fence.uuid),
            by,
            reason,
            fence.state.as_str(),
        );
    }

    /// One audit line about GPU (or MIG instance) `(index, address, uuid)`, named
    /// `gpu-<address>` (`gpu-3`, `gpu-3:1`): who, why, and a short `code` for counting.
    fn audit_gpu(
        &self,
        kind: EventKind,
        (index, address, uuid): (u32, &str, &str),
        by: &str,
        reason: String,
        code: &str,
    ) {
        let mut event = Event::new(kind, &format!("gpu-{address}"));
        event.user = Some(by.to_string());
        event.gpus = vec![GpuRef {
            index: Some(index),
            uuid: uuid.to_string(),
        }];
        event.reason = Some(reason);
        event.code = Some(code.to_string());
        if let Err(source) = self.audit.append(&event) {
            self.audit_failed(&source, Some(&event));
        }
    }
}
