//! `gpupin hook STAGE`: the OCI hook protocol. The runtime passes the container state on
//! stdin; prestart/createRuntime allocate and give the container its GPUs from outside
//! (runc has already read the spec) or, when the spec was edited before create, bind the
//! holder to the container's pid; poststop releases. Podman's precreate stage passes the
//! proposed spec instead and reads it back, edited, from stdout.

mod limit;
mod precreate;
mod prestart;
pub(crate) mod stage;

use crate::admission::edits::EditsError;
use crate::admission::entry::EntryError;
use crate::admission::foreign;
use crate::admission::spec::{self, SpecError};
use crate::base::safe_open::{self, Links};
use crate::engines::engine;
use crate::input::config::{Config, ConfigError};
use crate::input::request::{self, GpuRequest};
use crate::model::holder::{ContainerInfo, HolderId};
use crate::model::nvidia;
use crate::state::ledger::{ClaimToken, Record};
use oci_spec::runtime::State;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Podman: the spec on stdin, the edited spec on stdout.
    Precreate,
    Prestart,
    CreateRuntime,
    Poststop,
}

impl Stage {
    /// The stage as runtimes name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Precreate => "precreate",
            Stage::Prestart => "prestart",
            Stage::CreateRuntime => "createRuntime",
            Stage::Poststop => "poststop",
        }
    }
}

impl std::str::FromStr for Stage {
    type Err = HookError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "precreate" => Ok(Stage::Precreate),
            "prestart" => Ok(Stage::Prestart),
            "createRuntime" => Ok(Stage::CreateRuntime),
            "poststop" => Ok(Stage::Poststop),
            _ => Err(HookError::UnknownStage(s.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("unknown hook stage {0:?}: expected precreate, prestart, createRuntime or poststop")]
    UnknownStage(String),
    #[error("invalid OCI state on stdin")]
    State(#[source] serde_json::Error),
    #[error("invalid spec on stdin")]
    Spec(#[source] SpecError),
    #[error("bundle of container {id}")]
    Bundle {
        id: String,
        #[source]
        source: SpecError,
    },
    /// A step every entry point takes (the config, the request, the ledger, ...).
    #[error(transparent)]
    Entry(#[from] EntryError),
    #[error(
        "container {0} asks for gpupin.cpus=numa, which needs its spec edited before create (gpupin-runtime or podman's precreate hook); the prestart hook cannot change a cpuset"
    )]
    CpusNeedSpecEdit(String),
    /// A shared container's reservation could not be made the driver's limit.
    #[error(
        "cannot limit container {id}'s GPU memory to its reservation: {reason}; its GPUs were released"
    )]
    MemoryLimit { id: String, reason: String },
    /// Precreate failed and handed its reason to this hook in its arguments (`--refuse`).
    #[error("{0}")]
    Precreate(String),
    #[error(
        "OCI state of container {0} has no pid; a prestart hook needs the container's init process"
    )]
    NoPid(String),
    #[error(
        "cannot give container {id} its GPUs at prestart: this hook runs without {cap} (it enters the container's mount namespace and makes device nodes); run the runtime's hooks as root with full capabilities"
    )]
    MissingCapability { id: String, cap: &'static str },
}

crate::admission::entry::wrap_entry_errors!(HookError);

/// What the hook did, for the binary to report.
#[derive(Debug)]
pub enum Outcome {
    /// The container asked for nothing: nothing was read beyond its state and spec.
    NoRequest,
    Allocated(Record),
    /// The spec was edited before create (shim, precreate); the holder now has its pid.
    Bound(Record),
    /// Precreate: the spec for the runtime, edited or as it came.
    Spec {
        bytes: Vec<u8>,
        claim: Option<Record>,
    },
    /// Poststop: the record released, `None` when nothing was held.
    Released(Option<Record>),
}

/// The container state and what gpupin has to do for it.
struct Container {
    id: HolderId,
    pid: Option<i32>,
    bundle: PathBuf,
    task: Task,
}

