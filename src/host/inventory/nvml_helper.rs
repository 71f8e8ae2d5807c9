//! NVML in a helper process. gpupin-hook and gpupin-runtime are linked statically in
//! release builds, so that every container start pays little more than an exec; glibc's
//! dlopen from a static program loads a second C library beside the one linked in, and
//! NVIDIA's library (threads, its own allocations) is not to be trusted with that. So
//! those binaries never load NVML themselves: they run `gpupin nvml inventory|live`, the
//! dynamically linked CLI beside them, and read its JSON. It runs only when the inventory
//! cache misses (once a boot) or a policy needs live figures.

use super::{InventoryError, file, live};
use crate::model::gpu::Inventory;
use crate::model::live::Live;
use std::path::Path;
use std::process::{Command, Stdio};

/// The CLI's hidden subcommand and its two questions.
pub(crate) const SUBCOMMAND: &str = "nvml";
pub const INVENTORY: &str = "inventory";
pub const LIVE: &str = "live";
pub const MEMORY_LIMIT: &str = "memory-limit";
/// The exit status of `gpupin nvml inventory` when a GPU in MIG mode has instances NVML
/// cannot read (`InventoryError::MigUnreadable`): not a machine without NVML, so
/// `inventory = "auto"` must not fall back to procfs.
pub const MIG_UNREADABLE_STATUS: u8 = 3;

/// The inventory as `exe nvml inventory` prints it (the inventory file format).
pub(super) fn inventory(exe: &Path) -> Result<Inventory, InventoryError> {
    let text = ask(exe, INVENTORY)?;
    let mut inv = file::from_json(&text, exe)?;
    inv.source = super::NVML_SOURCE.to_string();
    Ok(inv)
}

/// Live figures for the GPUs of `inventory`, from `exe nvml live` (the live file format,
/// by UUID).
pub(super) fn live(exe: &Path, inventory: &Inventory) -> Result<Vec<Live>, InventoryError> {
    let text = ask(exe, LIVE)?;
    live::from_text(text.as_bytes(), exe, inventory)
}

/// What `gpupin nvml live` prints for `gpus`: the live file format, by UUID, with every
/// figure NVML gave (temperature, power, processes).
pub fn live_json(gpus: &[(String, Live)]) -> String {
    live::to_json(gpus)
}

/// A driver-enforced memory limit of `bytes` (`None`: cleared) for cgroup `cgroup` on
/// each GPU of `uuids`, set by `exe nvml memory-limit`: a process of its own, so that
/// NVML's threads never share a job's waiting process (its signals go to the job's
/// waiter, not to a thread the library started).
pub(crate) fn memory_limit(
    exe: &Path,
    uuids: &[&str],
    cgroup: &Path,
    bytes: Option<u64>,
) -> Result<super::nvml_limits::Enforced, InventoryError> {
    let mut args = vec![
        cgroup.display().to_string(),
        bytes.map_or("clear".to_string(), |b| b.to_string()),
    ];
    args.extend(uuids.iter().map(|u| u.to_string()));
    let text = ask_with(exe, MEMORY_LIMIT, &args)?;
    let enforced = super::nvml_limits::Enforced::Yes;
    Ok(match text.trim() == enforced.word() {
        true => enforced,
        false => super::nvml_limits::Enforced::Unsupported,
    })
}

/// What `gpupin nvml memory-limit CGROUP BYTES|clear UUID...` prints: `enforced`, or
/// `unsupported` where the driver has no per-cgroup limits.
pub fn memory_limit_here(args: &[String]) -> Result<String, InventoryError> {
    let bad = |what: &str| InventoryError::NvmlHelper {
        exe: std::path::PathBuf::from(SUBCOMMAND),
        reason: format!("memory-limit {what}: expected CGROUP BYTES|clear UUID..."),
    };
    let [cgroup, bytes, uuids @ ..] = args else {
        return Err(bad("needs a cgroup and bytes"));
    };
    let bytes = match bytes.as_str() {
        "clear" => None,
        n => Some(n.parse::<u64>().map_err(|_| bad(n))?),
    };
    let uuids: Vec<&str> = uuids.iter().map(String::as_str).collect();
    let enforced = super::nvml_limits::set(&uuids, Path::new(cgroup), bytes)?;
    Ok(enforced.word().to_string())
}

fn ask(exe: &Path, question: &str) -> Result<String, InventoryError> {
    ask_with(exe, question, &[])
}

