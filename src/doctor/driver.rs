//! The NVIDIA driver: is a kernel module loaded, does NVML load, do their versions match;
//! and, where NVML answers, does `nvidia-smi -q -x` see the same GPUs.

use super::hardware::{Hardware, nvml_reason};
use super::smi::{self, Comparison};
use super::{Finding, Setup};
use crate::base::message::one_line;
use crate::input::config::InventorySource;

const CHECK: &str = "driver";
const SMI_CHECK: &str = "nvidia_smi";

pub(super) fn check(setup: &Setup, hw: &Hardware) -> Vec<Finding> {
    let source = &setup.config.inventory;
    let version_file = setup.proc.join("driver/nvidia/version");
    let finding = match (&hw.module, &hw.nvml) {
        (None, Err(err)) => {
            let what = format!(
                "driver: no NVIDIA kernel module ({} missing) and no NVML ({})",
                version_file.display(),
                nvml_reason(err)
            );
            match source {
                InventorySource::Sim(name) => {
                    Finding::warn(CHECK, format!("{what}; the inventory is simulated (sim:{name})"))
                }
                InventorySource::File(path) => Finding::warn(
                    CHECK,
                    format!("{what}; the inventory is the file {}", path.display()),
                ),
                _ => Finding::problem(CHECK, what).fix(
                    "install and load the NVIDIA driver (nvidia-smi must work), or set inventory = \"sim:nvswitch8\" in the config to try gpupin without GPUs",
                ),
            }
        }
        (Some(module), Ok(nvml)) if *module != nvml.driver => Finding::problem(
            CHECK,
            format!(
                "driver: kernel module {module} but user-space driver {} (NVML): the module loaded is not the driver installed",
                nvml.driver
            ),
        )
        .fix("reboot, or unload and reload the nvidia modules, so that the module matches the installed driver"),
        (module, Ok(nvml)) => Finding::ok(
            CHECK,
            format!(
                "driver {}: NVML {} loads{}{}",
                nvml.driver,
                nvml.nvml,
                nvml.cuda
                    .as_ref()
                    .map_or(String::new(), |cuda| format!(", CUDA {cuda}")),
                match module {
                    Some(_) => String::new(),
                    None => format!(" ({} not readable)", version_file.display()),
                }
            ),
        ),
        (Some(module), Err(err)) => {
            let what = format!(
                "driver: kernel module {module} loaded, but NVML does not answer: {}",
                nvml_reason(err)
            );
            let fix = format!(
                "install the user-space driver {module} (libnvidia-ml.so.1) beside the module"
            );
            match source {
                // These do not need NVML; they only lose what it adds.
                InventorySource::Procfs | InventorySource::Sim(_) | InventorySource::File(_) => {
                    Finding::warn(CHECK, what).fix(fix)
                }
                InventorySource::Auto | InventorySource::Nvml => Finding::problem(CHECK, what).fix(fix),
            }
        }
    };
    vec![finding]
}

/// NVML's GPUs beside nvidia-smi's, with a finding per GPU that differs (one when all
/// agree). Nothing where NVML does not answer: `check` has said so.
pub(super) fn compare_with_smi(
    setup: &Setup,
    hw: &Hardware,
    findings: &mut Vec<Finding>,
) -> Vec<Comparison> {
    let Ok(nvml) = &hw.nvml else {
        return Vec::new();
    };
    let Some(program) = setup.find_program(&setup.nvidia_smi) else {
        findings.push(
            Finding::warn(
                SMI_CHECK,
                format!(
                    "nvidia-smi: {} not found: NVML's readings are not checked against it",
                    setup.nvidia_smi.display()
                ),
            )
            .fix("install the driver's utilities (nvidia-smi)"),
        );
        return Vec::new();
    };
    let log = match smi::query(&program) {
        Ok(log) => log,
        Err(err) => {
            findings.push(
                Finding::problem(SMI_CHECK, format!("nvidia-smi: {}", one_line(&err)))
                    .fix("make nvidia-smi work first: gpupin reads the same driver through NVML"),
            );
            return Vec::new();
        }
    };
    let rows = smi::compare(&nvml.inventory.gpus, &log);
    findings.extend(judge(&rows));
    rows
}

/// One finding per GPU whose readings differ, or one saying they all agree.
fn judge(rows: &[Comparison]) -> Vec<Finding> {
    let differing: Vec<Finding> = rows
        .iter()
        .filter(|row| row.differences().next().is_some())
        .map(|row| {
            let said: Vec<String> = row
                .differences()
                .map(|f| {
                    format!(
                        "{} {} (NVML) vs {} (nvidia-smi)",
                        f.name,
                        f.nvml.as_deref().unwrap_or("missing"),
                        f.nvidia_smi.as_deref().unwrap_or("missing")
                    )
                })
                .collect();
            Finding::problem(
                SMI_CHECK,
                format!("nvidia-smi: GPU {} differs: {}", row.index, said.join("; ")),
            )
            .fix("gpupin follows NVML: find out which is right (driver, persistence mode, nvidia-smi version) before trusting either")
        })
        .collect();
    if differing.is_empty() {
        return vec![Finding::ok(
            SMI_CHECK,
            format!(
                "nvidia-smi -q -x agrees with NVML on {} GPU{}: uuid, minor, bus id, memory",
                rows.len(),
                if rows.len() == 1 { "" } else { "s" }
            ),
        )];
    }
    differing
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;
    use crate::doctor::smi::Field;

    fn row(index: usize, minor_smi: &str) -> Comparison {
        Comparison {
            index,
            fields: vec![
                Field {
                    name: "uuid",
                    nvml: Some("GPU-a".into()),
                    nvidia_smi: Some("GPU-a".into()),
                    same: true,
                },
                Field {
                    name: "minor",
                    nvml: Some("0".into()),
                    nvidia_smi: Some(minor_smi.into()),
                    same: minor_smi == "0",
                },
            ],
        }
    }

    #[test]
    fn one_line_when_all_agree_and_one_per_gpu_that_differs() {
        let all = judge(&[row(0, "0"), row(1, "0")]);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].status, Status::Ok);
        assert_eq!(
            all[0].what,
            "nvidia-smi -q -x agrees with NVML on 2 GPUs: uuid, minor, bus id, memory"
        );
        let some = judge(&[row(0, "0"), row(1, "3")]);
        assert_eq!(some.len(), 1);
        assert_eq!(some[0].status, Status::Problem);
        assert_eq!(
            some[0].what,
            "nvidia-smi: GPU 1 differs: minor 0 (NVML) vs 3 (nvidia-smi)"
        );
    }
}
