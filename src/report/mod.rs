//! `gpupin inventory` and `gpupin status`, rendered to strings (tables for people, JSON
//! for scripts; colour for a terminal, when the binary asks). The binary prints them.

mod holder;
mod live;
mod table;

use crate::host::inventory::{Inventory, Live};
use crate::host::whose::Seen;
use crate::state::ledger::{Idle, Record, Waiting, holders_of};
use serde_json::{Value, json};
use std::fmt::Write;
use std::time::{Duration, SystemTime};
use table::{Cell, Style, table};

/// `H100 80GB HBM3` of `NVIDIA H100 80GB HBM3`: the vendor is the same on every line.
fn short_model(name: &str) -> String {
    name.strip_prefix("NVIDIA ").unwrap_or(name).to_string()
}

/// Bytes as the GiB figure nvidia-smi users expect.
fn gib(bytes: u64) -> String {
    format!("{:.0}GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The widest a status line gets: a terminal's 80 columns.
pub const STATUS_WIDTH: usize = 80;

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
}

/// A process left in a job's cgroup after the job's main process exited: the job keeps
/// its GPUs while it runs (`leftovers = "wait"`), so status names it, and its user knows
/// what to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub holder: String,
    /// The job's main process, which has exited.
    pub main_pid: i32,
    pub pid: i32,
    /// Its command line, as `ps` shows it.
    pub command: String,
}

/// The processes left in the cgroups of jobs whose main process has exited, read from
/// the cgroups the records name and /proc (what `ps` shows anyone).
pub fn leftovers(records: &[Record]) -> Vec<Leftover> {
    let mut found = Vec::new();
    for r in records
        .iter()
        .filter(|r| r.kind == crate::model::holder::HolderKind::Exec)
    {
        let (Some(main_pid), Some(cgroup)) =
            (r.pid, crate::host::confine::JobCgroup::recorded(&r.cgroups))
        else {
            continue;
        };
        if r.start_time
            .is_some_and(|s| crate::base::procinfo::is_alive(main_pid, s))
        {
            continue;
        }
        for pid in cgroup.members() {
            let command = crate::host::whose::read(pid, &|_| None)
                .map_or_else(|| "?".to_string(), |p| p.command);
            found.push(Leftover {
                holder: r.id.clone(),
                main_pid,
                pid,
                command,
            });
        }
    }
    found
}

/// The most leftovers one line names; the rest are counted.
const LEFTOVERS_NAMED: usize = 3;

/// `exec-4242: main process 4242 exited; leftover pid 4250 (python serve.py) keeps its
/// GPUs: end it, or gpupin evict exec-4242`: one line per job, holders in ledger order.
fn leftover_lines(records: &[Record], leftovers: &[Leftover]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in records {
        let mine: Vec<&Leftover> = leftovers.iter().filter(|l| l.holder == r.id).collect();
        let Some(first) = mine.first() else {
            continue;
        };
        let mut named: Vec<String> = mine
            .iter()
            .take(LEFTOVERS_NAMED)
            .map(|l| format!("{} ({})", l.pid, table::cut(&l.command, 40, false)))
            .collect();
        if mine.len() > LEFTOVERS_NAMED {
            named.push(format!("{} more", mine.len() - LEFTOVERS_NAMED));
        }
        let (pids, keeps) = match mine.len() {
            1 => ("pid", "keeps"),
            _ => ("pids", "keep"),
        };
        let name = holder::label(r);
        lines.push(format!(
            "{name}: main process {} exited; leftover {pids} {} {keeps} its GPUs: end {}, or gpupin evict {name}",
            first.main_pid,
            named.join(", "),
            if mine.len() == 1 { "it" } else { "them" },
        ));
    }
    lines
}