fn ask_with(exe: &Path, question: &str, rest: &[String]) -> Result<String, InventoryError> {
    let output = Command::new(exe)
        .args([SUBCOMMAND, question])
        .args(rest)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| InventoryError::NvmlHelperStart {
            exe: exe.to_path_buf(),
            source,
        })?;
    if !output.status.success() {
        // Its one line, without the "gpupin: " every binary puts first.
        let stderr = String::from_utf8_lossy(&output.stderr);
        let line = stderr.lines().last().unwrap_or_default();
        let reason = line.strip_prefix("gpupin: ").unwrap_or(line);
        if output.status.code() == Some(i32::from(MIG_UNREADABLE_STATUS)) {
            return Err(InventoryError::NvmlHelperMigUnreadable {
                exe: exe.to_path_buf(),
                reason: reason.to_string(),
            });
        }
        return Err(InventoryError::NvmlHelper {
            exe: exe.to_path_buf(),
            reason: if reason.is_empty() {
                format!("exited with {} and no reason", output.status)
            } else {
                reason.to_string()
            },
        });
    }
    String::from_utf8(output.stdout).map_err(|_| InventoryError::NvmlHelper {
        exe: exe.to_path_buf(),
        reason: "its output is not UTF-8".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in for `gpupin` that answers with `script`'s output.
    fn helper(dir: &Path, script: &str) -> std::path::PathBuf {
        let exe = dir.join("gpupin");
        std::fs::write(&exe, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    #[test]
    fn inventory_and_live_figures_come_from_the_helper() {
        let dir = tempfile::tempdir().unwrap();
        let machine = super::super::sim::machine("pcie8").unwrap();
        let inv_json = file::to_json(&machine);
        let live: Vec<(String, Live)> = machine
            .gpus
            .iter()
            .map(|g| {
                let l = Live {
                    utilization: Some(g.index * 10),
                    memory_free: 1 << 30,
                    temperature: Some(30 + g.index),
                    power: None,
                    processes: Some(vec![crate::model::live::GpuProcess {
                        pid: 1000 + g.index as i32,
                        used_memory: Some(1 << 20),
                    }]),
                };
                (g.uuid.clone(), l)
            })
            .collect();
        let inv_file = dir.path().join("inv.json");
        let live_file = dir.path().join("live.json");
        std::fs::write(&inv_file, inv_json).unwrap();
        std::fs::write(&live_file, live_json(&live)).unwrap();
        let exe = helper(
            dir.path(),
            &format!(
                "[ \"$1 $2\" = \"nvml inventory\" ] && exec cat {}\n[ \"$1 $2\" = \"nvml live\" ] && exec cat {}\nexit 3",
                inv_file.display(),
                live_file.display()
            ),
        );
        let got = inventory(&exe).unwrap();
        assert_eq!(got.source, "nvml");
        assert_eq!(got.gpus, machine.gpus);
        let figures = super::live(&exe, &got).unwrap();
        assert_eq!(figures[3].utilization, Some(30));
        assert_eq!(figures[3].memory_free, 1 << 30);
        assert_eq!(figures[3].temperature, Some(33));
        assert_eq!(figures[3].processes.as_ref().unwrap()[0].pid, 1003);
    }

    #[test]
    fn a_failing_helper_is_one_line_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let exe = helper(
            dir.path(),
            "echo 'gpupin: NVML is not available (is the NVIDIA driver installed?)' >&2; exit 1",
        );
        let err = inventory(&exe).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "NVML through {}: NVML is not available (is the NVIDIA driver installed?)",
                exe.display()
            )
        );
    }

    /// The helper's own status for a GPU in MIG mode it cannot read keeps that apart from
    /// "no NVML", so `auto` does not fall back to procfs.
    #[test]
    fn unreadable_mig_instances_are_their_own_error() {
        let dir = tempfile::tempdir().unwrap();
        let exe = helper(
            dir.path(),
            &format!(
                "echo 'gpupin: GPU 0 (GPU-1) is in MIG mode but its instances cannot be read, so nothing of it is handed out: x' >&2; exit {MIG_UNREADABLE_STATUS}"
            ),
        );
        let err = inventory(&exe).unwrap_err();
        assert!(
            matches!(err, InventoryError::NvmlHelperMigUnreadable { .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "NVML through {}: GPU 0 (GPU-1) is in MIG mode but its instances cannot be read, so nothing of it is handed out: x",
                exe.display()
            )
        );
    }

    #[test]
    fn a_missing_helper_names_the_path() {
        let err = inventory(Path::new("/nonexistent/gpupin")).unwrap_err();
        assert!(matches!(err, InventoryError::NvmlHelperStart { .. }));
        assert!(err.to_string().contains("/nonexistent/gpupin"), "{err}");
    }
}
