//! Podman's precreate stage: the proposed spec arrives on stdin and leaves, edited, on
//! stdout, so the runtime itself creates the nodes and grants the cgroup rules. There is
//! no container id yet: the GPUs are held under a fresh claim id written into the spec,
//! and the prestart hook binds the claim to the container (or gc reaps it after
//! `claim_grace` when the container never got that far).

use super::{HookError, Outcome, contains};
use crate::assign::{self, HookCommand};
use crate::config::{Config, ConfigError};
use crate::grant;
use crate::inventory;
use crate::ledger::{HolderId, HolderMeta, Ledger, Record};
use crate::request::{self, CLAIM_ANNOTATION, ERROR_ANNOTATION, WRITTEN_BY_GPUPIN};
use crate::spec;
use serde_json::Value;
use std::path::Path;

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
    // mentions neither prefix goes back as it came, unparsed.
    if !contains(input, request::ANNOTATION_PREFIX.as_bytes())
        && !contains(input, request::ENV_PREFIX.as_bytes())
    {
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
    let annotations = spec::annotations(spec_value);
    if let Some(key) = WRITTEN_BY_GPUPIN
        .iter()
        .find(|k| annotations.contains_key(**k))
    {
        return Err(HookError::ReservedAnnotation(key));
    }
    let request = match request::from_annotations(&annotations)? {
        Some(r) => r,
        None => match request::from_env(&spec::process_env(spec_value))? {
            Some(r) => r,
            None => return Ok(None),
        },
    };
    let config = load_config()?;
    let claim = HolderId::new(&new_claim_id())?;
    let meta = HolderMeta {
        source: "precreate".into(),
        pid: None,
        bundle: None,
    };
    let (inventory, record) = grant::allocate(&config, &claim, &request, meta)?;
    let hook = HookCommand {
        exe: exe.to_path_buf(),
        config: config.path.clone(),
    };
    match edit(spec_value, &inventory, &record, &hook) {
        Ok(bytes) => Ok(Some(Outcome::Spec {
            bytes,
            claim: Some(record),
        })),
        Err(err) => {
            Ledger::for_config(&config)?.release(&claim)?;
            Err(err)
        }
    }
}

/// Podman (containers/common, RuntimeConfigFilter) discards a precreate hook's stderr
/// and reports only "exit status 1", so a failed precreate would hide why. Instead the
/// spec goes on unedited, nothing held, with the reason in `gpupin.error` and gpupin as
/// a prestart hook: that hook fails with the reason, and runc puts a failed hook's
/// stderr into the error podman prints.
fn defer_error(mut spec_value: Value, err: &HookError, exe: &Path) -> Result<Outcome, HookError> {
    spec::set_annotation(
        &mut spec_value,
        ERROR_ANNOTATION,
        &crate::message::one_line(err),
    )
    .map_err(HookError::Spec)?;
    // No config: the prestart hook fails on the annotation before it would read one.
    let hook = HookCommand {
        exe: exe.to_path_buf(),
        config: None,
    };
    let exe = hook.exe.display().to_string();
    spec::add_hook(&mut spec_value, "prestart", &exe, &hook.args("prestart"))
        .map_err(HookError::Spec)?;
    Ok(Outcome::Spec {
        bytes: to_bytes(&spec_value)?,
        claim: None,
    })
}

fn edit(
    spec_value: &mut Value,
    inventory: &inventory::Inventory,
    record: &Record,
    hook: &HookCommand,
) -> Result<Vec<u8>, HookError> {
    assign::edit_spec(spec_value, inventory, record, hook)?;
    spec::set_annotation(spec_value, CLAIM_ANNOTATION, &record.id).map_err(HookError::Spec)?;
    to_bytes(spec_value)
}

fn to_bytes(spec_value: &Value) -> Result<Vec<u8>, HookError> {
    serde_json::to_vec(spec_value).map_err(|e| {
        HookError::Spec(spec::SpecError::Serialize {
            path: "<stdout>".into(),
            source: e,
        })
    })
}

/// `claim-` and 16 random hex digits: unguessable, so one container cannot bind another's
/// claim by writing its id into its own annotations.
fn new_claim_id() -> String {
    let mut bytes = [0u8; 8];
    // getrandom(2) fails only on pre-3.17 kernels or a bad buffer; the fallback keeps the
    // id unique (pid and time), if not unguessable.
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        bytes = (nanos ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("claim-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hook::{self, Stage};
    use serde_json::json;

    fn config(state_dir: &Path) -> Config {
        Config {
            state_dir: state_dir.to_path_buf(),
            inventory: "sim:nvswitch8".parse().unwrap(),
            ..Config::default()
        }
    }

    fn precreate(spec: &Value, state_dir: &Path) -> Value {
        let input = serde_json::to_vec(spec).unwrap();
        let exe = Path::new("/usr/bin/gpupin");
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
    fn failed_allocation_travels_to_prestart_and_holds_nothing() {
        let state = tempfile::tempdir().unwrap();
        let edited = precreate(&spec_with(json!({"gpupin.count": "9"})), state.path());
        let reason = edited["annotations"][ERROR_ANNOTATION].as_str().unwrap();
        assert!(
            reason.contains("count 9 is more than the 8 GPUs"),
            "{reason}"
        );
        assert_eq!(
            edited["hooks"]["prestart"],
            json!([{"path": "/usr/bin/gpupin", "args": ["gpupin", "hook", "prestart"]}])
        );
        assert!(edited.pointer("/linux/devices").is_none());
        assert!(
            crate::ledger::Ledger::open(state.path())
                .unwrap()
                .records()
                .unwrap()
                .is_empty()
        );

        let bundle = tempfile::tempdir().unwrap();
        std::fs::write(bundle.path().join("config.json"), edited.to_string()).unwrap();
        let state_json = json!({
            "ociVersion": "1.0.2", "id": "c1", "status": "created", "pid": 1,
            "bundle": bundle.path(), "annotations": edited["annotations"],
        });
        let err = hook::run(
            Stage::Prestart,
            state_json.to_string().as_bytes(),
            Path::new("/usr/bin/gpupin"),
            || panic!("the prestart hook fails before reading a config"),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), reason);
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
}
