//! `gpupin status --json`: every GPU with its holders, live figures and processes, every
//! holder, the counts, the queue and the leftovers.

use super::Status;
use crate::report::{holder, live, queue_json};
use crate::state::ledger::holders_of;
use serde_json::{Value, json};
use std::time::SystemTime;

impl Status<'_> {
    /// `gpupin status --json`: per GPU its holders, and its live figures and processes
    /// (null where no source has them); every holder; `live_error` where figures failed.
    pub fn json(&self) -> Value {
        let now = SystemTime::now();
        let running = self.running(now);
        let gpus: Vec<Value> = self
            .inventory
            .gpus
            .iter()
            .enumerate()
            .filter(|(position, _)| self.shows(*position))
            .map(|(position, g)| {
                let holders: Vec<Value> = holders_of(&g.uuid, self.records)
                    .map(|r| holder::json(r, now, self.grace, self.idle_since(r)))
                    .collect();
                let (figures, processes) = self.live_of(position);
                let processes = processes.map(|list| {
                    list.iter()
                        .map(|seen| live::process_json(seen, &live::whose(seen, &running)))
                        .collect::<Vec<_>>()
                });
                let mut gpu = json!({
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "minor": g.minor,
                    "holders": holders,
                    "live": figures.map(|l| live::figures_json(g, l)),
                    "processes": processes,
                    "fence": self.fence_of(g),
                });
                // A GPU in MIG mode: its instances, each with its holders.
                if let Some(list) = &g.mig {
                    gpu["mig"] = list
                        .iter()
                        .map(|m| {
                            json!({
                                "address": m.address(),
                                "uuid": m.uuid,
                                "profile": m.profile,
                                "memory": m.memory_bytes,
                                "fence": self.instance_fence(m),
                                "holders": holders_of(&m.uuid, self.records)
                                    .map(|r| holder::json(r, now, self.grace, self.idle_since(r)))
                                    .collect::<Vec<_>>(),
                            })
                        })
                        .collect();
                }
                gpu
            })
            .collect();
        let total = self.whole_gpus();
        let (mig_total, mig_free) = self.mig_counts();
        json!({
            "inventory": self.inventory.source,
            "total": total,
            "free": self.free_gpus(),
            "fenced": self.fenced(),
            "fences_error": self.fences_error,
            "mig_total": mig_total,
            "mig_free": mig_free,
            "gpus": gpus,
            "holders": self.records.iter().map(|r| holder::json(r, now, self.grace, self.idle_since(r))).collect::<Vec<_>>(),
            "foreign": self.foreign(&running),
            "live_error": self.live_error,
            "waiting": queue_json(self.waiting, now),
            "leftovers": self.leftovers.iter().map(|l| json!({
                "holder": l.holder, "main_pid": l.main_pid, "pid": l.pid, "command": l.command,
            })).collect::<Vec<_>>(),
        })
    }
}
