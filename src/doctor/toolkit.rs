//! NVIDIA's container toolkit and its CDI specs: where containers get the driver's
//! libraries from (`driver`). A spec that does not read, or has no entry for one of the
//! inventory's GPUs, fails container starts the same way `driver::add_for_spec` would.

use super::{Finding, Setup};
use crate::admission::driver::{self, cdi};
use crate::admission::edits::ContainerEdits;
use crate::base::message::one_line;
use crate::input::config::Driver;
use crate::input::config::InventorySource;
use crate::model::gpu::Inventory;
use std::path::Path;

const CHECK: &str = "toolkit";
const CDI_CHECK: &str = "cdi";
const TOOLS: [&str; 3] = [
    "nvidia-ctk",
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
];

pub(super) fn check(setup: &Setup, inventory: Option<&Inventory>) -> Vec<Finding> {
    let mut findings = vec![tools(setup)];
    findings.extend(specs(setup, inventory));
    findings
}

fn tools(setup: &Setup) -> Finding {
    let found: Vec<String> = TOOLS
        .iter()
        .filter_map(|tool| setup.find_program(Path::new(tool)))
        .map(|path| path.display().to_string())
        .collect();
    if !found.is_empty() {
        return Finding::ok(
            CHECK,
            format!("NVIDIA container toolkit: {}", found.join(", ")),
        );
    }
    let what = format!(
        "NVIDIA container toolkit: none of {} on PATH",
        TOOLS.join(", ")
    );
    match setup.config.driver {
        Driver::None => Finding::ok(
            CHECK,
            format!("{what}; driver = none: another component gives containers the driver"),
        ),
        _ if simulated(setup) => Finding::ok(
            CHECK,
            format!("{what}; the inventory is simulated: there is no driver to give"),
        ),
        Driver::Auto | Driver::Cdi => Finding::warn(
            CHECK,
            format!(
                "{what}: nothing makes the CDI spec that gives containers the driver's libraries"
            ),
        )
        .fix("install the NVIDIA Container Toolkit (nvidia-ctk)"),
    }
}

fn specs(setup: &Setup, inventory: Option<&Inventory>) -> Vec<Finding> {
    let config = &setup.config;
    if config.driver == Driver::None {
        return vec![Finding::ok(
            CDI_CHECK,
            "cdi: driver = none: CDI specs are not read",
        )];
    }
    let dirs: Vec<String> = config
        .cdi_spec_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let found = match cdi::load(&config.cdi_spec_dirs) {
        Ok(found) => found,
        Err(err) => {
            return vec![
                Finding::problem(
                    CDI_CHECK,
                    format!(
                        "cdi: {}: every container start through gpupin-runtime or podman's precreate hook fails on it",
                        one_line(&err)
                    ),
                )
                .fix(format!("correct or remove it ({} writes a new one)", generate(setup))),
            ];
        }
    };
    if found.is_empty() {
        let what = format!("cdi: no nvidia.com/gpu spec in {}", dirs.join(", "));
        let finding = match config.driver {
            Driver::Cdi => Finding::problem(
                CDI_CHECK,
                format!("{what}: driver = \"cdi\" refuses every container"),
            ),
            _ if simulated(setup) => {
                let what =
                    format!("{what}; the inventory is simulated: there is no driver to give");
                return vec![Finding::ok(CDI_CHECK, what)];
            }
            _ => Finding::warn(
                CDI_CHECK,
                format!("{what}: containers get their GPUs but no driver libraries from gpupin"),
            ),
        };
        return vec![finding.fix(generate(setup))];
    }
    let files: Vec<String> = found.iter().map(|f| f.path.display().to_string()).collect();
    let Some(inventory) = inventory else {
        return vec![Finding::ok(CDI_CHECK, format!("cdi: {}", files.join(", ")))];
    };
    // Each GPU as a container holding only it would ask: one finding per GPU that fails.
    let mut findings: Vec<Finding> = inventory
        .gpus
        .iter()
        .filter_map(|gpu| {
            let mut edits = ContainerEdits::default();
            let uuids = [gpu.uuid.clone()];
            driver::add_for_spec(
                config.driver,
                &config.cdi_spec_dirs,
                inventory,
                &uuids,
                "gpupin doctor",
                &mut edits,
            )
            .err()
            .map(|err| {
                Finding::problem(
                    CDI_CHECK,
                    format!("cdi: GPU {}: {}", gpu.index, one_line(&err)),
                )
                .fix(generate(setup))
            })
        })
        .collect();
    if findings.is_empty() {
        findings.push(Finding::ok(
            CDI_CHECK,
            format!(
                "cdi: {}: entries for all {} GPUs of the inventory",
                files.join(", "),
                inventory.gpus.len()
            ),
        ));
    }
    findings
}

fn simulated(setup: &Setup) -> bool {
    matches!(setup.config.inventory, InventorySource::Sim(_))
}

/// The command that writes a spec where gpupin reads it first.
fn generate(setup: &Setup) -> String {
    let dir = setup
        .config
        .cdi_spec_dirs
        .first()
        .map_or("/etc/cdi".into(), |d| d.display().to_string());
    format!("nvidia-ctk cdi generate --output={dir}/nvidia.yaml")
}
