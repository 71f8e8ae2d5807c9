//! `gpupin status`: what it shows (`Status`: the machine, its ledger, and what the GPUs
//! do now where a source says), and what is counted for every view of it. Each view is a
//! module: `compact` (one line per GPU), `long` (`--long`'s tables), `json`; `summary` is
//! the lines under the GPUs they share. `snapshot` is the look at the machine they show,
//! which `gpupin serve`'s `status` op returns too (`served`).

mod compact;
mod json;
mod long;
mod snapshot;
mod summary;

pub(crate) use snapshot::served;
pub use snapshot::{GpuFilter, Snapshot};

use super::{Leftover, live};
use crate::host::whose::Seen;
use crate::model::fence::{Fence, FenceState, Fences};
use crate::model::gpu::Inventory;
use crate::model::live::Live;
use crate::state::ledger::{Idle, Record, Waiting, holders_of};
use std::time::{Duration, SystemTime};

/// What `gpupin status` shows: the machine, its ledger, and, where a source has them,
/// what the GPUs do now.
pub struct Status<'a> {
    pub inventory: &'a Inventory,
    pub records: &'a [Record],
    /// How long a holder may go without a pid.
    pub grace: Duration,
    /// Live figures per GPU position.
    pub live: Option<&'a [Live]>,
    /// The processes on each GPU, by position.
    pub processes: Option<&'a [Vec<Seen>]>,
    /// Why there are no live figures though a source has them, in one line.
    pub live_error: Option<&'a str>,
    /// The requests waiting for GPUs, oldest first.
    pub waiting: &'a [Waiting],
    /// The GPUs (positions in the inventory) to show; `None`: all (`status --gpu`,
    /// `--user`, `--free`).
    pub shown: Option<&'a [usize]>,
    /// The holders `gpupin serve`'s last look found idle (`Ledger::idle`).
    pub idle: &'a [Idle],
    /// Processes left in jobs' cgroups after their main processes exited.
    pub leftovers: &'a [Leftover],
    /// The GPUs out of allocation (drained, unhealthy); `None`: none is.
    pub fences: Option<&'a Fences>,
    /// Why the fences could not be read (then nothing is handed out), in one line.
    pub fences_error: Option<&'a str>,
}

/// `gpupin status` without live figures, uncoloured.
pub fn status_table(inventory: &Inventory, records: &[Record], grace: Duration) -> String {
    Status::new(inventory, records, grace).table(false)
}

