//! The lines under `gpupin status`'s GPUs, in each table view: the counts, the jobs'
//! leftovers, why there are no live figures, and the queue.

use super::Status;
use crate::report::leftovers::leftover_lines;
use crate::report::{live, queue_table};
use crate::state::ledger::Record;
use std::fmt::Write;
use std::time::SystemTime;

impl Status<'_> {
    /// The line under the GPUs, the live error and the queue.
    pub(super) fn summary(
        &self,
        out: &mut String,
        running: &[Record],
        now: SystemTime,
        colour: bool,
    ) {
        let total = self.whole_gpus();
        let holders = self.records.len();
        let foreign = self.foreign(running);
        let _ = write!(out, "{} of {total} GPUs free", self.free_gpus());
        let fenced = self.fenced();
        if fenced > 0 {
            let _ = write!(out, ", {fenced} out of allocation");
        }
        if self.inventory.has_mig() {
            let (all, free) = self.mig_counts();
            let _ = write!(out, ", {free} of {all} MIG instances free");
        }
        let _ = write!(
            out,
            ", {holders} holder{}",
            if holders == 1 { "" } else { "s" },
        );
        if foreign > 0 {
            let _ = write!(
                out,
                ", {foreign} process{} {}",
                if foreign == 1 { "" } else { "es" },
                live::FOREIGN
            );
        }
        if !self.waiting.is_empty() {
            let _ = write!(out, ", {} waiting", self.waiting.len());
        }
        let _ = writeln!(out, " ({})", self.inventory.source);
        for line in leftover_lines(self.records, self.leftovers) {
            let _ = writeln!(out, "{line}");
        }
        if let Some(error) = self.live_error {
            let _ = writeln!(out, "no live figures: {error}");
        }
        if let Some(error) = self.fences_error {
            let _ = writeln!(out, "nothing is handed out: {error}");
        }
        if !self.waiting.is_empty() {
            out.push('\n');
            out.push_str(&queue_table(self.waiting, now, colour));
        }
    }
}
