//! The inventory backend the config chooses and what it answers, and whether NVML and
//! procfs (or an inventory file and the driver) agree on the GPUs: a UUID or a minor that
//! differs would give a container another GPU than the ledger says.

use super::hardware::{Hardware, nvml_reason};
use super::{Finding, Setup};
use crate::base::message::one_line;
use crate::input::config::InventorySource;
use crate::input::config::inventory as config_inventory;
use crate::model::gpu::Inventory;

const CHECK: &str = "inventory";

/// Reports on the configured backend and returns the inventory it gives, if any.
pub(super) fn check(
    setup: &Setup,
    hw: &Hardware,
    findings: &mut Vec<Finding>,
) -> Option<Inventory> {
    let source = &setup.config.inventory;
    let (finding, in_use) = in_use(setup, hw);
    findings.push(finding);
    if let (Ok(nvml), Ok(procfs)) = (&hw.nvml, &hw.procfs) {
        findings.extend(agreement(&nvml.inventory, "NVML", procfs, "procfs"));
    }
    if let (InventorySource::File(path), Some(file)) = (source, &in_use) {
        let driver = match (&hw.nvml, &hw.procfs) {
            (Ok(nvml), _) => Some((&nvml.inventory, "NVML")),
            (_, Ok(procfs)) => Some((procfs, "procfs")),
            _ => None,
        };
        match driver {
            Some((driver, name)) => findings.extend(agreement(file, "the file", driver, name)),
            None => findings.push(Finding::warn(
                CHECK,
                format!(
                    "inventory file {}: no NVIDIA driver answers here to check its GPUs against",
                    path.display()
                ),
            )),
        }
    }
    in_use
}

fn summary(inv: &Inventory) -> String {
    let mut models: Vec<&str> = inv.gpus.iter().map(|g| g.name.as_str()).collect();
    models.dedup();
    format!(
        "{} GPU{} ({})",
        inv.gpus.len(),
        if inv.gpus.len() == 1 { "" } else { "s" },
        models.join(", ")
    )
}

fn in_use(setup: &Setup, hw: &Hardware) -> (Finding, Option<Inventory>) {
    let source = &setup.config.inventory;
    let config = setup.config_file();
    match source {
        InventorySource::Sim(name) => {
            let inv =
                match config_inventory::load(source, &setup.config.state_dir, &setup.config.nvml) {
                    Ok(inv) => inv,
                    Err(err) => {
                        return (
                            Finding::problem(CHECK, format!("inventory: {}", one_line(&err))),
                            None,
                        );
                    }
                };
            let what = format!(
                "inventory sim:{name}: a simulated machine, {}",
                summary(&inv)
            );
            let finding = match real_gpus(hw) {
                Some((count, by)) => Finding::warn(
                    CHECK,
                    format!("{what}, though {by} sees {count} NVIDIA GPU{} here: containers get fake nodes, never these GPUs", if count == 1 { "" } else { "s" }),
                )
                .fix(format!("set inventory = \"auto\" in {}", config.display())),
                None => Finding::ok(CHECK, format!("{what}; nothing of the host's is used")),
            };
            (finding, Some(inv))
        }
        InventorySource::File(path) => {
            match config_inventory::load(source, &setup.config.state_dir, &setup.config.nvml) {
                Ok(inv) => (
                    Finding::ok(
                        CHECK,
                        format!("inventory file {}: {}", path.display(), summary(&inv)),
                    ),
                    Some(inv),
                ),
                Err(err) => (
                    Finding::problem(CHECK, format!("inventory: {}", one_line(&err))).fix(format!(
                        "correct {} (docs/reference.md: Inventory file format)",
                        path.display()
                    )),
                    None,
                ),
            }
        }
        InventorySource::Nvml | InventorySource::Procfs | InventorySource::Auto => {
            from_driver(source, hw, &config)
        }
    }
}

/// How many GPUs the driver shows, and who says so; `None` when it shows none.
fn real_gpus(hw: &Hardware) -> Option<(usize, &'static str)> {
    match (&hw.nvml, &hw.procfs) {
        (Ok(nvml), _) => Some((nvml.inventory.gpus.len(), "NVML")),
        (_, Ok(procfs)) => Some((procfs.gpus.len(), "procfs")),
        _ => None,
    }
}

