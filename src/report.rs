//! `gpupin inventory` and `gpupin status`, rendered to strings (tables for people, JSON
//! for scripts). The binary prints them.

mod holder;
mod table;

use crate::inventory::Inventory;
use crate::ledger::{Record, holders_of};
use serde_json::{Value, json};
use std::fmt::Write;
use std::time::{Duration, SystemTime};
use table::{Cell, table};

/// Bytes as the GiB figure nvidia-smi users expect.
fn gib(bytes: u64) -> String {
    format!("{:.0}GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The widest a status line gets: a terminal's 80 columns.
pub const STATUS_WIDTH: usize = 80;

/// `gpupin status --json`. `grace`: how long a holder may go without a pid.
pub fn status_json(inventory: &Inventory, records: &[Record], grace: Duration) -> Value {
    let now = SystemTime::now();
    let gpus: Vec<Value> = inventory
        .gpus
        .iter()
        .map(|g| {
            let holders: Vec<Value> = holders_of(&g.uuid, records)
                .map(|r| holder::json(r, now, grace))
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
        "holders": records.iter().map(|r| holder::json(r, now, grace)).collect::<Vec<_>>(),
    })
}

/// `gpupin status`: one row per GPU and holder, then a summary line. Rows fit
/// `STATUS_WIDTH`: long names and images are cut with `…` (the JSON has them whole, and
/// the GPUs' UUIDs, which `gpupin inventory` lists too).
pub fn status_table(inventory: &Inventory, records: &[Record], grace: Duration) -> String {
    let now = SystemTime::now();
    let header = ["GPU", "HOLDER", "KIND", "IMAGE", "PID", "AGE"];
    let mut rows: Vec<Vec<Cell>> = vec![header.map(Cell::from).to_vec()];
    let mut held = 0;
    for g in &inventory.gpus {
        let index = Cell::from(g.index.to_string());
        let holders: Vec<&Record> = holders_of(&g.uuid, records).collect();
        if holders.is_empty() {
            rows.push(vec![index, Cell::from("-")]);
            continue;
        }
        held += 1;
        for r in holders {
            let mut row = vec![index.clone()];
            row.extend(holder::cells(r, now, grace));
            rows.push(row);
        }
    }
    // HOLDER and IMAGE give way; GPU, KIND, PID and AGE are short already.
    let mut out = table::fitted(&rows, STATUS_WIDTH, &[(1, 16), (3, 10)]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{ContainerInfo, HolderKind, Mode, Owner, UNBOUND_GRACE};
    use crate::policy::testing::machine;
    use crate::request::{GpuRequest, Origin, Selection};

    pub(super) fn record(id: &str, gpus: &[&str]) -> Record {
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
        a.request.share = crate::request::Share::Shared;
        a.request.reserve = Some(20 << 30);
        let mut b = record("b", &["GPU-test-0"]);
        b.mode = Mode::Shared;
        let t = status_table(&inv, &[a, b], UNBOUND_GRACE);
        assert!(t.contains("a (shared, 20GiB)"), "{t}");
        assert!(t.contains("b (shared)"), "{t}");
        assert!(t.ends_with("0 of 1 GPUs free, 2 holders (test)\n"), "{t}");
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
