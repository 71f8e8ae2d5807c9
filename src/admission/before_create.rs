//! Editing a container's spec before create, as podman's precreate hook and the Docker
//! shim's `create` both do: where a request is found in the spec (`SpecSources`), what a
//! spec that asks gpupin for nothing keeps of NVIDIA's request (`strip_unrequested`), and
//! the admission whose edits go into the spec under a claim (`edit_spec`). One copy for
//! both, so that they cannot drift apart; they differ only in where the spec comes from
//! and goes (stdin and stdout, the bundle's config.json), the claim's holder (a fresh
//! claim id, the container id) and what the engine adds (Docker's labels and `--gpus`).

use crate::admission::admit::{self, Admission, Claim};
use crate::admission::edits::{self, ApplyError, HookCommand};
use crate::admission::entry::EntryError;
use crate::admission::foreign::{self, GpuNumbers};
use crate::admission::spec::{self, SpecError};
use crate::input::config::{Config, ConfigError, Unrequested};
use crate::input::request::{self, GpuRequest, RequestError};
use crate::state::ledger::{ClaimToken, HolderMeta, Record};
use serde_json::Value;
use std::collections::HashMap;

/// The config as an entry point has it: loaded already (the shim), or loaded when a
/// source first needs it (`LoadOnce`: precreate, where a spec that asks for nothing
/// costs no config read).
pub(crate) trait ConfigSource {
    fn config(&mut self) -> Result<&Config, EntryError>;
}

impl ConfigSource for &Config {
    fn config(&mut self) -> Result<&Config, EntryError> {
        Ok(self)
    }
}

/// A config loaded on first use.
pub(crate) struct LoadOnce<L> {
    load: Option<L>,
    config: Option<Config>,
}

impl<L: FnOnce() -> Result<Config, ConfigError>> LoadOnce<L> {
    pub(crate) fn new(load: L) -> Self {
        LoadOnce {
            load: Some(load),
            config: None,
        }
    }

    /// The config, loaded now unless a source already did.
    pub(crate) fn into_config(mut self) -> Result<Config, EntryError> {
        self.config()?;
        Ok(self.config.take().expect("just loaded"))
    }
}

impl<L: FnOnce() -> Result<Config, ConfigError>> ConfigSource for LoadOnce<L> {
    fn config(&mut self) -> Result<&Config, EntryError> {
        if let Some(load) = self.load.take() {
            self.config = Some(load()?);
        }
        Ok(self.config.as_ref().expect("loaded above or before"))
    }
}

/// What an engine adds to the spec's own sources: Docker's labels and `--gpus` for the
/// shim (read from the container's folder); `NoEngine` for precreate, where podman puts
/// everything in the spec. `Error` is the entry point's own.
pub(crate) trait EngineSources {
    type Error: From<EntryError> + From<RequestError>;
    fn labels(&mut self) -> Result<Option<GpuRequest>, Self::Error> {
        Ok(None)
    }
    fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, Self::Error> {
        Ok(None)
    }
}

/// No source beyond the spec.
pub(crate) struct NoEngine;

impl EngineSources for NoEngine {
    type Error = EntryError;
}

/// Where an entry point that edits the spec before create finds a request: the spec's
/// annotations and process env, what the engine adds, and last the GPUs NVIDIA's stack
/// was asked for around gpupin (`foreign_request`).
pub(crate) struct SpecSources<'a, C, X> {
    pub annotations: HashMap<String, String>,
    pub spec: &'a Value,
    pub config: C,
    pub engine: X,
}

impl<'a, C: ConfigSource, X: EngineSources> SpecSources<'a, C, X> {
    pub(crate) fn new(spec: &'a Value, config: C, engine: X) -> Self {
        SpecSources {
            annotations: spec::annotations(spec),
            spec,
            config,
            engine,
        }
    }
}