fn from_driver(
    source: &InventorySource,
    hw: &Hardware,
    config: &std::path::Path,
) -> (Finding, Option<Inventory>) {
    let nvml = hw.nvml.as_ref().map(|r| &r.inventory);
    let procfs = hw.procfs.as_ref();
    let fix_driver = "install and load the NVIDIA driver (nvidia-smi must work)";
    match source {
        InventorySource::Nvml => match nvml {
            Ok(inv) => (Finding::ok(CHECK, format!("inventory nvml: {}", summary(inv))), Some(inv.clone())),
            Err(err) => (
                Finding::problem(CHECK, format!("inventory nvml: {}", nvml_reason(err)))
                    .fix(format!("{fix_driver}, or set inventory = \"procfs\" in {}", config.display())),
                None,
            ),
        },
        InventorySource::Procfs => match procfs {
            Ok(inv) => (
                Finding::ok(CHECK, format!("inventory procfs: {} (procfs knows no memory sizes, no NVLink)", summary(inv))),
                Some(inv.clone()),
            ),
            Err(err) => (
                Finding::problem(CHECK, format!("inventory procfs: {}", one_line(err))).fix(fix_driver),
                None,
            ),
        },
        _ => match (nvml, procfs) {
            (Ok(inv), _) => (
                Finding::ok(CHECK, format!("inventory auto: NVML answers, {}", summary(inv))),
                Some(inv.clone()),
            ),
            (Err(_), Ok(inv)) => (
                Finding::warn(
                    CHECK,
                    format!(
                        "inventory auto: NVML does not answer, procfs does: {}, without memory sizes or NVLink, so memory filters and topology see less",
                        summary(inv)
                    ),
                )
                .fix("make NVML load (see the driver line)"),
                Some(inv.clone()),
            ),
            (Err(nvml), Err(procfs)) => (
                Finding::problem(
                    CHECK,
                    format!(
                        "inventory auto: no GPU found (NVML: {}; procfs: {})",
                        nvml_reason(nvml),
                        one_line(procfs)
                    ),
                )
                .fix(format!(
                    "{fix_driver}, or set inventory = \"sim:nvswitch8\" in {} to try gpupin without GPUs",
                    config.display()
                )),
                None,
            ),
        },
    }
}

/// Where `a` and `b` disagree about the same machine: GPUs only one knows, minors and bus
/// ids that differ; one finding saying they agree otherwise.
fn agreement(a: &Inventory, a_name: &str, b: &Inventory, b_name: &str) -> Vec<Finding> {
    let mut differences = Vec::new();
    for gpu in &a.gpus {
        match b
            .gpus
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(&gpu.uuid))
        {
            None => differences.push(format!(
                "{} (minor {}) is in {a_name}, not in {b_name}",
                gpu.uuid, gpu.minor
            )),
            Some(other) => {
                if other.minor != gpu.minor {
                    differences.push(format!(
                        "{}: minor {} in {a_name}, {} in {b_name}",
                        gpu.uuid, gpu.minor, other.minor
                    ));
                }
                if !gpu.pci_bus_id.eq_ignore_ascii_case(&other.pci_bus_id) {
                    differences.push(format!(
                        "{}: bus id {} in {a_name}, {} in {b_name}",
                        gpu.uuid, gpu.pci_bus_id, other.pci_bus_id
                    ));
                }
            }
        }
    }
    for gpu in &b.gpus {
        if !a
            .gpus
            .iter()
            .any(|g| g.uuid.eq_ignore_ascii_case(&gpu.uuid))
        {
            differences.push(format!(
                "{} (minor {}) is in {b_name}, not in {a_name}",
                gpu.uuid, gpu.minor
            ));
        }
    }
    if differences.is_empty() {
        return vec![Finding::ok(
            CHECK,
            format!(
                "{a_name} and {b_name} agree on {} GPU{}: UUIDs, minors, bus ids",
                a.gpus.len(),
                if a.gpus.len() == 1 { "" } else { "s" }
            ),
        )];
    }
    differences
        .into_iter()
        .map(|d| {
            Finding::problem(CHECK, format!("inventory: {d}"))
                .fix(format!("find out why {a_name} and {b_name} differ (a GPU excluded, a stale file, a driver half reloaded) before handing out GPUs"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;
    use crate::policy::testing::machine;

    #[test]
    fn agreeing_inventories_are_one_ok_line() {
        let found = agreement(&machine(4), "NVML", &machine(4), "procfs");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].status, Status::Ok);
        assert_eq!(
            found[0].what,
            "NVML and procfs agree on 4 GPUs: UUIDs, minors, bus ids"
        );
    }

    #[test]
    fn each_disagreement_is_a_problem_of_its_own() {
        let nvml = machine(3);
        let mut procfs = machine(3);
        procfs.gpus[1].minor = 7;
        procfs.gpus[2].uuid = "GPU-other".into();
        let found = agreement(&nvml, "NVML", &procfs, "procfs");
        let lines: Vec<&str> = found.iter().map(|f| f.what.as_str()).collect();
        assert_eq!(
            lines,
            [
                "inventory: GPU-test-1: minor 1 in NVML, 7 in procfs",
                "inventory: GPU-test-2 (minor 2) is in NVML, not in procfs",
                "inventory: GPU-other (minor 2) is in procfs, not in NVML",
            ]
        );
        assert!(
            found
                .iter()
                .all(|f| f.status == Status::Problem && f.fix.is_some())
        );
    }
}
