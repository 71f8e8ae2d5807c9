//! The demo's CUDA-style container: the driver's files through CDI. Its spec is edited
//! before create, as gpupin-runtime and podman's precreate hook do it (the prestart path
//! comes too late for mounts), against a fake driver root and the CDI spec `nvidia-ctk
//! cdi generate` would write for it, both in the demo's directory.

use super::{Setup, gpu_list, nvidia_nodes};
use anyhow::Context;
use gpupin::command::{HolderId, HookCommand, create};
use gpupin_sandbox::driver::{DriverRoot, FakeGpu, driver_files};
use gpupin_sandbox::{self as sandbox, BundleSpec, Container, Runc};
use std::path::Path;

/// The CDI spec dir under the demo's directory; `setup` names it in the config.
pub const CDI_DIR: &str = "cdi";

/// The fake driver root (library files, `nvidia-smi`, firmware, device nodes) and its
/// CDI spec for the demo's machine.
pub fn build(setup: &Setup) -> anyhow::Result<DriverRoot> {
    use std::os::unix::fs::DirBuilderExt;
    let gpus: Vec<FakeGpu> = setup
        .inventory
        .gpus
        .iter()
        .map(|g| FakeGpu {
            index: g.index,
            uuid: g.uuid.clone(),
            minor: g.minor,
        })
        .collect();
    let root = DriverRoot::create(&setup.work, &gpus).map_err(anyhow::Error::msg)?;
    // gpupin reads CDI specs only from dirs no one but root can write to (their hooks
    // run as root): an explicit mode, whatever the umask.
    let dir = setup.work.join(CDI_DIR);
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    root.write_cdi_spec(&dir, &gpus)
        .map_err(anyhow::Error::msg)?;
    Ok(root)
}

/// Edits the bundle of a container asking for one GPU through the shim's own code, starts
/// it with runc, and shows what it got: its nodes, the driver files mounted read-only,
/// what `nvidia-smi` says. Returns whether it went as expected, and the container.
pub fn start(
    setup: &Setup,
    runc: &Runc,
    hook: &HookCommand,
    rootfs: &Path,
) -> anyhow::Result<(bool, Option<Container>)> {
    let id = format!("demo-{}-cuda", std::process::id());
    let bundle = setup.work.join("bundles").join("cuda");
    let spec = BundleSpec::sleeper(rootfs).annotation("gpupin.count", "1");
    sandbox::write_bundle(&bundle, &spec)?;
    let Some(record) = create::prepare(&setup.config, &bundle, &id, hook, None)? else {
        outln!("  cuda    asked for a GPU, but gpupin saw no request")?;
        return Ok((false, None));
    };
    let container = match runc.run_detached(&id, &bundle) {
        Ok(container) => container,
        Err(err) => {
            // As gpupin-runtime does when the runtime fails: no poststop will come.
            gpupin::command::open_ledger(&setup.config)?.release(&HolderId::new(&id)?)?;
            outln!("  cuda    failed: {err}")?;
            return Ok((false, None));
        }
    };
    let nodes = nvidia_nodes(&container)?;
    let mounts = container.exec_stdout(&["cat", "/proc/mounts"])?;
    let read_only: Vec<String> = driver_files()
        .iter()
        .filter(|file| {
            mounts.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.get(1) == Some(&file.as_str())
                    && fields
                        .get(3)
                        .is_some_and(|o| o.split(',').any(|o| o == "ro"))
            })
        })
        .map(|file| file.rsplit('/').next().unwrap_or(file).to_string())
        .collect();
    let smi = container.exec_stdout(&["nvidia-smi"])?;
    outln!(
        "  cuda    annotations gpupin.count=1, spec edited before create -> {}; sees {nodes}",
        gpu_list(&setup.inventory, &record)
    )?;
    outln!(
        "          driver files mounted read-only: {}",
        read_only.join(" ")
    )?;
    outln!("          `nvidia-smi` inside prints: {}", smi.trim())?;
    let all_there = read_only.len() == driver_files().len() && !smi.trim().is_empty();
    Ok((all_there, Some(container)))
}
