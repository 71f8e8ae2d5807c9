//! The hook's prestart and poststop for a "container" that is only a live process: what
//! `gpupin demo` does where runc or root is missing.
//!
//! Prestart reads the request as the prestart hook does (the state's annotations, else
//! the bundle's process env, through `request::find`) and allocates through the same
//! pipeline, but creates no device node and grants no cgroup access: both need the mount
//! namespace and device cgroup of a real container, and root. Poststop is the hook's own.

use anyhow::Context;
use gpupin::command::{
    Admission, ApplyError, Config, HolderId, HolderMeta, Links, Outcome, Record, Stage, admit,
    edits, hook, request, safe_open, spec,
};
use oci_spec::runtime::State;
use std::collections::HashMap;
use std::path::Path;

/// Allocates what the OCI state `state_json` asks for. `Ok(None)`: it asks for nothing.
pub fn prestart_without_container(
    config: &Config,
    state_json: &[u8],
) -> anyhow::Result<Option<Record>> {
    let state: State = serde_json::from_slice(state_json).context("invalid OCI state")?;
    let id = HolderId::new(state.id())?;
    let annotations = state.annotations().clone().unwrap_or_default();
    // The demo never edits a spec before create: an annotation gpupin writes there was
    // not written by gpupin, and the hook would refuse it too.
    edits::refuse_reserved(&annotations)?;
    // Read up front, as the hook does: a bundle without a readable config.json is
    // refused even when the annotations ask for GPUs.
    let path = state.bundle().join("config.json");
    let bytes = safe_open::read(&path, Links::Refuse)
        .with_context(|| format!("reading {}", path.display()))?;
    let mut sources = BundleSources {
        annotations: &annotations,
        bytes: &bytes,
        path: &path,
    };
    let Some(request) = request::find(&mut sources)? else {
        return Ok(None);
    };
    let admission = Admission {
        holder: &id,
        request: &request,
        meta: HolderMeta {
            source: "demo (no container)".into(),
            pid: *state.pid(),
            bundle: Some(state.bundle().to_path_buf()),
            ..HolderMeta::default()
        },
        claim: None,
        // The demo shows gpupin's own requests; Slurm jobs have their own test.
        slurm_job: None,
        labels: annotations.clone(),
    };
    // No consumer: there is no container to give the GPUs to.
    let (record, ()) = admit::admit(config, admission, |_| Ok::<_, ApplyError>(()))?;
    Ok(Some(record))
}

/// The state's annotations, then the env of the bundle's config.json (read as the hook
/// reads it: a regular file, no symlink), parsed only when the annotations ask for
/// nothing.
struct BundleSources<'a> {
    annotations: &'a HashMap<String, String>,
    bytes: &'a [u8],
    path: &'a Path,
}

impl request::Sources for BundleSources<'_> {
    type Error = anyhow::Error;
    fn annotations(&self) -> &HashMap<String, String> {
        self.annotations
    }
    fn env(&mut self) -> anyhow::Result<Vec<String>> {
        Ok(spec::process_env(&spec::parse(self.bytes, self.path)?))
    }
}

/// `gpupin hook poststop`, in process.
pub fn poststop(config: &Config, state_json: &[u8]) -> anyhow::Result<Option<Record>> {
    // The exe only matters at precreate, which writes it into the spec as the hook.
    let exe = Path::new("gpupin");
    match hook::run(Stage::Poststop, state_json, exe, || Ok(config.clone()))? {
        Outcome::Released(record) => Ok(record),
        // The other outcomes are prestart's.
        _ => Ok(None),
    }
}
