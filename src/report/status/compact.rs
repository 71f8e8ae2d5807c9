//! `gpupin status`'s one line per GPU: its model, what it does now, who holds it.

use super::Status;
use crate::host::whose::Seen;
use crate::report::table::{self, Cell, Style};
use crate::report::{STATUS_WIDTH, gib, holder, live, paint_if};
use crate::state::ledger::{Record, holders_of};
use std::time::SystemTime;

/// `H100 80GB HBM3` of `NVIDIA H100 80GB HBM3`: the vendor is the same on every line.
fn short_model(name: &str) -> String {
    name.strip_prefix("NVIDIA ").unwrap_or(name).to_string()
}

impl Status<'_> {
    /// `gpupin status`: one line per GPU, as gpustat and nvitop give it: its model, what
    /// it does now where live figures are known, who holds it (a holder's name, its user,
    /// since when), and `busy` for a GPU no holder has but a process runs on. Then the
    /// summary line and the queue, as in `table`.
    pub fn compact(&self, colour: bool) -> String {
        let now = SystemTime::now();
        let running = self.running(now);
        let header = ["GPU", "MODEL", "UTIL", "MEMORY", "HOLDER", "USER", "SINCE"];
        let mut rows: Vec<Vec<Cell>> = vec![header.map(Cell::from).to_vec()];
        let mut styles = vec![Style::Header];
        for (position, g) in self.inventory.gpus.iter().enumerate() {
            if !self.shows(position) {
                continue;
            }
            let (figures, processes) = self.live_of(position);
            let (util, memory) = match figures {
                Some(l) => (
                    l.utilization.map_or("-".into(), |u| format!("{u}%")),
                    live::memory(g, l),
                ),
                None => ("-".into(), gib(g.memory_bytes)),
            };
            let holders: Vec<&Record> = holders_of(&g.uuid, self.records).collect();
            let foreign: Vec<&Seen> = processes
                .unwrap_or_default()
                .iter()
                .filter(|seen| matches!(live::whose(seen, &running), live::Whose::Foreign))
                .collect();
            // An idle holder alone on its GPU keeps its marker when the name is cut
            // (the cell's tail); beside others each says so in the text.
            let alone_idle = match holders.as_slice() {
                [r] if !r.is_stale(now, self.grace) => self.idle_since(r),
                _ => None,
            };
            let mut who: Vec<String> = holders
                .iter()
                .map(
                    |r| match (r.is_stale(now, self.grace), self.idle_since(r)) {
                        (true, _) => format!("{} (gone)", holder::label(r)),
                        (false, Some(since)) if alone_idle.is_none() => {
                            format!(
                                "{} (idle {})",
                                holder::label(r),
                                holder::idle_for(now, since)
                            )
                        }
                        (false, _) => holder::label(r),
                    },
                )
                .collect();
            if let Some(first) = foreign.first() {
                let user = first
                    .process
                    .as_ref()
                    .map_or("?".into(), |p| p.user_or_uid());
                who.push(format!("busy: pid {} ({user})", first.pid));
            }
            let mut users: Vec<String> = Vec::new();
            for user in holders
                .iter()
                .filter_map(|r| r.owner.as_ref().map(|o| &o.user))
            {
                if !users.contains(user) {
                    users.push(user.clone());
                }
            }
            let since = holders
                .iter()
                .min_by_key(|r| r.created_at)
                .map(|r| holder::age_of(now, r));
            if let Some(summary) = self.mig_summary(g) {
                who.insert(0, summary);
            }
            // Out of allocation: first, whoever still holds it.
            let fence = self.fence_label(g);
            if let Some(label) = &fence {
                who.insert(0, label.clone());
            }
            let since = since.or_else(|| self.fence_of(g).map(|f| holder::idle_for(now, f.since)));
            rows.push(vec![
                Cell::from(g.index.to_string()),
                Cell::from(short_model(&g.name)),
                Cell::from(util),
                Cell::from(memory),
                Cell {
                    text: if who.is_empty() {
                        "-".into()
                    } else {
                        who.join(", ")
                    },
                    tail: alone_idle.map_or(String::new(), |since| {
                        format!(" (idle {})", holder::idle_for(now, since))
                    }),
                    keep_end: false,
                },
                Cell::from(if users.is_empty() {
                    "-".into()
                } else {
                    users.join(",")
                }),
                Cell::from(since.unwrap_or_else(|| "-".into())),
            ]);
            styles.push(
                match (
                    foreign.is_empty() && fence.is_none(),
                    holders.iter().any(|r| r.is_stale(now, self.grace)),
                ) {
                    (_, true) => Style::Bad,
                    (false, false) => Style::Warn,
                    (true, false) => Style::Plain,
                },
            );
            // Its MIG instances under it, one row each with its holder.
            for m in g.mig_instances() {
                let holders: Vec<&Record> = holders_of(&m.uuid, self.records).collect();
                let mut who: Vec<String> = holders
                    .iter()
                    .map(|r| match r.is_stale(now, self.grace) {
                        true => format!("{} (gone)", holder::label(r)),
                        false => holder::label(r),
                    })
                    .collect();
                // Its health took it out alone: first, whoever still holds it.
                let fence = self.instance_fence(m);
                if let Some(fence) = fence {
                    who.insert(0, super::label(fence));
                }
                let users: Vec<String> = holders
                    .iter()
                    .filter_map(|r| r.owner.as_ref().map(|o| o.user.clone()))
                    .collect();
                let since = holders
                    .iter()
                    .min_by_key(|r| r.created_at)
                    .map(|r| holder::age_of(now, r));
                let dash = |list: Vec<String>, sep: &str| match list.is_empty() {
                    true => "-".to_string(),
                    false => list.join(sep),
                };
                rows.push(vec![
                    Cell::from(format!(" {}", m.address())),
                    Cell::from(format!("MIG {}", m.profile_name())),
                    Cell::from("-"),
                    Cell::from(gib(m.memory_bytes)),
                    Cell::from(dash(who, ", ")),
                    Cell::from(dash(users, ",")),
                    Cell::from(since.unwrap_or_else(|| "-".into())),
                ]);
                styles.push(
                    match (holders.iter().any(|r| r.is_stale(now, self.grace)), fence) {
                        (true, _) => Style::Bad,
                        (false, Some(_)) => Style::Warn,
                        (false, None) => Style::Plain,
                    },
                );
            }
        }
        // MODEL and HOLDER give way; the figures and the user are short already.
        let mut out = paint_if(
            colour,
            table::fitted(&rows, STATUS_WIDTH, &[(1, 8), (4, 12)]),
            &styles,
        );
        self.summary(&mut out, &running, now, colour);
        out
    }
}
