//! `create` under gpupin-runtime: find the request, admit, write the edited spec.

use super::ShimError;
use crate::admit::{self, Admission, Claim};
use crate::config::Config;
use crate::docker;
use crate::driver::foreign::{self, GpuNumbers, Unrequested};
use crate::edits::{self, HookCommand};
use crate::ledger::{ClaimToken, HolderId, HolderMeta, Record};
use crate::request::{self, GpuRequest};
use crate::spec;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the shim finds a request: the spec's annotations and env, Docker's labels and
/// `--gpus` request in the container's folder when the spec shows one, and last the GPUs
/// NVIDIA's stack was asked for around gpupin.
struct ShimSources<'a> {
    annotations: HashMap<String, String>,
    spec: &'a Value,
    docker_dir: Option<PathBuf>,
    config: &'a Config,
}

impl request::Sources for ShimSources<'_> {
    type Error = ShimError;
    fn annotations(&self) -> &HashMap<String, String> {
        &self.annotations
    }
    fn labels(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        match &self.docker_dir {
            Some(dir) => Ok(docker::label_request(dir)?),
            None => Ok(None),
        }
    }
    fn env(&mut self) -> Result<Vec<String>, ShimError> {
        Ok(spec::process_env(self.spec))
    }
    fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        match &self.docker_dir {
            Some(dir) => Ok(docker::gpus_request(dir)?),
            None => Ok(None),
        }
    }
    fn foreign(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        let config = self.config;
        foreign::request(self.spec, config.unrequested, || {
            let inventory =
                crate::inventory::load(&config.inventory, &config.state_dir, &config.nvml)?;
            Ok(GpuNumbers::of(&inventory))
        })
    }
}

fn sources<'a>(spec_value: &'a Value, id: &str, config: &'a Config) -> ShimSources<'a> {
    ShimSources {
        annotations: spec::annotations(spec_value),
        spec: spec_value,
        docker_dir: docker::container_dir(spec_value, id),
        config,
    }
}

/// Allocates for a container that asks for GPUs and rewrites its spec. `None`: the
/// container asked gpupin for nothing; its bundle was left as it came, or with what it
/// asked NVIDIA's stack for voided (`unrequested = "strip"`).
pub fn prepare(
    config: &Config,
    bundle: &Path,
    id: &str,
    hook: &HookCommand,
) -> Result<Option<Record>, ShimError> {
    let prepared = edit_spec(config, bundle, id, hook);
    match &prepared {
        Ok(Some(record)) => {
            tracing::debug!(container = %record.id, gpus = ?record.gpus, "spec edited; running the real runtime")
        }
        // Debug-formatted: the id is not validated yet when it is refused.
        Ok(None) => tracing::debug!(container = ?id, "no request: passing through"),
        Err(err) => tracing::warn!(
            container = ?id,
            error = %crate::message::one_line(err),
            "refused"
        ),
    }
    prepared
}

fn edit_spec(
    config: &Config,
    bundle: &Path,
    id: &str,
    hook: &HookCommand,
) -> Result<Option<Record>, ShimError> {
    let config_path = bundle.join("config.json");
    let mut spec_value = spec::read(&config_path)?;
    let holder = HolderId::new(id)?;
    let mut sources = sources(&spec_value, id, config);
    tracing::debug!(
        container = %holder,
        docker_dir = ?sources.docker_dir,
        "create: looking for a request"
    );
    let Some(request) = request::find(&mut sources)? else {
        // What it asked NVIDIA's stack for goes too, unless the config says to leave it.
        if config.unrequested == Unrequested::Strip && foreign::void(&mut spec_value) {
            tracing::info!(container = %holder, "no gpupin request: NVIDIA's request set to void");
            spec::write_atomic(&config_path, &spec_value)?;
        }
        return Ok(None);
    };
    edits::refuse_reserved(&sources.annotations)?;
    let token = ClaimToken::new(holder.clone())?;
    let admission = Admission {
        holder: &holder,
        request: &request,
        meta: HolderMeta {
            source: "runtime".into(),
            bundle: Some(bundle.to_path_buf()),
            ..HolderMeta::default()
        },
        claim: Some(Claim {
            token: &token,
            hook,
        }),
    };
    let (record, ()) = admit::admit(config, admission, |edits| {
        edits::spec::apply(edits, &mut spec_value)?;
        Ok(spec::write_atomic(&config_path, &spec_value)?)
    })?;
    Ok(Some(record))
}
