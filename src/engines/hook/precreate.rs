//! Podman's precreate stage: the proposed spec arrives on stdin and leaves, edited, on
//! stdout, so the runtime itself creates the nodes and grants the cgroup rules. There is
//! no container id yet: the GPUs are held under a fresh claim, whose token (id and
//! secret) is written into the spec, and the prestart hook binds the claim to the
//! container (or gc reaps it after `claim_grace` when the container never got that far).

use super::{HookError, Outcome, contains};
use crate::admission::before_create::{self, BeforeCreate, LoadOnce, NoEngine, SpecSources};
use crate::admission::edits::{self, HookCommand};
use crate::admission::spec;
use crate::engines::{engine, podman};
use crate::input::config::{Config, ConfigError};
use crate::input::request::{self, ERROR_ANNOTATION};
use crate::model::nvidia;
use crate::state::ledger::{ClaimToken, HolderMeta};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub(super) fn run(
    input: &[u8],
    exe: &Path,
    load_config: impl FnOnce() -> Result<Config, ConfigError>,
) -> Result<Outcome, HookError> {
    let unchanged = || Outcome::Spec {
        bytes: input.to_vec(),
        claim: None,
    };
    // Every container passes through here when the hook matches always: a spec that
    // mentions neither prefix, nothing of NVIDIA's and no device numbers goes back as it
    // came, unparsed.
    let markers = [
        request::ANNOTATION_PREFIX,
        request::ENV_PREFIX,
        "nvidia",
        "NVIDIA",
        nvidia::CUDA_VERSION,
        "\"major\"",
    ];
    if !markers.iter().any(|m| contains(input, m.as_bytes())) {
        return Ok(unchanged());
    }
    let mut spec_value = spec::parse(input, Path::new("<stdin>")).map_err(HookError::Spec)?;
    let original = spec_value.clone();
    match claim(&mut spec_value, exe, load_config) {
        Ok(Some(outcome)) => Ok(outcome),
        Ok(None) => Ok(unchanged()),
        Err(err) => defer_error(original, &err, exe),
    }
}

/// Allocates for the container's request and edits the spec. `None`: no request.
fn claim(
    spec_value: &mut Value,
    exe: &Path,
    load_config: impl FnOnce() -> Result<Config, ConfigError>,
) -> Result<Option<Outcome>, HookError> {
    let mut sources = SpecSources::new(spec_value, LoadOnce::new(load_config), NoEngine);
    // Refused even without a request: the spec goes on to the prestart hook, which
    // would take them for gpupin's own.
    edits::refuse_reserved(&sources.annotations)?;
    let found = request::find(&mut sources)?;
    let SpecSources {
        annotations,
        config,
        ..
    } = sources;
    let Some(request) = found else {
        return void(spec_value, config);
    };
    // Podman marks its specs; the container's name and image are not in them, but in
    // containers/storage, found from the spec's root.
    let container = match engine::from_annotations(&annotations) {
        Some(info) if info.engine.as_deref() == Some(engine::PODMAN) => {
            match spec_value.pointer("/root/path").and_then(Value::as_str) {
                Some(root) if root.starts_with('/') => Some(podman::container_at(Path::new(root))),
                _ => Some(info),
            }
        }
        other => other,
    };
    let config = config.into_config()?;
    let token = ClaimToken::new_claim()?;
    // No container id yet: the claim's holder id stands for it until prestart binds it.
    tracing::debug!(stage = "precreate", claim = %token.holder(), "hook");
    let hook = HookCommand {
        exe: exe.to_path_buf(),
        config: config.path.clone(),
    };
    let step = BeforeCreate {
        config: &config,
        request: &request,
        annotations: &annotations,
        token: &token,
        hook: &hook,
        meta: HolderMeta {
            source: "precreate".into(),
            container,
            ..HolderMeta::default()
        },
        // Podman's labels never reach the spec: its annotations are all there is.
        labels: Default::default(),
    };
    let (record, bytes) = before_create::edit_spec(step, spec_value, to_bytes)?;
    Ok(Some(Outcome::Spec {
        bytes,
        claim: Some(record),
    }))
}

