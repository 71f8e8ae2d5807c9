//! `gpupin inventory`: the GPUs, their MIG instances and links, as a table and as JSON.

use super::gib;
use super::table::table;
use crate::model::gpu::Inventory;
use serde_json::{Value, json};
use std::fmt::Write;

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