/// What this stage has to do for a container that involves gpupin.
enum Task {
    /// Plain runc: allocate now and give the GPUs from outside. `spec` is the bundle's
    /// config.json, parsed once: the env request is read from it, and the prestart path
    /// writes the choice back into it.
    Allocate {
        request: GpuRequest,
        spec: Value,
    },
    /// gpupin edited the spec before create, assigned these UUIDs and held them under
    /// the claim whose token it wrote next to them: record the pid.
    Bind {
        uuids: Vec<String>,
        token: ClaimToken,
    },
    Release,
    /// No request, but the bundle's spec has device nodes or asks NVIDIA's stack for GPUs
    /// (its env, a `cdi.k8s.io` annotation): prestart::unrequested.
    Unrequested {
        spec: Value,
    },
}

impl Task {
    fn name(&self) -> &'static str {
        match self {
            Task::Allocate { .. } => "allocate",
            Task::Bind { .. } => "bind",
            Task::Release => "release",
            Task::Unrequested { .. } => "unrequested",
        }
    }
}

/// Runs one stage. `load_config` is only called when the container asks for GPUs, so the
/// hook costs a container without a request a state parse and one small file read.
///
/// `exe` is the `gpupin-hook` binary, written into specs edited at precreate as their hook.
pub fn run(
    stage: Stage,
    state_json: &[u8],
    exe: &Path,
    load_config: impl FnOnce() -> Result<Config, ConfigError>,
) -> Result<Outcome, HookError> {
    let outcome = run_stage(stage, state_json, exe, load_config);
    if let Err(err) = &outcome {
        // Logged once, here, where the hook gives up; the binary prints the same line.
        tracing::warn!(
            stage = stage.as_str(),
            error = %crate::base::message::one_line(err),
            "refused"
        );
    }
    outcome
}

fn run_stage(
    stage: Stage,
    state_json: &[u8],
    exe: &Path,
    load_config: impl FnOnce() -> Result<Config, ConfigError>,
) -> Result<Outcome, HookError> {
    if stage == Stage::Precreate {
        return precreate::run(state_json, exe, load_config);
    }
    let state: State = serde_json::from_slice(state_json).map_err(HookError::State)?;
    let id = HolderId::new(state.id())?;
    let Some(container) = read_container(id, &state, stage)? else {
        // Seen only with GPUPIN_LOG: the config (and its `log` key) is never read here.
        tracing::debug!(
            stage = stage.as_str(),
            container = ?state.id(),
            "no request: nothing to do"
        );
        return Ok(Outcome::NoRequest);
    };
    // Loading the config may be what turns logging on (its `log` key): the first event
    // comes after it.
    let config = load_config()?;
    let Container {
        id,
        pid,
        bundle,
        task,
    } = container;
    tracing::debug!(
        stage = stage.as_str(),
        container = %id,
        pid = ?pid,
        task = task.name(),
        "hook"
    );
    match task {
        Task::Release => {
            let ledger = crate::state::open_ledger(&config)?;
            Ok(Outcome::Released(ledger.release_container(&id)?))
        }
        Task::Bind { uuids, token } => {
            let pid = pid.ok_or_else(|| HookError::NoPid(id.to_string()))?;
            let ledger = crate::state::open_ledger(&config)?;
            let record = ledger.bind(&id, &token, pid, &uuids)?;
            limit::memory(&config, &ledger, &record, pid)?;
            Ok(Outcome::Bound(record))
        }
        Task::Allocate { request, spec } => {
            let container = prestart::Container {
                id: &id,
                pid,
                bundle: &bundle,
                info: info_of(&state),
            };
            let outcome = prestart::prestart(&container, &request, spec, &config)?;
            if let (Outcome::Allocated(record), Some(pid)) = (&outcome, pid) {
                let ledger = crate::state::open_ledger(&config)?;
                limit::memory(&config, &ledger, record, pid)?;
            }
            Ok(outcome)
        }
        Task::Unrequested { spec } => {
            let container = prestart::Container {
                id: &id,
                pid,
                bundle: &bundle,
                info: info_of(&state),
            };
            prestart::unrequested(&container, spec, &config)
        }
    }
}

/// What the state's annotations tell about the container's engine (podman's mark, CRI's
/// names); plain runc tells nothing.
fn info_of(state: &State) -> Option<ContainerInfo> {
    state
        .annotations()
        .as_ref()
        .and_then(engine::from_annotations)
}