/// `unrequested = "strip"` for a container that asks gpupin for nothing: what it asked
/// NVIDIA's stack for is voided. `None`: the spec goes on as it came. The config is read
/// only for a spec that asks NVIDIA's stack for something.
fn void(
    spec_value: &mut Value,
    config: LoadOnce<impl FnOnce() -> Result<Config, ConfigError>>,
) -> Result<Option<Outcome>, HookError> {
    let unrequested = || config.into_config().map(|c| c.unrequested);
    if !before_create::strip_unrequested(spec_value, unrequested)? {
        return Ok(None);
    }
    tracing::info!(
        stage = "precreate",
        "no request: NVIDIA's request set to void"
    );
    Ok(Some(Outcome::Spec {
        bytes: to_bytes(spec_value).map_err(HookError::Spec)?,
        claim: None,
    }))
}

/// Podman (containers/common, RuntimeConfigFilter) discards a precreate hook's stderr
/// and reports only "exit status 1", so a failed precreate would hide why. Instead the
/// spec goes on unedited, nothing held, with gpupin as its one prestart hook, told the
/// reason in its arguments (`--refuse`): that hook fails with it, and runc puts a failed
/// hook's stderr into the error podman prints. The reason travels in the hook's
/// arguments, which a container's author cannot write, rather than in an annotation,
/// which they can; `gpupin.error` is left beside it for `podman inspect`.
fn defer_error(mut spec_value: Value, err: &HookError, exe: &Path) -> Result<Outcome, HookError> {
    let reason = crate::base::message::one_line(err);
    tracing::warn!(
        stage = "precreate",
        error = %reason,
        "refused; the spec goes on unedited with a prestart hook that fails with this reason"
    );
    spec::set_annotation(&mut spec_value, ERROR_ANNOTATION, &reason).map_err(HookError::Spec)?;
    // hooks.d put gpupin's own prestart hook in already (podman adds them before
    // precreate): it would report the annotation instead of the reason.
    // Files written by an older gpupin run `gpupin hook STAGE`: those go too.
    let cli = crate::base::binaries::beside(exe, crate::base::binaries::CLI);
    let exe = exe.display().to_string();
    for stage in ["prestart", "createRuntime"] {
        spec::remove_hooks(&mut spec_value, stage, &exe);
        spec::remove_hooks(&mut spec_value, stage, &cli.display().to_string());
    }
    let hook = HookCommand {
        exe: PathBuf::from(&exe),
        config: None,
    };
    spec::add_hook(
        &mut spec_value,
        "prestart",
        &exe,
        &hook.refusal_args(&reason),
    )
    .map_err(HookError::Spec)?;
    Ok(Outcome::Spec {
        bytes: to_bytes(&spec_value).map_err(HookError::Spec)?,
        claim: None,
    })
}