impl<'a> Status<'a> {
    /// The ledger's view alone: no live figures.
    pub fn new(inventory: &'a Inventory, records: &'a [Record], grace: Duration) -> Status<'a> {
        Status {
            inventory,
            records,
            grace,
            live: None,
            processes: None,
            live_error: None,
            waiting: &[],
            shown: None,
            idle: &[],
            leftovers: &[],
            fences: None,
            fences_error: None,
        }
    }

    /// The fence of GPU `g`, if it is out of allocation.
    fn fence_of(&self, g: &crate::model::gpu::Gpu) -> Option<&'a Fence> {
        self.fences?.of(&g.uuid)
    }

    /// The fence of MIG instance `m` itself (not its GPU's), if its health took it out.
    fn instance_fence(&self, m: &crate::model::mig::MigInstance) -> Option<&'a Fence> {
        self.fences?.of(&m.uuid)
    }

    /// `DRAINED: fan swap (alice)`, `NEEDS RESET: XID 79 ...`: what keeps GPU `g` out of
    /// allocation, for the tables.
    fn fence_label(&self, g: &crate::model::gpu::Gpu) -> Option<String> {
        self.fence_of(g).map(label)
    }

    /// How many GPUs shown are out of allocation.
    fn fenced(&self) -> usize {
        self.inventory
            .gpus
            .iter()
            .filter(|g| self.fence_of(g).is_some())
            .count()
    }

    /// Since when `r` has been idle (seconds since the Unix epoch), if it is.
    fn idle_since(&self, r: &Record) -> Option<u64> {
        self.idle.iter().find(|i| i.holder == r.id).map(|i| i.since)
    }

    /// The holders that still run: only they can own a process (a gone holder's pid may
    /// be someone else's now).
    fn running(&self, now: SystemTime) -> Vec<Record> {
        self.records
            .iter()
            .filter(|r| !r.is_stale(now, self.grace))
            .cloned()
            .collect()
    }

    /// Live figures and processes of the GPU at `position`, where known.
    fn live_of(&self, position: usize) -> (Option<&'a Live>, Option<&'a [Seen]>) {
        (
            self.live.and_then(|l| l.get(position)),
            self.processes
                .and_then(|p| p.get(position))
                .map(Vec::as_slice),
        )
    }

    /// Whole GPUs free to hand out: no holder, and, where the processes on the GPUs are
    /// known, none running (a process of no holder keeps an exclusive request off it, as
    /// `--free` and a refusal count it).
    fn free_gpus(&self) -> usize {
        let busy = |position: usize| {
            self.processes
                .and_then(|p| p.get(position))
                .is_some_and(|seen| !seen.is_empty())
        };
        self.inventory
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| !g.in_mig_mode())
            .filter(|(_, g)| self.fence_of(g).is_none())
            .filter(|(_, g)| holders_of(&g.uuid, self.records).next().is_none())
            .filter(|(position, _)| !busy(*position))
            .count()
    }

    /// The GPUs that are units: those not in MIG mode.
    fn whole_gpus(&self) -> usize {
        self.inventory
            .gpus
            .iter()
            .filter(|g| !g.in_mig_mode())
            .count()
    }

    /// MIG instances in all, and those no one holds.
    fn mig_counts(&self) -> (usize, usize) {
        let all: Vec<_> = self.inventory.mig_instances().collect();
        let fenced = |m: &&crate::model::mig::MigInstance| {
            self.fences.is_some_and(|f| f.of_instance(m).is_some())
        };
        let free = all
            .iter()
            .filter(|m| !fenced(m))
            .filter(|m| holders_of(&m.uuid, self.records).next().is_none())
            .count();
        (all.len(), free)
    }

    /// `MIG: 2 of 4 free`, or `MIG mode, no instances`, for a GPU in MIG mode.
    fn mig_summary(&self, g: &crate::model::gpu::Gpu) -> Option<String> {
        let list = g.mig.as_ref()?;
        if list.is_empty() {
            return Some("MIG mode, no instances".into());
        }
        let out = list
            .iter()
            .filter(|m| self.instance_fence(m).is_some())
            .count();
        let free = list
            .iter()
            .filter(|m| self.instance_fence(m).is_none())
            .filter(|m| holders_of(&m.uuid, self.records).next().is_none())
            .count();
        Some(match out {
            0 => format!("MIG: {free} of {} free", list.len()),
            _ => format!(
                "MIG: {free} of {} free, {out} out of allocation",
                list.len()
            ),
        })
    }

    /// How many processes on the GPUs no holder owns.
    fn foreign(&self, running: &[Record]) -> usize {
        self.processes
            .into_iter()
            .flatten()
            .flatten()
            .filter(|seen| matches!(live::whose(seen, running), live::Whose::Foreign))
            .count()
    }

    /// Whether the GPU at `position` is one to show.
    fn shows(&self, position: usize) -> bool {
        self.shown.is_none_or(|shown| shown.contains(&position))
    }
}

/// `DRAINED: fan swap (alice)`, `NEEDS RESET: XID 79 ...`: what a fence says in a table.
fn label(fence: &Fence) -> String {
    let state = fence.state.as_str().to_ascii_uppercase().replace('-', " ");
    match fence.state {
        FenceState::Drained => format!("{state}: {} ({})", fence.reason, fence.by),
        FenceState::NeedsReset | FenceState::NeedsReboot => format!("{state}: {}", fence.reason),
    }
}

#[cfg(test)]
mod tests;