/// Reads the request: annotations first, then the spec's env. `None`: no request at all.
fn read_container(
    id: HolderId,
    state: &State,
    stage: Stage,
) -> Result<Option<Container>, HookError> {
    let annotations = state.annotations().clone().unwrap_or_default();
    // A precreate that failed hands its reason to the prestart hook it adds, in that
    // hook's arguments; the annotation it also leaves is for people (`podman inspect`).
    // Anywhere else gpupin.error was written by the container's author: refused, never
    // repeated.
    if stage != Stage::Poststop && annotations.contains_key(request::ERROR_ANNOTATION) {
        return Err(EditsError::ReservedAnnotation(request::ERROR_ANNOTATION).into());
    }
    let config_path = state.bundle().join("config.json");
    let spec_bytes = match safe_open::read(&config_path, Links::Refuse) {
        Ok(bytes) => bytes,
        // A bundle removed before `runc delete` must not keep its GPUs held.
        Err(_) if stage == Stage::Poststop => request::ENV_PREFIX.as_bytes().to_vec(),
        Err(e) => {
            return Err(HookError::Bundle {
                id: id.to_string(),
                source: SpecError::Read {
                    path: config_path,
                    source: e,
                },
            });
        }
    };
    let has_annotation = annotations
        .keys()
        .any(|k| k.starts_with(request::ANNOTATION_PREFIX));
    // The cheap test first: a spec that never mentions GPUPIN_ has no env request.
    let may_have_env = contains(&spec_bytes, request::ENV_PREFIX.as_bytes());
    if !has_annotation && !may_have_env {
        return unrequested_task(id, state, stage, &spec_bytes, &config_path);
    }
    let task = if stage == Stage::Poststop {
        // Poststop releases whatever the id holds: a request that no longer parses must
        // not keep GPUs held forever.
        Task::Release
    } else if let Some(task) = bind_task(&annotations)? {
        task
    } else {
        let mut sources = BundleSources {
            annotations: &annotations,
            bytes: &spec_bytes,
            path: &config_path,
            id: &id,
            spec: None,
        };
        let Some(request) = request::find(&mut sources)? else {
            return unrequested_task(id, state, stage, &spec_bytes, &config_path);
        };
        let spec = sources.into_spec()?;
        Task::Allocate { request, spec }
    };
    Ok(Some(Container {
        id,
        pid: *state.pid(),
        bundle: state.bundle().to_path_buf(),
        task,
    }))
}

/// A container without a request whose bundle has device nodes (GPUs that runc made
/// for it?) or asks NVIDIA's stack for GPUs; at poststop, one with device nodes is
/// released. `None` for a spec with neither (left unparsed when it names none of them).
fn unrequested_task(
    id: HolderId,
    state: &State,
    stage: Stage,
    bytes: &[u8],
    path: &Path,
) -> Result<Option<Container>, HookError> {
    let markers: [&[u8]; 5] = [
        nvidia::VISIBLE_DEVICES.as_bytes(),
        nvidia::CDI_ANNOTATION_PREFIX.as_bytes(),
        b"nvidia-container-devices",
        // A legacy CUDA image gets every GPU from NVIDIA's runtime without the env var.
        nvidia::CUDA_VERSION.as_bytes(),
        b"\"major\"",
    ];
    if !markers.iter().any(|m| contains(bytes, m)) {
        return Ok(None);
    }
    let spec = spec::parse(bytes, path).map_err(|source| HookError::Bundle {
        id: id.to_string(),
        source,
    })?;
    let task = match stage {
        // GPU nodes made it a holder at prestart: release whatever it holds.
        Stage::Poststop if foreign::has_char_devices(&spec) => Task::Release,
        Stage::Poststop => return Ok(None),
        _ if foreign::has_char_devices(&spec) || foreign::void(&mut spec.clone()) => {
            Task::Unrequested { spec }
        }
        _ => return Ok(None),
    };
    Ok(Some(Container {
        id,
        pid: *state.pid(),
        bundle: state.bundle().to_path_buf(),
        task,
    }))
}

