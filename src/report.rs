//! `gpupin inventory` and `gpupin status`, rendered to strings (tables for people, JSON
//! for scripts). The binary prints them.

use crate::inventory::Inventory;
use crate::ledger::{Mode, Record, holders_of};
use serde_json::{Value, json};
use std::fmt::Write;
use std::time::{Duration, SystemTime};

/// Bytes as the GiB figure nvidia-smi users expect.
fn gib(bytes: u64) -> String {
    format!("{:.0}GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// ` (shared)` or ` (shared, 20GiB)` after a shared holder's id; nothing for exclusive ones.
fn sharing(record: &Record) -> String {
    match (record.mode, record.request.reserve) {
        (Mode::Exclusive, _) => String::new(),
        (Mode::Shared, None) => " (shared)".into(),
        (Mode::Shared, Some(r)) => format!(" (shared, {})", crate::units::format_size(r)),
    }
}

fn since(record: &Record) -> String {
    humantime::format_rfc3339_seconds(record.created()).to_string()
}

fn holder_json(r: &Record, now: SystemTime, grace: Duration) -> Value {
    json!({
        "id": r.id,
        "gpus": r.gpus,
        "mode": r.mode,
        "pid": r.pid,
        "since": since(r),
        "source": r.source,
        "state": if r.is_stale(now, grace) { "gone" } else { "running" },
        "request": r.request,
    })
}

/// `gpupin status --json`. `grace`: how long a holder may go without a pid.
pub fn status_json(inventory: &Inventory, records: &[Record], grace: Duration) -> Value {
    let now = SystemTime::now();
    let gpus: Vec<Value> = inventory
        .gpus
        .iter()
        .map(|g| {
            let holders: Vec<Value> = holders_of(&g.uuid, records)
                .map(|r| holder_json(r, now, grace))
                .collect();
            json!({
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "minor": g.minor,
                "holders": holders,
            })
        })
        .collect();
    let held = inventory
        .gpus
        .iter()
        .filter(|g| holders_of(&g.uuid, records).next().is_some())
        .count();
    json!({
        "inventory": inventory.source,
        "total": inventory.gpus.len(),
        "free": inventory.gpus.len() - held,
        "gpus": gpus,
        "holders": records.iter().map(|r| holder_json(r, now, grace)).collect::<Vec<_>>(),
    })
}

/// `gpupin status`: one row per GPU, then a summary line.
pub fn status_table(inventory: &Inventory, records: &[Record], grace: Duration) -> String {
    let now = SystemTime::now();
    let mut rows = vec![[
        "GPU".to_string(),
        "UUID".into(),
        "HOLDER".into(),
        "PID".into(),
        "SINCE".into(),
    ]];
    let mut held = 0;
    for g in &inventory.gpus {
        let holders: Vec<&Record> = holders_of(&g.uuid, records).collect();
        if holders.is_empty() {
            rows.push([
                g.index.to_string(),
                g.uuid.clone(),
                "-".into(),
                "".into(),
                "".into(),
            ]);
            continue;
        }
        held += 1;
        for r in holders {
            let gone = if r.is_stale(now, grace) {
                " (gone)"
            } else {
                ""
            };
            let pid = r.pid.map(|p| p.to_string()).unwrap_or_default();
            rows.push([
                g.index.to_string(),
                g.uuid.clone(),
                format!("{}{}{gone}", r.id, sharing(r)),
                pid,
                since(r),
            ]);
        }
    }
    let mut out = table(&rows);
    let total = inventory.gpus.len();
    let _ = writeln!(
        out,
        "{} of {total} GPUs free, {} holder{} ({})",
        total - held,
        records.len(),
        if records.len() == 1 { "" } else { "s" },
        inventory.source
    );
    out
}

/// `gpupin inventory --json`.
pub fn inventory_json(inventory: &Inventory) -> Value {
    json!({
        "source": inventory.source,
        "gpu_major": inventory.gpu_major,
        "gpus": inventory.gpus,
        "control_nodes": inventory.control_nodes,
        "links": inventory.links,
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
    let _ = writeln!(out, "{} GPUs ({})", inventory.gpus.len(), inventory.source);
    out
}

/// Left-aligned columns separated by two spaces, trailing spaces trimmed.
fn table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let cols = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.as_ref().get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.as_ref().iter().enumerate() {
            let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::UNBOUND_GRACE;
    use crate::policy::testing::machine;
    use crate::request::{GpuRequest, Origin, Selection};

    fn record(id: &str, gpus: &[&str]) -> Record {
        Record {
            id: id.into(),
            gpus: gpus.iter().map(|s| s.to_string()).collect(),
            mode: Mode::Exclusive,
            request: GpuRequest::new(Selection::Count(gpus.len() as u32), Origin::Annotations),
            source: "hook".into(),
            pid: Some(std::process::id() as i32),
            start_time: crate::procinfo::start_time(std::process::id() as i32),
            bundle: None,
            claim_digest: None,
            indices: Vec::new(),
            kind: Default::default(),
            owner: None,
            container: None,
            until_release: false,
            // After this boot, so that the holder counts as running.
            created_at: 4_102_444_800,
        }
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
    }

    #[test]
    fn status_table_shows_holder_and_summary() {
        let inv = machine(2);
        let t = status_table(&inv, &[record("c1", &["GPU-test-0"])], UNBOUND_GRACE);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("GPU  UUID"), "{t}");
        assert!(
            lines[1].contains("GPU-test-0") && lines[1].contains("c1"),
            "{t}"
        );
        assert!(lines[2].ends_with('-'), "{t}");
        assert_eq!(lines[3], "1 of 2 GPUs free, 1 holder (test)");
    }

    #[test]
    fn status_table_marks_shared_holders_and_their_reservations() {
        let inv = machine(1);
        let mut a = record("a", &["GPU-test-0"]);
        a.mode = Mode::Shared;
        a.request.share = crate::request::Share::Shared;
        a.request.reserve = Some(20 << 30);
        let mut b = record("b", &["GPU-test-0"]);
        b.mode = Mode::Shared;
        let t = status_table(&inv, &[a, b], UNBOUND_GRACE);
        assert!(t.contains("a (shared, 20GiB)"), "{t}");
        assert!(t.contains("b (shared)"), "{t}");
        assert!(t.ends_with("0 of 1 GPUs free, 2 holders (test)\n"), "{t}");
    }
}
