//! `gpupin status --long`: one row per GPU and holder, the summary, then the GPUs'
//! figures and their processes.

use super::Status;
use crate::report::table::{self, Cell, Style};
use crate::report::{STATUS_WIDTH, holder, live, paint_if};
use crate::state::ledger::{Record, holders_of};
use std::time::SystemTime;

impl Status<'_> {
    /// `gpupin status`: one row per GPU and holder, a summary line, then, where live
    /// figures are known, one row of figures per GPU and one per process on a GPU. Rows
    /// fit `STATUS_WIDTH`: long names, images and commands are cut with `…` (the JSON
    /// has them whole, and the GPUs' UUIDs, which `gpupin inventory` lists too).
    /// `colour`: headers bold, gone holders red, processes of no holder yellow.
    pub fn table(&self, colour: bool) -> String {
        let now = SystemTime::now();
        let running = self.running(now);
        let mut out = self.holders_table(now, colour);
        self.summary(&mut out, &running, now, colour);
        if self.live.is_some() {
            out.push('\n');
            out.push_str(&self.figures_table(colour));
        }
        if self
            .processes
            .is_some_and(|p| p.iter().any(|l| !l.is_empty()))
        {
            out.push('\n');
            out.push_str(&self.processes_table(&running, colour));
        }
        out
    }

    fn holders_table(&self, now: SystemTime, colour: bool) -> String {
        let header = ["GPU", "HOLDER", "KIND", "IMAGE", "PID", "AGE"];
        let mut rows: Vec<Vec<Cell>> = vec![header.map(Cell::from).to_vec()];
        let mut styles = vec![Style::Header];
        for (position, g) in self.inventory.gpus.iter().enumerate() {
            if !self.shows(position) {
                continue;
            }
            // Out of allocation: a line saying why, then whoever still holds it.
            if let Some(label) = self.fence_label(g) {
                rows.push(vec![Cell::from(g.index.to_string()), Cell::from(label)]);
                styles.push(Style::Warn);
            }
            // A GPU in MIG mode: a line saying so, then its instances' lines.
            let mut units = vec![(g.index.to_string(), g.uuid.as_str(), None)];
            if let Some(summary) = self.mig_summary(g) {
                rows.push(vec![Cell::from(g.index.to_string()), Cell::from(summary)]);
                styles.push(Style::Plain);
                units = g
                    .mig_instances()
                    .iter()
                    .map(|m| {
                        (
                            format!(" {}", m.address()),
                            m.uuid.as_str(),
                            self.instance_fence(m),
                        )
                    })
                    .collect();
            }
            for (name, uuid, fence) in units {
                let index = Cell::from(name);
                // An instance its health took out alone: a line saying why, then holders.
                if let Some(fence) = fence {
                    rows.push(vec![index.clone(), Cell::from(super::label(fence))]);
                    styles.push(Style::Warn);
                }
                let holders: Vec<&Record> = holders_of(uuid, self.records).collect();
                if holders.is_empty() {
                    if (self.fence_of(g).is_some() && g.mig.is_none()) || fence.is_some() {
                        continue;
                    }
                    rows.push(vec![index, Cell::from("-")]);
                    styles.push(Style::Plain);
                    continue;
                }
                for r in holders {
                    let mut row = vec![index.clone()];
                    row.extend(holder::cells(r, now, self.grace, self.idle_since(r)));
                    rows.push(row);
                    styles.push(match r.is_stale(now, self.grace) {
                        true => Style::Bad,
                        false => Style::Plain,
                    });
                }
            }
        }
        // HOLDER and IMAGE give way; GPU, KIND, PID and AGE are short already.
        let text = table::fitted(&rows, STATUS_WIDTH, &[(1, 16), (3, 10)]);
        paint_if(colour, text, &styles)
    }

    fn figures_table(&self, colour: bool) -> String {
        let mut rows: Vec<Vec<Cell>> = vec![live::FIGURES_HEADER.map(Cell::from).to_vec()];
        for (position, g) in self.inventory.gpus.iter().enumerate() {
            if !self.shows(position) {
                continue;
            }
            let mut row = vec![Cell::from(g.index.to_string())];
            if let (Some(figures), _) = self.live_of(position) {
                row.extend(live::figures(g, figures));
            }
            rows.push(row);
        }
        paint_if(
            colour,
            table::fitted(&rows, STATUS_WIDTH, &[]),
            &[Style::Header],
        )
    }

    fn processes_table(&self, running: &[Record], colour: bool) -> String {
        let mut rows: Vec<Vec<Cell>> = vec![live::PROCESSES_HEADER.map(Cell::from).to_vec()];
        let mut styles = vec![Style::Header];
        for (position, g) in self.inventory.gpus.iter().enumerate() {
            if !self.shows(position) {
                continue;
            }
            let (_, processes) = self.live_of(position);
            for seen in processes.unwrap_or_default() {
                let whose = live::whose(seen, running);
                let mut row = vec![Cell::from(g.index.to_string())];
                row.extend(live::process(seen, &whose, holder::label));
                rows.push(row);
                styles.push(match whose {
                    live::Whose::Foreign => Style::Warn,
                    _ => Style::Plain,
                });
            }
        }
        // USER, HOLDER and COMMAND give way, the command first: it is the longest.
        let text = table::fitted(&rows, STATUS_WIDTH, &[(2, 8), (4, 12), (5, 12)]);
        paint_if(colour, text, &styles)
    }
}