/// Where the prestart hook finds a request: the state's annotations, and the env of the
/// bundle's config.json, parsed only when the annotations ask for nothing (and then kept,
/// since allocating needs the spec too). Annotations come first, so a bad request is
/// reported as such whatever the state of the bundle.
struct BundleSources<'a> {
    annotations: &'a HashMap<String, String>,
    bytes: &'a [u8],
    path: &'a Path,
    id: &'a HolderId,
    spec: Option<Value>,
}

impl BundleSources<'_> {
    fn parse(&self) -> Result<Value, HookError> {
        spec::parse(self.bytes, self.path).map_err(|source| HookError::Bundle {
            id: self.id.to_string(),
            source,
        })
    }

    fn into_spec(self) -> Result<Value, HookError> {
        match self.spec {
            Some(spec) => Ok(spec),
            None => self.parse(),
        }
    }
}

impl request::Sources for BundleSources<'_> {
    type Error = HookError;
    fn annotations(&self) -> &HashMap<String, String> {
        self.annotations
    }
    fn env(&mut self) -> Result<Vec<String>, HookError> {
        let spec = self.parse()?;
        let env = spec::process_env(&spec);
        self.spec = Some(spec);
        Ok(env)
    }
}

/// The bind task of a spec gpupin edited before create: `gpupin.assigned` and the
/// `gpupin.claim` token, both or neither; one without the other was not written by gpupin.
fn bind_task(annotations: &HashMap<String, String>) -> Result<Option<Task>, HookError> {
    let assigned = annotations.get(request::ASSIGNED_ANNOTATION);
    let claim = annotations.get(request::CLAIM_ANNOTATION);
    match (assigned, claim) {
        (None, None) => Ok(None),
        (Some(assigned), Some(claim)) => Ok(Some(Task::Bind {
            uuids: assigned.split(',').map(str::to_string).collect(),
            token: ClaimToken::parse(claim)?,
        })),
        (Some(_), None) => Err(EditsError::ReservedAnnotation(request::ASSIGNED_ANNOTATION).into()),
        (None, Some(_)) => Err(EditsError::ReservedAnnotation(request::CLAIM_ANNOTATION).into()),
    }
}

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::Unrequested;

    /// A bundle dir with a config.json whose env is `env`.
    fn bundle(env: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "env": env},
            "root": {"path": "rootfs"},
        });
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        dir
    }

    fn state(id: &str, bundle: &Path, annotations: &[(&str, &str)]) -> Vec<u8> {
        let annotations: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        serde_json::json!({
            "ociVersion": "1.0.2", "id": id, "status": "created", "pid": 1,
            "bundle": bundle, "annotations": annotations,
        })
        .to_string()
        .into_bytes()
    }

    fn never_loaded() -> Result<Config, ConfigError> {
        panic!("the config must not be loaded for this container")
    }

    fn err(stage: Stage, state: &[u8]) -> String {
        run(stage, state, Path::new("/usr/bin/gpupin"), never_loaded)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn container_without_request_costs_nothing() {
        let b = bundle(&["PATH=/bin"]);
        let s = state("plain", b.path(), &[("org.example", "1")]);
        for stage in [Stage::Prestart, Stage::Poststop] {
            assert!(matches!(
                run(stage, &s, Path::new("/usr/bin/gpupin"), never_loaded).unwrap(),
                Outcome::NoRequest
            ));
        }
    }

    #[test]
    fn nvidia_visible_devices_without_a_request_is_voided_in_the_bundle_for_nvidias_hook() {
        let env = [
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_VISIBLE_DEVICES=0",
        ];
        for (unrequested, expected) in [
            (
                Unrequested::Strip,
                vec!["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"],
            ),
            (Unrequested::Pass, env.to_vec()),
        ] {
            let b = bundle(&env);
            let s = state("cuda", b.path(), &[]);
            let config = || {
                Ok(Config {
                    unrequested,
                    ..Config::default()
                })
            };
            let outcome = run(Stage::Prestart, &s, Path::new("/usr/bin/gpupin"), config);
            assert!(matches!(outcome.unwrap(), Outcome::NoRequest));
            let spec = spec::read(&b.path().join("config.json")).unwrap();
            assert_eq!(spec::process_env(&spec), expected, "{unrequested:?}");
        }
        // Already void, or at poststop: the config is not even read.
        let b = bundle(&["NVIDIA_VISIBLE_DEVICES=void"]);
        let s = state("cuda", b.path(), &[]);
        let exe = Path::new("/usr/bin/gpupin");
        assert!(matches!(
            run(Stage::Prestart, &s, exe, never_loaded).unwrap(),
            Outcome::NoRequest
        ));
        let b = bundle(&["NVIDIA_VISIBLE_DEVICES=all"]);
        let s = state("cuda", b.path(), &[]);
        assert!(matches!(
            run(Stage::Poststop, &s, exe, never_loaded).unwrap(),
            Outcome::NoRequest
        ));
    }

    #[test]
    fn malformed_state_is_a_clear_error() {
        let e = err(Stage::Prestart, b"{\"id\": 3");
        assert!(e.starts_with("invalid OCI state on stdin"), "{e}");
    }

    #[test]
    fn hostile_id_is_refused_before_anything_is_read() {
        let b = bundle(&["GPUPIN_COUNT=1"]);
        let e = err(Stage::Prestart, &state("../../etc", b.path(), &[]));
        assert!(
            e.contains("\"../../etc\"") && e.contains("container id"),
            "{e}"
        );
    }

    #[test]
    fn missing_bundle_names_the_path() {
        let s = state(
            "c1",
            Path::new("/nonexistent/bundle"),
            &[("gpupin.count", "1")],
        );
        let e = run(
            Stage::Prestart,
            &s,
            Path::new("/usr/bin/gpupin"),
            never_loaded,
        )
        .unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("/nonexistent/bundle/config.json"), "{chain}");
    }

    #[test]
    fn bad_requests_fail_before_the_ledger_is_touched() {
        let b = bundle(&[]);
        for (value, expected) in [
            ("0", "positive integer"),
            ("-1", "positive integer"),
            ("two", "positive integer"),
        ] {
            let e = err(
                Stage::Prestart,
                &state("c1", b.path(), &[("gpupin.count", value)]),
            );
            assert!(
                e.contains(&format!("gpupin.count={value:?}")) && e.contains(expected),
                "{e}"
            );
        }
        let s = state(
            "c1",
            b.path(),
            &[("gpupin.count", "1"), ("gpupin.policy", "best")],
        );
        assert!(
            err(Stage::Prestart, &s)
                .contains("expected one of topology, pack, spread, least-loaded, most-free")
        );
    }

    #[test]
    fn env_request_is_read_from_the_bundle() {
        let b = bundle(&["GPUPIN_COUNT=two"]);
        let e = err(Stage::Prestart, &state("c1", b.path(), &[]));
        assert!(e.contains("GPUPIN_COUNT=\"two\""), "{e}");
    }

    #[test]
    fn unknown_stage_lists_the_known_ones() {
        let e = "poststart".parse::<Stage>().unwrap_err().to_string();
        assert!(
            e.contains("poststart") && e.contains("createRuntime"),
            "{e}"
        );
    }

    #[test]
    fn gpupin_annotations_without_a_token_gpupin_made_are_refused() {
        let b = bundle(&[]);
        let uuid = ("gpupin.assigned", "GPU-victim");
        for (annotations, expected) in [
            (
                vec![uuid],
                "annotation gpupin.assigned is written by gpupin",
            ),
            (
                vec![("gpupin.claim", "victim")],
                "annotation gpupin.claim is written by gpupin",
            ),
            (
                vec![uuid, ("gpupin.claim", "victim")],
                "invalid gpupin.claim",
            ),
            (
                vec![uuid, ("gpupin.claim", "victim:\nsecret")],
                "invalid gpupin.claim",
            ),
        ] {
            let e = err(Stage::Prestart, &state("thief", b.path(), &annotations));
            assert!(e.starts_with(expected), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_states_annotations_name_the_engine_at_prestart() {
        let b = bundle(&[]);
        let podman = state("p", b.path(), &[("io.container.manager", "libpod")]);
        let podman: State = serde_json::from_slice(&podman).unwrap();
        assert_eq!(info_of(&podman), Some(engine::engine_only("podman")));
        let runc: State = serde_json::from_slice(&state("r", b.path(), &[])).unwrap();
        assert_eq!(info_of(&runc), None);
    }
}