/// `gpupin queue` (and the queue in `gpupin status`): one row per waiting request, in
/// the order they will be served: position, the name people know it by, whose it is,
/// what it asked for, how long it has waited, and why it waits (`WaitReason`, as its
/// waiter's last look found; `-` before its first). A request held back only by a limit
/// is `parked` (nobody waits behind it) and says which limit.
pub fn queue_table(waiting: &[Waiting], now: SystemTime, colour: bool) -> String {
    let header = [
        "WAITING", "HOLDER", "USER", "PID", "REQUEST", "WAITED", "WHY",
    ];
    let mut rows: Vec<Vec<Cell>> = vec![header.map(Cell::from).to_vec()];
    for (position, w) in waiting.iter().enumerate() {
        let place = match w.parked {
            true => format!("{} parked", position + 1),
            false => (position + 1).to_string(),
        };
        rows.push(vec![
            Cell::from(place),
            Cell::from(w.name.clone().unwrap_or_else(|| w.holder.clone())),
            Cell::from(w.user.clone().unwrap_or_else(|| "-".into())),
            Cell::from(w.pid.map_or("-".into(), |p| p.to_string())),
            Cell::from(w.request.clone()),
            Cell::from(waited(w, now)),
            Cell::from(why(w)),
        ]);
    }
    // WHY is never cut: it is what the reader came for.
    let text = table::fitted(&rows, STATUS_WIDTH, &[(1, 12), (2, 8), (4, 12)]);
    paint_if(colour, text, &[Style::Header])
}

/// Why `w` waits, for people; `-` before its waiter's first look.
fn why(w: &Waiting) -> String {
    w.reason
        .as_ref()
        .map_or_else(|| "-".into(), ToString::to_string)
}

/// The queue as JSON: the fields of `queue_table`, the wait in seconds.
pub fn queue_json(waiting: &[Waiting], now: SystemTime) -> Value {
    let list: Vec<Value> = waiting
        .iter()
        .enumerate()
        .map(|(position, w)| {
            json!({
                "position": position + 1,
                "holder": w.holder,
                "name": w.name,
                "user": w.user,
                "pid": w.pid,
                "request": w.request,
                "waited_s": waited_secs(w, now),
                "parked": w.parked,
                "reason": w.reason.as_ref().map(ToString::to_string),
            })
        })
        .collect();
    Value::Array(list)
}

fn waited_secs(w: &Waiting, now: SystemTime) -> u64 {
    let since = crate::base::clock::unix(w.queued_at);
    now.duration_since(since).map_or(0, |d| d.as_secs())
}

/// `1m 20s`: how long a request has waited, to the second.
fn waited(w: &Waiting, now: SystemTime) -> String {
    humantime::format_duration(Duration::from_secs(waited_secs(w, now))).to_string()
}