impl<C: ConfigSource, X: EngineSources> request::Sources for SpecSources<'_, C, X> {
    type Error = X::Error;
    fn annotations(&self) -> &HashMap<String, String> {
        &self.annotations
    }
    fn labels(&mut self) -> Result<Option<GpuRequest>, X::Error> {
        self.engine.labels()
    }
    fn env(&mut self) -> Result<Vec<String>, X::Error> {
        Ok(spec::process_env(self.spec))
    }
    fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, X::Error> {
        self.engine.docker_gpus()
    }
    fn foreign(&mut self) -> Result<Option<GpuRequest>, X::Error> {
        let spec = self.spec;
        let config = self.config.config()?;
        Ok(foreign_request(spec, config)?)
    }
}

/// The GPUs NVIDIA's stack was asked for in `spec` around gpupin, as a request
/// (`foreign::request`); the inventory is read only for a spec with device nodes.
pub(crate) fn foreign_request(
    spec: &Value,
    config: &Config,
) -> Result<Option<GpuRequest>, EntryError> {
    foreign::request(spec, config.unrequested, || {
        let inventory = config.load_inventory()?;
        Ok(GpuNumbers::of(&inventory))
    })
}

/// A spec that asks gpupin for nothing, under `unrequested = "strip"`: what it asked
/// NVIDIA's stack for is voided in `spec_value`. `true`: it was changed. `unrequested`
/// (the config's) is asked only for a spec that asks NVIDIA's stack for something.
pub(crate) fn strip_unrequested<E>(
    spec_value: &mut Value,
    unrequested: impl FnOnce() -> Result<Unrequested, E>,
) -> Result<bool, E> {
    let mut voided = spec_value.clone();
    if !foreign::void(&mut voided) || unrequested()? != Unrequested::Strip {
        return Ok(false);
    }
    *spec_value = voided;
    Ok(true)
}

/// What `edit_spec` needs besides the spec.
pub(crate) struct BeforeCreate<'a> {
    pub config: &'a Config,
    pub request: &'a GpuRequest,
    /// The spec's annotations, as the request was read from them.
    pub annotations: &'a HashMap<String, String>,
    /// The claim the GPUs are held under until the container's hook binds them: its
    /// holder is the container id where the engine gave one (the shim), else a fresh
    /// claim id (precreate).
    pub token: &'a ClaimToken,
    /// How the runtime calls gpupin back (bind at prestart, release at poststop).
    pub hook: &'a HookCommand,
    pub meta: HolderMeta,
    /// The engine's labels beyond the annotations (Docker's): one may name the
    /// container's user (`trusted_user`).
    pub labels: HashMap<String, String>,
}

/// Admits the request and edits `spec_value` (the GPUs' nodes, cgroup rules, env, the
/// hooks and the claim's annotations), then `persist` puts it where the runtime reads it;
/// what `persist` returns comes back beside the record. A failed edit or write releases
/// the GPUs again (`admit`).
pub(crate) fn edit_spec<T>(
    step: BeforeCreate<'_>,
    spec_value: &mut Value,
    persist: impl FnOnce(&Value) -> Result<T, SpecError>,
) -> Result<(Record, T), EntryError> {
    // Annotations that only gpupin writes, set by the container's author, would be taken
    // for gpupin's own by the hook that binds the claim.
    edits::refuse_reserved(step.annotations)?;
    let admission = Admission {
        holder: step.token.holder(),
        request: step.request,
        meta: step.meta,
        claim: Some(Claim {
            token: step.token,
            hook: step.hook,
            driver_by_name: false,
        }),
        slurm_job: request::slurm_job(&spec::process_env(spec_value)),
        // The engine's labels over the annotations: Docker's are what a spawner sets.
        labels: step
            .annotations
            .clone()
            .into_iter()
            .chain(step.labels)
            .collect(),
    };
    Ok(admit::admit(step.config, admission, |edits| {
        edits::spec::apply(edits, spec_value)?;
        persist(spec_value).map_err(ApplyError::Spec)
    })?)
}
