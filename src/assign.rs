//! Writing an assignment into a spec before the runtime reads it: the path shared by the
//! Docker shim and podman's precreate stage. The runtime then creates the nodes and grants
//! them in the device cgroup itself, and gpupin's own hooks bind and release the holder.

use crate::hook::VISIBLE_DEVICES;
use crate::inventory::Inventory;
use crate::ledger::Record;
use crate::request::ASSIGNED_ANNOTATION;
use crate::spec::{self, SpecError};
use serde_json::Value;
use std::path::PathBuf;

/// How a runtime calls gpupin back as a hook.
#[derive(Debug, Clone)]
pub struct HookCommand {
    /// Absolute path of the `gpupin` binary.
    pub exe: PathBuf,
    /// The config gpupin was started with; hooks run with an empty environment, so it is
    /// passed on the command line.
    pub config: Option<PathBuf>,
}

impl HookCommand {
    pub fn args(&self, stage: &str) -> Vec<String> {
        let mut args = vec!["gpupin".to_string()];
        if let Some(config) = &self.config {
            args.push("--config".into());
            args.push(config.display().to_string());
        }
        args.extend(["hook".to_string(), stage.to_string()]);
        args
    }
}

/// Puts the holder's GPUs into `spec`: devices and their cgroup rules, the env later
/// hooks read, the `gpupin.assigned` annotation, a prestart hook that binds the holder to
/// the container's pid and a poststop hook that releases it. Idempotent.
pub fn edit_spec(
    spec: &mut Value,
    inventory: &Inventory,
    record: &Record,
    hook: &HookCommand,
) -> Result<(), SpecError> {
    let uuids = record.gpus.join(",");
    spec::add_devices(spec, &inventory.nodes_for(&record.gpus))?;
    spec::set_env(spec, VISIBLE_DEVICES, &uuids)?;
    spec::set_annotation(spec, ASSIGNED_ANNOTATION, &uuids)?;
    let exe = hook.exe.display().to_string();
    spec::add_hook(spec, "prestart", &exe, &hook.args("prestart"))?;
    spec::add_hook(spec, "poststop", &exe, &hook.args("poststop"))?;
    Ok(())
}
