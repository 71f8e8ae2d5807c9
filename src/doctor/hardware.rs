//! What the host's NVIDIA driver says, asked once and shared by the checks: the kernel
//! module's version, NVML (versions and GPUs) and the procfs backend's GPUs. Nothing is
//! cached in the state dir: doctor writes nothing.

use crate::host::inventory::{self, InventoryError};
use crate::model::gpu::Inventory;
use nvml_wrapper::Nvml;
use std::ffi::OsStr;
use std::path::Path;

/// The library NVIDIA installs with the driver, as the NVML backend loads it.
const LIBRARY: &str = "libnvidia-ml.so.1";

/// The driver's answers. Errors are kept as errors: each check words them its own way.
#[derive(Debug)]
pub(crate) struct Hardware {
    /// The loaded kernel module's version (`<proc>/driver/nvidia/version`); `None`
    /// when no NVIDIA module is loaded.
    pub module: Option<String>,
    pub nvml: Result<NvmlReading, InventoryError>,
    pub procfs: Result<Inventory, InventoryError>,
}

/// What NVML answered.
#[derive(Debug)]
pub(crate) struct NvmlReading {
    /// The user-space driver's version (`550.54.15`), which must be the module's.
    pub driver: String,
    pub nvml: String,
    /// The CUDA version the driver supports (`12.4`).
    pub cuda: Option<String>,
    pub inventory: Inventory,
}

impl Hardware {
    /// Asks this host's driver, with procfs at `proc`, `sys` and `dev`.
    pub(crate) fn probe(proc: &Path, sys: &Path, dev: &Path) -> Hardware {
        Hardware {
            module: module_version(proc),
            nvml: read_nvml(),
            procfs: inventory::probe_procfs_at(proc, sys, dev),
        }
    }
}

fn read_nvml() -> Result<NvmlReading, InventoryError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(LIBRARY))
        .init()
        .map_err(|source| InventoryError::NvmlUnavailable { source })?;
    let query = |what: &str| {
        let what = what.to_string();
        move |source| InventoryError::Nvml { what, source }
    };
    let driver = nvml.sys_driver_version().map_err(query("driver version"))?;
    let nvml_version = nvml.sys_nvml_version().map_err(query("NVML version"))?;
    let cuda = nvml.sys_cuda_driver_version().ok().map(cuda_version);
    // NVML counts its initialisations: with this handle open, the backend's own init is
    // cheap (without persistence mode, a first init costs seconds per GPU).
    let inventory = inventory::nvml_probe_here()?;
    drop(nvml);
    Ok(NvmlReading {
        driver,
        nvml: nvml_version,
        cuda,
        inventory,
    })
}

/// Why NVML did not answer, short: for a library that does not load, the loader's own
/// words (`libnvidia-ml.so.1: cannot open shared object file: ...`), which every layer
/// above repeats; anything else whole.
pub(super) fn nvml_reason(err: &InventoryError) -> String {
    match err {
        InventoryError::NvmlUnavailable { source } => {
            let mut inner: &dyn std::error::Error = source;
            while let Some(next) = inner.source() {
                inner = next;
            }
            crate::base::message::escape_controls(&inner.to_string())
        }
        other => crate::base::message::one_line(other),
    }
}

/// `12040` as `12.4` (nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor).
fn cuda_version(code: i32) -> String {
    format!("{}.{}", code / 1000, (code % 1000) / 10)
}

/// The version in `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  <date>`
/// (or `... Open Kernel Module for x86_64  550.54.15  Release Build ...`).
fn module_version(proc: &Path) -> Option<String> {
    let text = std::fs::read_to_string(proc.join("driver/nvidia/version")).ok()?;
    parse_module_version(&text)
}

fn parse_module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let after = &line[line.find("Kernel Module")? + "Kernel Module".len()..];
    after
        .split_whitespace()
        .find(|word| {
            word.contains('.')
                && word
                    .split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_module_version_of_both_kinds_of_module() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(
            parse_module_version(proprietary).as_deref(),
            Some("550.54.15")
        );
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  (dvs-builder@U16)  Fri Aug 16 21:42:42 UTC 2024\n";
        assert_eq!(parse_module_version(open).as_deref(), Some("560.35.03"));
        assert_eq!(parse_module_version("garbage"), None);
    }

    #[test]
    fn cuda_versions_read_as_people_write_them() {
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(cuda_version(11080), "11.8");
    }
}