/// `gpupin status --json` without live figures. `grace`: how long a holder may go
/// without a pid.
pub fn status_json(inventory: &Inventory, records: &[Record], grace: Duration) -> Value {
    Status::new(inventory, records, grace).json()
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
        }
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
        let free = all
            .iter()
            .filter(|m| holders_of(&m.uuid, self.records).next().is_none())
            .count();
        (all.len(), free)
    }

    /// `MIG: 2 of 4 free`, or `MIG mode, no instances`, for a GPU in MIG mode.
    fn mig_summary(&self, g: &crate::host::inventory::Gpu) -> Option<String> {
        let list = g.mig.as_ref()?;
        if list.is_empty() {
            return Some("MIG mode, no instances".into());
        }
        let free = list
            .iter()
            .filter(|m| holders_of(&m.uuid, self.records).next().is_none())
            .count();
        Some(format!("MIG: {free} of {} free", list.len()))
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
                    foreign.is_empty(),
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
                let who: Vec<String> = holders
                    .iter()
                    .map(|r| match r.is_stale(now, self.grace) {
                        true => format!("{} (gone)", holder::label(r)),
                        false => holder::label(r),
                    })
                    .collect();
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
                styles.push(match holders.iter().any(|r| r.is_stale(now, self.grace)) {
                    true => Style::Bad,
                    false => Style::Plain,
                });
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

    /// The line under the GPUs, the live error and the queue.
    fn summary(&self, out: &mut String, running: &[Record], now: SystemTime, colour: bool) {
        let total = self.whole_gpus();
        let holders = self.records.len();
        let foreign = self.foreign(running);
        let _ = write!(out, "{} of {total} GPUs free", self.free_gpus());
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
        if !self.waiting.is_empty() {
            out.push('\n');
            out.push_str(&queue_table(self.waiting, now, colour));
        }
    }

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
            // A GPU in MIG mode: a line saying so, then its instances' lines.
            let mut units = vec![(g.index.to_string(), g.uuid.as_str())];
            if let Some(summary) = self.mig_summary(g) {
                rows.push(vec![Cell::from(g.index.to_string()), Cell::from(summary)]);
                styles.push(Style::Plain);
                units = g
                    .mig_instances()
                    .iter()
                    .map(|m| (format!(" {}", m.address()), m.uuid.as_str()))
                    .collect();
            }
            for (name, uuid) in units {
                let index = Cell::from(name);
                let holders: Vec<&Record> = holders_of(uuid, self.records).collect();
                if holders.is_empty() {
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

fn paint_if(colour: bool, text: String, styles: &[Style]) -> String {
    match colour {
        true => table::paint(&text, styles),
        false => text,
    }
}

/// `gpupin inventory --json`.
pub fn inventory_json(inventory: &Inventory) -> Value {
    json!({
        "source": inventory.source,
        "gpu_major": inventory.gpu_major,
        "gpus": inventory.gpus,
        "control_nodes": inventory.control_nodes,
        "links": inventory.links,
        "caps_major": inventory.caps_major,
    })
}

/// `gpupin inventory`: a GPU table, then the link matrix in nvidia-smi's notation.
pub fn inventory_table(inventory: &Inventory) -> String {
    let mut rows = vec![
        [
            "GPU", "UUID", "NAME", "MEMORY", "BUS ID", "NODE", "NUMA", "CPUS",
        ]
        .map(String::from),
    ];
    for g in &inventory.gpus {
        rows.push([
            g.index.to_string(),
            g.uuid.clone(),
            g.name.clone(),
            gib(g.memory_bytes),
            g.pci_bus_id.clone(),
            inventory.gpu_node(g).path,
            g.numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            g.local_cpus.clone().unwrap_or_else(|| "-".into()),
        ]);
        if let Some(row) = rows.last_mut() {
            match g.mig.as_deref() {
                Some([]) => row[2].push_str(" [MIG mode, no instances]"),
                Some(_) => row[2].push_str(" [MIG mode]"),
                None => {}
            }
        }
        // Instances under their parent: the units a MIG-mode GPU is handed out as.
        for m in g.mig_instances() {
            let caps = match m.access {
                Some(a) => format!("nvidia-cap{},{}", a.gi_minor, a.ci_minor),
                None => "- (no gi/ci)".into(),
            };
            rows.push([
                format!(" {}", m.address()),
                m.uuid.clone(),
                format!("MIG {}", m.profile_name()),
                gib(m.memory_bytes),
                "-".into(),
                caps,
                "-".into(),
                "-".into(),
            ]);
        }
    }
    let mut out = table(&rows);
    if let Some(links) = &inventory.links {
        out.push('\n');
        let mut matrix: Vec<Vec<String>> = vec![
            std::iter::once(String::new())
                .chain(inventory.gpus.iter().map(|g| format!("GPU{}", g.index)))
                .collect(),
        ];
        for (a, g) in inventory.gpus.iter().enumerate() {
            let mut row = vec![format!("GPU{}", g.index)];
            row.extend(links[a].iter().map(|l| l.to_string()));
            matrix.push(row);
        }
        out.push_str(&table(&matrix));
    }
    let instances = inventory.mig_instances().count();
    match inventory.has_mig() {
        true => writeln!(
            out,
            "{} GPUs, {instances} MIG instances ({})",
            inventory.gpus.len(),
            inventory.source
        ),
        false => writeln!(out, "{} GPUs ({})", inventory.gpus.len(), inventory.source),
    }
    .ok();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_named_one_line_per_job() {
        let records = [record("exec-40", &[]), record("exec-50", &[])];
        let left = |holder: &str, pid: i32, command: &str| Leftover {
            holder: holder.into(),
            main_pid: 40,
            pid,
            command: command.into(),
        };
        let one = [left("exec-40", 41, "python serve.py")];
        assert_eq!(
            leftover_lines(&records, &one),
            [
                "exec-40: main process 40 exited; leftover pid 41 (python serve.py) keeps its GPUs: end it, or gpupin evict exec-40"
            ]
        );
        let many: Vec<Leftover> = (41..46).map(|p| left("exec-40", p, "sleep 9")).collect();
        assert_eq!(
            leftover_lines(&records, &many),
            [
                "exec-40: main process 40 exited; leftover pids 41 (sleep 9), 42 (sleep 9), 43 (sleep 9), 2 more keep its GPUs: end them, or gpupin evict exec-40"
            ]
        );
        assert!(leftover_lines(&records, &[]).is_empty());
    }
    use crate::model::holder::{ContainerInfo, HolderKind, Owner};
    use crate::policy::testing::machine;
    use crate::state::ledger::{Mode, UNBOUND_GRACE};

    pub(super) use crate::state::ledger::testing::record;

    fn container(id: &str, gpu: &str, engine: &str, name: &str, image: &str) -> Record {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Record {
            container: Some(ContainerInfo {
                engine: some(engine),
                name: some(name),
                image: some(image),
            }),
            ..record(id, &[gpu])
        }
    }

    fn job(id: &str, gpu: &str, kind: HolderKind, user: &str) -> Record {
        Record {
            kind,
            owner: Some(Owner {
                uid: 1000,
                user: user.into(),
                groups: vec!["ml".into()],
            }),
            ..record(id, &[gpu])
        }
    }

    fn hold_without_process(id: &str, gpu: &str, user: &str) -> Record {
        Record {
            pid: None,
            start_time: None,
            until_release: true,
            ..job(id, gpu, HolderKind::Hold, user)
        }
    }

    /// The table's line for GPU `index` (the first, with several holders).
    fn line(table: &str, index: u32) -> &str {
        let prefix = format!("{index}  ");
        table
            .lines()
            .skip(1)
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line for GPU {index}:\n{table}"))
    }

    fn words(line: &str) -> Vec<&str> {
        line.split("  ")
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .collect()
    }

    #[test]
    fn status_json_lists_holders_per_gpu() {
        let inv = machine(3);
        let v = status_json(&inv, &[record("c1", &["GPU-test-1"])], UNBOUND_GRACE);
        assert_eq!(v["total"], 3);
        assert_eq!(v["free"], 2);
        assert_eq!(v["gpus"][1]["holders"][0]["id"], "c1");
        assert_eq!(v["gpus"][1]["holders"][0]["state"], "running");
        assert_eq!(v["gpus"][0]["holders"].as_array().unwrap().len(), 0);
        assert_eq!(v["holders"][0]["since"], "2100-01-01T00:00:00Z");
        assert_eq!(v["holders"][0]["kind"], "container");
        assert_eq!(v["holders"][0]["owner"], Value::Null);
        assert_eq!(v["holders"][0]["container"], Value::Null);
        assert_eq!(v["holders"][0]["until_release"], false);
    }

    #[test]
    fn status_json_says_who_holds_a_gpu() {
        let inv = machine(3);
        let records = [
            container("abc", "GPU-test-0", "docker", "trainer", ""),
            hold_without_process("big-run", "GPU-test-1", "alice"),
        ];
        let v = status_json(&inv, &records, UNBOUND_GRACE);
        let docker = &v["gpus"][0]["holders"][0];
        assert_eq!(
            docker["container"],
            json!({"engine": "docker", "name": "trainer", "image": null})
        );
        let hold = &v["holders"][1];
        assert_eq!(hold["kind"], "hold");
        // The groups stay in the ledger: scripts get who, not what they may do.
        assert_eq!(hold["owner"], json!({"uid": 1000, "user": "alice"}));
        assert_eq!(hold["until_release"], true);
        assert_eq!(hold["pid"], Value::Null);
        assert_eq!(hold["state"], "running");
    }

    /// The one-line view: a GPU shared by three holders of two users names each holder
    /// and each user once.
    #[test]
    fn the_one_line_view_names_each_user_once() {
        let inv = machine(2);
        let records = [
            job("a1", "GPU-test-0", HolderKind::Exec, "alice"),
            job("b1", "GPU-test-0", HolderKind::Exec, "bob"),
            job("a2", "GPU-test-0", HolderKind::Exec, "alice"),
        ];
        let status = Status::new(&inv, &records, UNBOUND_GRACE);
        let text = status.compact(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            words(lines[0]),
            ["GPU", "MODEL", "UTIL", "MEMORY", "HOLDER", "USER", "SINCE"]
        );
        assert!(
            lines[1].contains("a1, b1, a2") && lines[1].contains(" alice,bob "),
            "{text}"
        );
        assert_eq!(words(lines[2])[4..], ["-", "-", "-"], "{text}");
    }

    /// An idle holder (`gpupin serve`'s looks) is marked in the one-line view, in
    /// `--long` and in the JSON; a busy one is not.
    #[test]
    fn an_idle_holder_is_marked_in_each_view() {
        let inv = machine(2);
        let records = [
            job("nb", "GPU-test-0", HolderKind::Exec, "alice"),
            job("train", "GPU-test-1", HolderKind::Exec, "bob"),
        ];
        let since = crate::state::ledger::unix_now() - (3600 + 5 * 60 + 30);
        let idle = [Idle {
            holder: "nb".into(),
            since,
        }];
        let status = Status {
            idle: &idle,
            ..Status::new(&inv, &records, UNBOUND_GRACE)
        };
        let compact = status.compact(false);
        let lines: Vec<&str> = compact.lines().collect();
        assert!(lines[1].contains("nb (idle 1h05m)"), "{compact}");
        assert!(!lines[2].contains("idle"), "{compact}");
        let long = status.table(false);
        assert!(long.contains("nb (alice, idle 1h05m)"), "{long}");
        assert!(long.contains("train (bob)"), "{long}");
        let json = status.json();
        let holder = |id: &str| {
            json["holders"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h["id"] == id)
                .unwrap()
                .clone()
        };
        let nb = holder("nb");
        assert!(nb["idle"]["seconds"].as_u64().unwrap() >= 3930, "{nb}");
        assert_eq!(
            nb["idle"]["since"],
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(since))
                .to_string()
        );
        assert!(holder("train")["idle"].is_null());
        assert_eq!(json["gpus"][0]["holders"][0]["idle"], nb["idle"]);
    }

    #[test]
    fn status_table_shows_holder_and_summary() {
        let inv = machine(2);
        let t = status_table(&inv, &[record("c1", &["GPU-test-0"])], UNBOUND_GRACE);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            words(lines[0]),
            ["GPU", "HOLDER", "KIND", "IMAGE", "PID", "AGE"]
        );
        let pid = std::process::id().to_string();
        assert_eq!(words(lines[1]), ["0", "c1", "container", &pid, "0s"], "{t}");
        assert_eq!(lines[2], "1    -", "{t}");
        assert_eq!(lines[3], "1 of 2 GPUs free, 1 holder (test)");
    }

    #[test]
    fn status_table_names_containers_jobs_and_holds() {
        let inv = machine(5);
        let pid = std::process::id().to_string();
        let records = [
            container("3f2a9c", "GPU-test-0", "docker", "trainer", "my/trainer:2"),
            container("77e1b0", "GPU-test-1", "podman", "", ""),
            record("runc-1", &["GPU-test-2"]),
            job("exec-42", "GPU-test-3", HolderKind::Exec, "bob"),
            hold_without_process("big-run", "GPU-test-4", "alice"),
        ];
        let t = status_table(&inv, &records, UNBOUND_GRACE);
        let row = |i| words(line(&t, i));
        assert_eq!(
            row(0),
            ["0", "trainer", "docker", "my/trainer:2", &pid, "0s"]
        );
        // Podman tells no name: the id, as for plain runc.
        assert_eq!(row(1), ["1", "77e1b0", "podman", &pid, "0s"]);
        assert_eq!(row(2), ["2", "runc-1", "container", &pid, "0s"]);
        assert_eq!(row(3), ["3", "exec-42 (bob)", "exec", &pid, "0s"]);
        assert_eq!(
            row(4),
            ["4", "big-run (alice)", "hold", holder::UNTIL_RELEASED, "0s"]
        );
    }

    #[test]
    fn status_shows_mig_instances_under_their_gpu() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let instance = inv.find_mig("0:2").unwrap().uuid.clone();
        let mut r = crate::state::ledger::testing::record("c1", &[instance.as_str()]);
        r.indices = vec![0];
        let records = [r];
        let status = Status::new(&inv, &records, Duration::from_secs(60));
        let text = status.compact(false);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with("0 ") && lines[1].contains("MIG: 3 of 4 free"),
            "{text}"
        );
        assert!(
            lines[4].starts_with(" 0:2") && lines[4].contains("MIG 1g.10gb"),
            "{text}"
        );
        assert!(lines[4].contains("c1"), "{text}");
        assert!(lines[12].contains("MIG mode, no instances"), "{text}");
        assert!(
            text.contains("6 of 6 GPUs free, 3 of 4 MIG instances free, 1 holder"),
            "{text}"
        );
        assert!(
            text.lines().all(|l| l.chars().count() <= STATUS_WIDTH),
            "{text}"
        );
        let long = status.table(false);
        assert!(long.contains(" 0:2  c1"), "{long}");
        let json = status.json();
        assert_eq!(json["mig_total"], 4);
        assert_eq!(json["mig_free"], 3);
        assert_eq!(json["total"], 6);
        assert_eq!(json["gpus"][0]["mig"][2]["address"], "0:2");
        assert_eq!(json["gpus"][0]["mig"][2]["holders"][0]["id"], "c1");
        assert_eq!(json["gpus"][7]["mig"], serde_json::json!([]));
        assert!(json["gpus"][1].get("mig").is_none());
    }

    #[test]
    fn status_table_fits_80_columns_whatever_the_names() {
        let inv = machine(3);
        let id = "f".repeat(64);
        let image = format!("registry.example.com/{}trainer:v2", "team/".repeat(40));
        let mut shared = container(&id, "GPU-test-0", "docker", "", &image);
        shared.mode = Mode::Shared;
        shared.request.reserve = Some(20 << 30);
        let records = [
            shared,
            container("c2", "GPU-test-1", "containerd", &"n".repeat(200), ""),
            hold_without_process(&"h".repeat(100), "GPU-test-2", "alice"),
        ];
        let t = status_table(&inv, &records, UNBOUND_GRACE);
        for l in t.lines() {
            assert!(
                l.chars().count() <= STATUS_WIDTH,
                "{} columns: {l}\n{t}",
                l.chars().count()
            );
        }
        let first = line(&t, 0);
        assert!(first.contains("  fff… (shared, 20GiB)  docker"), "{t}");
        assert!(first.contains("/team/trainer:v2  "), "{t}");
        assert!(line(&t, 1).contains("nnnn…"), "{t}");
        assert!(line(&t, 2).contains("hhh… (alice)"), "{t}");
        assert!(line(&t, 2).contains(holder::UNTIL_RELEASED), "{t}");
    }

    #[test]
    fn status_table_marks_shared_holders_and_their_reservations() {
        let inv = machine(1);
        let mut a = record("a", &["GPU-test-0"]);
        a.mode = Mode::Shared;
        a.request.share = crate::input::request::Share::Shared;
        a.request.reserve = Some(20 << 30);
        let mut b = record("b", &["GPU-test-0"]);
        b.mode = Mode::Shared;
        let t = status_table(&inv, &[a, b], UNBOUND_GRACE);
        assert!(t.contains("a (shared, 20GiB)"), "{t}");
        assert!(t.contains("b (shared)"), "{t}");
        assert!(t.ends_with("0 of 1 GPUs free, 2 holders (test)\n"), "{t}");
    }

    fn seen(pid: i32, ancestors: &[i32], user: &str, command: &str) -> Seen {
        Seen {
            pid,
            used_memory: Some(3 << 29),
            process: Some(crate::host::whose::Process {
                pid,
                start_time: 1,
                uid: Some(1000),
                user: Some(user.into()),
                command: command.into(),
                ancestors: ancestors.to_vec(),
                cgroup: String::new(),
            }),
        }
    }

    /// Two GPUs: `c1` (this process) holds GPU 0 and runs a child there; GPU 1 runs
    /// bob's process, which no holder owns, and one /proc does not show.
    fn live_machine() -> (Inventory, Vec<Record>, Vec<Live>, Vec<Vec<Seen>>) {
        let me = std::process::id() as i32;
        let live = vec![
            Live {
                utilization: Some(35),
                memory_free: 20 << 30,
                temperature: Some(41),
                power: Some(120),
                processes: None,
            },
            Live {
                utilization: Some(99),
                memory_free: 70 << 30,
                ..Live::default()
            },
        ];
        let hidden = Seen {
            pid: 7,
            used_memory: None,
            process: None,
        };
        let long = format!("python {}", "x".repeat(200));
        let processes = vec![
            vec![seen(4300, &[me, 1], "root", "python serve.py")],
            vec![seen(4242, &[1], "bob", &long), hidden],
        ];
        let records = vec![container("c1", "GPU-test-0", "docker", "trainer", "")];
        (machine(2), records, live, processes)
    }

    #[test]
    fn status_table_shows_figures_and_whose_each_process_is() {
        let (inv, records, live, processes) = live_machine();
        let status = Status {
            live: Some(&live),
            processes: Some(&processes),
            ..Status::new(&inv, &records, UNBOUND_GRACE)
        };
        let t = status.table(false);
        assert!(
            // GPU 1 runs a process of no holder: not free (issue 32, item 5).
            t.contains("0 of 2 GPUs free, 1 holder, 1 process not gpupin's (test)\n"),
            "{t}"
        );
        let figures: Vec<Vec<&str>> = t
            .lines()
            .skip_while(|l| !l.starts_with("GPU  UTIL"))
            .skip(1)
            .take(2)
            .map(words)
            .collect();
        assert_eq!(
            figures[0],
            ["0", "35%", "60.0/80.0GiB", "41C", "120W"],
            "{t}"
        );
        assert_eq!(figures[1], ["1", "99%", "10.0/80.0GiB", "-", "-"], "{t}");
        let rows: Vec<&str> = t
            .lines()
            .skip_while(|l| !l.starts_with("GPU  PID"))
            .skip(1)
            .collect();
        assert_eq!(
            words(rows[0]),
            ["0", "4300", "root", "1.5GiB", "trainer", "python serve.py"]
        );
        assert!(
            rows[1].starts_with("1    4242  bob   1.5GiB  not gpupin's  python xxx"),
            "{t}"
        );
        assert!(rows[1].ends_with('…'), "{t}");
        assert_eq!(words(rows[2]), ["1", "7", "?", "-", "?"]);
        for l in t.lines() {
            assert!(l.chars().count() <= STATUS_WIDTH, "{l}\n{t}");
        }
        assert!(!t.contains('\x1b'));
    }

    #[test]
    fn status_colours_headers_and_foreign_processes_only_when_asked() {
        let (inv, records, live, processes) = live_machine();
        let status = Status {
            live: Some(&live),
            processes: Some(&processes),
            ..Status::new(&inv, &records, UNBOUND_GRACE)
        };
        let t = status.table(true);
        let yellow: Vec<&str> = t.lines().filter(|l| l.starts_with("\x1b[33m")).collect();
        assert_eq!(yellow.len(), 1, "{t}");
        assert!(yellow[0].contains("4242"), "{t}");
        assert_eq!(
            t.lines().filter(|l| l.starts_with("\x1b[1mGPU")).count(),
            3,
            "{t}"
        );
    }

    #[test]
    fn status_json_carries_figures_and_processes() {
        let (inv, records, live, processes) = live_machine();
        let status = Status {
            live: Some(&live),
            processes: Some(&processes),
            ..Status::new(&inv, &records, UNBOUND_GRACE)
        };
        let v = status.json();
        assert_eq!(v["foreign"], 1);
        assert_eq!(v["live_error"], Value::Null);
        let g0 = &v["gpus"][0];
        assert_eq!(
            g0["live"],
            json!({"utilization": 35, "memory_free": 20u64 << 30, "memory_used": 60u64 << 30,
                   "memory_total": 80u64 << 30, "temperature": 41, "power": 120})
        );
        assert_eq!(g0["processes"][0]["holder"], "c1");
        assert_eq!(g0["processes"][0]["foreign"], false);
        let bob = &v["gpus"][1]["processes"][0];
        assert_eq!(bob["holder"], Value::Null);
        assert_eq!(bob["foreign"], true);
        assert_eq!(
            (bob["user"].as_str(), bob["uid"].as_u64()),
            (Some("bob"), Some(1000))
        );
        let hidden = &v["gpus"][1]["processes"][1];
        assert_eq!(
            (hidden["foreign"].clone(), hidden["command"].clone()),
            (Value::Null, Value::Null)
        );
        let without = status_json(&inv, &records, UNBOUND_GRACE);
        assert_eq!(without["gpus"][0]["live"], Value::Null);
        assert_eq!(without["gpus"][0]["processes"], Value::Null);
    }

    #[test]
    fn a_live_error_is_one_line_under_the_summary() {
        let inv = machine(1);
        let status = Status {
            live_error: Some("reading live file /x/live.json: No such file"),
            ..Status::new(&inv, &[], UNBOUND_GRACE)
        };
        let t = status.table(false);
        assert!(
            t.ends_with("(test)\nno live figures: reading live file /x/live.json: No such file\n"),
            "{t}"
        );
    }

    #[test]
    fn status_table_marks_holders_that_are_gone() {
        let inv = machine(1);
        let mut gone = record("c1", &["GPU-test-0"]);
        gone.pid = Some(i32::MAX);
        let t = status_table(&inv, &[gone], UNBOUND_GRACE);
        assert!(line(&t, 0).contains("c1 (gone)"), "{t}");
    }
}