fn to_bytes(spec_value: &Value) -> Result<Vec<u8>, spec::SpecError> {
    serde_json::to_vec(spec_value).map_err(|e| spec::SpecError::Serialize {
        path: "<stdout>".into(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::foreign::testing::{cdi_linux, gpu_minors};
    use crate::engines::hook::{self, Stage};
    use serde_json::json;

    fn config(state_dir: &Path) -> Config {
        Config {
            state_dir: state_dir.to_path_buf(),
            inventory: "sim:nvswitch8".parse().unwrap(),
            // Not /var/log: a user who cannot write it would get only warnings there.
            audit_log: state_dir.join("audit.log"),
            ..Config::default()
        }
    }

    fn precreate(spec: &Value, state_dir: &Path) -> Value {
        let input = serde_json::to_vec(spec).unwrap();
        let exe = Path::new("/usr/bin/gpupin-hook");
        match run(&input, exe, || Ok(config(state_dir))).unwrap() {
            Outcome::Spec { bytes, claim: None } => serde_json::from_slice(&bytes).unwrap(),
            other => panic!("expected a spec without claim, got {other:?}"),
        }
    }

    fn spec_with(annotations: Value) -> Value {
        json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sh"], "env": ["PATH=/bin"]},
            "root": {"path": "rootfs"},
            "annotations": annotations,
        })
    }

    #[test]
    fn failed_allocation_travels_to_prestart_in_its_arguments_and_holds_nothing() {
        let state = tempfile::tempdir().unwrap();
        let mut spec = spec_with(json!({"gpupin.count": "9"}));
        // What hooks.d put in before precreate ran, and another program's hook.
        spec["hooks"] = json!({"prestart": [
            {"path": "/usr/bin/gpupin-hook", "args": ["gpupin-hook", "prestart"]},
            {"path": "/usr/bin/other"},
            // Put there by an older gpupin's hooks.d file.
            {"path": "/usr/bin/gpupin", "args": ["gpupin", "hook", "prestart"]},
        ]});
        let edited = precreate(&spec, state.path());
        let reason = edited["annotations"][ERROR_ANNOTATION].as_str().unwrap();
        assert!(
            reason.contains("count 9 is more than the 8 GPUs"),
            "{reason}"
        );
        assert_eq!(
            edited["hooks"]["prestart"],
            json!([
                {"path": "/usr/bin/other"},
                {"path": "/usr/bin/gpupin-hook",
                 "args": ["gpupin-hook", "prestart", "--refuse", reason]},
            ])
        );
        assert!(edited.pointer("/linux/devices").is_none());
        assert!(
            crate::state::ledger::Ledger::open(&crate::input::config::LedgerSettings::at(
                state.path()
            ))
            .unwrap()
            .records()
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn gpupin_error_written_by_anyone_but_precreate_is_refused_not_repeated() {
        let bundle = tempfile::tempdir().unwrap();
        let spec = spec_with(json!({}));
        std::fs::write(bundle.path().join("config.json"), spec.to_string()).unwrap();
        let forged = "gpupin: all GPUs are yours\nsecond line";
        let state_json = json!({
            "ociVersion": "1.0.2", "id": "c1", "status": "created", "pid": 1,
            "bundle": bundle.path(), "annotations": {ERROR_ANNOTATION: forged},
        });
        let err = hook::run(
            Stage::Prestart,
            state_json.to_string().as_bytes(),
            Path::new("/usr/bin/gpupin"),
            || panic!("the prestart hook fails before reading a config"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("gpupin.error is written by gpupin"), "{err}");
        assert!(!err.contains("yours"), "{err}");
    }

    #[test]
    fn user_set_gpupin_annotation_is_reported_not_obeyed() {
        let state = tempfile::tempdir().unwrap();
        let spec =
            spec_with(json!({"gpupin.count": "1", "gpupin.claim": "claim-0123456789abcdef"}));
        let edited = precreate(&spec, state.path());
        let reason = edited["annotations"][ERROR_ANNOTATION].as_str().unwrap();
        assert!(
            reason.contains("gpupin.claim is written by gpupin"),
            "{reason}"
        );
        assert!(!state.path().join("holders").exists());
    }

    /// Precreate's output and the record of what it allocated, if anything.
    fn precreate_any(
        spec: &Value,
        state_dir: &Path,
    ) -> (Value, Option<crate::state::ledger::Record>) {
        let input = serde_json::to_vec(spec).unwrap();
        let exe = Path::new("/usr/bin/gpupin-hook");
        match run(&input, exe, || Ok(config(state_dir))).unwrap() {
            Outcome::Spec { bytes, claim } => (serde_json::from_slice(&bytes).unwrap(), claim),
            other => panic!("expected a spec, got {other:?}"),
        }
    }

    /// What podman's CDI gives `--device nvidia.com/gpu=...` for GPUs `minors`: their
    /// nodes and allow rules beside nvidiactl's, and `NVIDIA_VISIBLE_DEVICES=void`.
    fn with_cdi_gpus(mut spec: Value, minors: &[u32]) -> Value {
        spec["linux"] = cdi_linux(minors);
        spec["process"]["env"] = json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]);
        spec
    }

    #[test]
    fn cdi_gpus_without_a_request_become_a_count_that_gpupin_picks() {
        let state = tempfile::tempdir().unwrap();
        // Someone holds GPU 0, which the CDI request named.
        let (_, first) = precreate_any(&spec_with(json!({"gpupin.devices": "0"})), state.path());
        assert!(first.is_some());
        let spec = with_cdi_gpus(spec_with(json!({})), &[0, 1]);
        let (edited, claim) = precreate_any(&spec, state.path());
        let record = claim.expect("a claim for the CDI GPUs");
        assert_eq!(record.gpus.len(), 2);
        assert_eq!(record.request.origin, crate::input::request::Origin::Nvidia);
        let minors = gpu_minors(&edited);
        assert_eq!(minors.len(), 2, "{edited:#}");
        assert!(!minors.contains(&0), "GPU 0 is someone else's: {minors:?}");
        let env = spec::process_env(&edited);
        let visible: Vec<&String> = env
            .iter()
            .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
            .collect();
        assert_eq!(
            visible,
            [&format!("NVIDIA_VISIBLE_DEVICES={}", record.gpus.join(","))]
        );
    }

    #[test]
    fn a_gpupin_request_keeps_only_its_own_gpu_of_a_cdi_all() {
        let state = tempfile::tempdir().unwrap();
        let mut spec = with_cdi_gpus(
            spec_with(json!({"gpupin.count": "1"})),
            &[0, 1, 2, 3, 4, 5, 6, 7],
        );
        spec["annotations"]["cdi.k8s.io/gpus"] = json!("nvidia.com/gpu=all");
        let (edited, claim) = precreate_any(&spec, state.path());
        let record = claim.unwrap();
        assert_eq!(record.gpus.len(), 1);
        assert_eq!(gpu_minors(&edited).len(), 1, "{edited:#}");
        assert!(edited["annotations"].get("cdi.k8s.io/gpus").is_none());
        let nodes = edited["linux"]["devices"].as_array().unwrap();
        assert!(nodes.iter().any(|n| n["path"] == "/dev/nvidiactl"));
    }

    #[test]
    fn a_wildcard_rule_beside_a_request_is_refused_and_holds_nothing() {
        let state = tempfile::tempdir().unwrap();
        let mut spec = spec_with(json!({"gpupin.count": "1"}));
        spec["linux"] = json!({"resources": {"devices": [{"allow": true, "access": "rwm"}]}});
        let edited = precreate(&spec, state.path());
        let reason = edited["annotations"][ERROR_ANNOTATION].as_str().unwrap();
        assert!(
            reason.contains("linux.resources.devices[0] (a *:* rwm) would give the container GPUs"),
            "{reason}"
        );
        let ledger = crate::state::ledger::Ledger::open(&crate::input::config::LedgerSettings::at(
            state.path(),
        ))
        .unwrap();
        assert!(ledger.records().unwrap().is_empty());
    }

    #[test]
    fn nvidia_visible_devices_all_without_a_request_is_voided_by_default() {
        let state = tempfile::tempdir().unwrap();
        let mut spec = spec_with(json!({}));
        spec["process"]["env"] = json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]);
        let (edited, claim) = precreate_any(&spec, state.path());
        assert!(claim.is_none());
        assert_eq!(
            spec::process_env(&edited),
            ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]
        );
        assert!(!state.path().join("holders").exists());
    }

    #[test]
    fn a_spec_without_anything_of_nvidias_goes_back_byte_for_byte() {
        let state = tempfile::tempdir().unwrap();
        let mut spec = spec_with(json!({}));
        spec["linux"] =
            json!({"devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]});
        let input = serde_json::to_vec(&spec).unwrap();
        let exe = Path::new("/usr/bin/gpupin-hook");
        match run(&input, exe, || Ok(config(state.path()))).unwrap() {
            Outcome::Spec { bytes, claim: None } => assert_eq!(bytes, input),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_podman_claim_names_the_engine_and_nothing_podman_did_not_say() {
        let state = tempfile::tempdir().unwrap();
        // Podman 4.3's annotations for `podman run --name web IMAGE`: no name, no image.
        let spec = spec_with(json!({"gpupin.count": "1",
            "io.container.manager": "libpod",
            "io.podman.annotations.autoremove": "FALSE"}));
        let (_, claim) = precreate_any(&spec, state.path());
        let info = claim.unwrap().container.unwrap();
        assert_eq!(info, crate::engines::engine::engine_only("podman"));
    }
}
