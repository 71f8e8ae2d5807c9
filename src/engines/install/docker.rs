//! The `gpupin` entry in Docker's daemon.json, merged and removed as `serde_json::Value`
//! so that every key gpupin does not own survives in its place (serde_json keeps the
//! order with `preserve_order`).
//!
//! dockerd reads `runtimes.<name>.path` and `runtimeArgs`, and `default-runtime`
//! (docs.docker.com, "Alternative container runtimes"); both are reloaded on SIGHUP.

use crate::engines::runtime::argv::{CONFIG_FLAG, RUNTIME_FLAG};
use serde_json::{Map, Value, json};
use std::path::PathBuf;

/// The runtime name users give to `docker run --runtime` and compose `runtime:`.
pub const RUNTIME_NAME: &str = "gpupin";
const RUNTIMES: &str = "runtimes";
const DEFAULT_RUNTIME: &str = "default-runtime";

#[derive(Debug, thiserror::Error)]
pub enum DaemonJsonError {
    #[error("parsing daemon.json")]
    Parse(#[source] serde_json::Error),
    #[error("daemon.json is not a JSON object")]
    NotObject,
    #[error("daemon.json key {0:?} is not a JSON object")]
    KeyNotObject(&'static str),
}

/// What the `gpupin` runtime entry says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEntry {
    /// Absolute path of gpupin-runtime.
    pub path: PathBuf,
    /// gpupin config handed over as `--gpupin-config`; `None`: gpupin-runtime's own
    /// discovery ($GPUPIN_CONFIG, /etc/gpupin/config.toml).
    pub config: Option<PathBuf>,
    /// The real runtime handed over as `--gpupin-runtime` (NVIDIA's, found in
    /// daemon.json); `None`: the config's `runtime`.
    pub hand_over: Option<PathBuf>,
}

impl RuntimeEntry {
    pub fn to_json(&self) -> Value {
        let mut entry = json!({ "path": self.path });
        let mut args = Vec::new();
        if let Some(config) = &self.config {
            args.extend([json!(CONFIG_FLAG), json!(config)]);
        }
        if let Some(runtime) = &self.hand_over {
            args.extend([json!(RUNTIME_FLAG), json!(runtime)]);
        }
        if !args.is_empty() {
            entry["runtimeArgs"] = Value::Array(args);
        }
        entry
    }
}

/// NVIDIA's runtime as the toolkit registers it in daemon.json (`nvidia-ctk runtime
/// configure`: `"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}`, and
/// `"default-runtime": "nvidia"` with `--set-as-default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaRuntime {
    /// Its name in `runtimes`.
    pub name: String,
    /// Its `path`: absolute, or a name dockerd finds on PATH.
    pub path: PathBuf,
    pub is_default: bool,
}

/// The runtime of `doc` that is NVIDIA's container runtime (its path's file name starts
/// with `nvidia-container-runtime`, which covers the `.cdi` and `.legacy` variants), the
/// default runtime first; never gpupin's own entry.
pub fn nvidia_runtime(doc: &Value) -> Option<NvidiaRuntime> {
    let runtimes = doc.get(RUNTIMES)?.as_object()?;
    let default = default_runtime(doc);
    let mut found: Vec<NvidiaRuntime> = runtimes
        .iter()
        .filter(|(name, _)| name.as_str() != RUNTIME_NAME)
        .filter_map(|(name, entry)| {
            let path = PathBuf::from(entry.get("path")?.as_str()?);
            let file = path.file_name()?.to_str()?;
            file.starts_with("nvidia-container-runtime")
                .then(|| NvidiaRuntime {
                    name: name.clone(),
                    is_default: default == Some(name.as_str()),
                    path: path.clone(),
                })
        })
        .collect();
    found.sort_by_key(|r| !r.is_default);
    found.into_iter().next()
}

/// Parses daemon.json text; an empty file is an empty object, as dockerd treats it.
pub fn parse(text: &str) -> Result<Value, DaemonJsonError> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let doc: Value = serde_json::from_str(text).map_err(DaemonJsonError::Parse)?;
    if !doc.is_object() {
        return Err(DaemonJsonError::NotObject);
    }
    Ok(doc)
}

/// daemon.json as written: indented, one trailing newline.
pub fn render(doc: &Value) -> String {
    let mut text = serde_json::to_string_pretty(doc).expect("a Value always serializes");
    text.push('\n');
    text
}

/// `doc` with the `gpupin` runtime set to `entry` and, with `make_default`, gpupin as
/// the default runtime. Other keys, other runtimes and keys inside an existing gpupin
/// entry that gpupin does not write are kept.
pub fn with_gpupin(
    doc: &Value,
    entry: &RuntimeEntry,
    make_default: bool,
) -> Result<Value, DaemonJsonError> {
    let mut doc = doc.clone();
    let top = doc.as_object_mut().ok_or(DaemonJsonError::NotObject)?;
    let runtimes = object_entry(top, RUNTIMES)?;
    merge_entry(runtimes, entry);
    if make_default {
        top.insert(DEFAULT_RUNTIME.into(), json!(RUNTIME_NAME));
    }
    Ok(doc)
}

/// `doc` without the `gpupin` runtime, and without `default-runtime` where that named
/// gpupin (dockerd refuses a default runtime it does not know). A `runtimes` object
/// left empty is dropped: it was most likely added for gpupin.
pub fn without_gpupin(doc: &Value) -> Result<Value, DaemonJsonError> {
    let mut doc = doc.clone();
    let top = doc.as_object_mut().ok_or(DaemonJsonError::NotObject)?;
    if top.get(DEFAULT_RUNTIME) == Some(&json!(RUNTIME_NAME)) {
        top.shift_remove(DEFAULT_RUNTIME);
    }
    if let Some(runtimes) = top.get_mut(RUNTIMES) {
        let runtimes = runtimes
            .as_object_mut()
            .ok_or(DaemonJsonError::KeyNotObject(RUNTIMES))?;
        runtimes.shift_remove(RUNTIME_NAME);
        if runtimes.is_empty() {
            top.shift_remove(RUNTIMES);
        }
    }
    Ok(doc)
}

/// The default runtime `doc` names, if any (to tell the user what `--default` replaced).
pub fn default_runtime(doc: &Value) -> Option<&str> {
    doc.get(DEFAULT_RUNTIME).and_then(Value::as_str)
}

/// `top[key]` as an object, created empty when missing.
fn object_entry<'a>(
    top: &'a mut Map<String, Value>,
    key: &'static str,
) -> Result<&'a mut Map<String, Value>, DaemonJsonError> {
    top.entry(key)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or(DaemonJsonError::KeyNotObject(key))
}

/// Writes gpupin's keys into `runtimes.gpupin`, keeping any others found there.
fn merge_entry(runtimes: &mut Map<String, Value>, entry: &RuntimeEntry) {
    let new = entry.to_json();
    let slot = runtimes
        .entry(RUNTIME_NAME)
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(existing) = slot.as_object_mut() else {
        // Not an object: dockerd could not have used it either; replace it whole.
        *slot = new;
        return;
    };
    if new.get("runtimeArgs").is_none() {
        existing.shift_remove("runtimeArgs");
    }
    for (key, value) in new.as_object().expect("to_json builds an object") {
        existing.insert(key.clone(), value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(config: Option<&str>) -> RuntimeEntry {
        RuntimeEntry {
            path: "/usr/bin/gpupin-runtime".into(),
            config: config.map(PathBuf::from),
            hand_over: None,
        }
    }

    /// What `nvidia-ctk runtime configure --runtime=docker [--set-as-default]` writes.
    fn with_nvidia(default: bool) -> Value {
        let mut doc = json!({"runtimes": {
            "runc-debug": {"path": "/usr/local/bin/runc"},
            "nvidia": {"args": [], "path": "nvidia-container-runtime"},
        }});
        if default {
            doc["default-runtime"] = json!("nvidia");
        }
        doc
    }

    #[test]
    fn finds_nvidias_runtime_default_first() {
        assert_eq!(
            nvidia_runtime(&with_nvidia(false)),
            Some(NvidiaRuntime {
                name: "nvidia".into(),
                path: "nvidia-container-runtime".into(),
                is_default: false,
            })
        );
        let mut doc = with_nvidia(true);
        doc["runtimes"]["nvidia-cdi"] = json!({"path": "/usr/bin/nvidia-container-runtime.cdi"});
        let found = nvidia_runtime(&doc).unwrap();
        assert_eq!((found.name.as_str(), found.is_default), ("nvidia", true));
        doc["default-runtime"] = json!("nvidia-cdi");
        assert_eq!(nvidia_runtime(&doc).unwrap().name, "nvidia-cdi");
        assert_eq!(
            nvidia_runtime(&json!({"runtimes": {"runc": {"path": "runc"}}})),
            None
        );
        assert_eq!(nvidia_runtime(&json!({})), None);
    }

    #[test]
    fn hand_over_becomes_runtime_args_after_the_config() {
        let handing = RuntimeEntry {
            hand_over: Some("nvidia-container-runtime".into()),
            ..entry(Some("/etc/g.toml"))
        };
        let after = with_gpupin(&with_nvidia(true), &handing, false).unwrap();
        assert_eq!(
            after["runtimes"]["gpupin"]["runtimeArgs"],
            json!([
                "--gpupin-config",
                "/etc/g.toml",
                "--gpupin-runtime",
                "nvidia-container-runtime"
            ])
        );
        // NVIDIA's entry and its default stay.
        assert_eq!(
            after["runtimes"]["nvidia"],
            with_nvidia(true)["runtimes"]["nvidia"]
        );
        assert_eq!(after["default-runtime"], "nvidia");
        // Installed again without it: the arguments go.
        let again = with_gpupin(&after, &entry(None), false).unwrap();
        assert!(again["runtimes"]["gpupin"].get("runtimeArgs").is_none());
    }

    fn doc(text: &str) -> Value {
        parse(text).unwrap()
    }

    #[test]
    fn install_keeps_other_keys_in_their_order() {
        let before =
            doc(r#"{"log-level":"warn","runtimes":{"runsc":{"path":"/bin/runsc"}},"debug":true}"#);
        let after = with_gpupin(&before, &entry(None), false).unwrap();
        let keys: Vec<_> = after.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["log-level", "runtimes", "debug"]);
        assert_eq!(after["runtimes"]["runsc"], json!({"path": "/bin/runsc"}));
        assert_eq!(
            after["runtimes"]["gpupin"],
            json!({"path": "/usr/bin/gpupin-runtime"})
        );
        assert!(after.get("default-runtime").is_none());
    }

    #[test]
    fn install_into_empty_file_creates_runtimes() {
        let after = with_gpupin(&doc(""), &entry(None), false).unwrap();
        assert_eq!(
            after,
            json!({"runtimes": {"gpupin": {"path": "/usr/bin/gpupin-runtime"}}})
        );
    }

    #[test]
    fn config_becomes_runtime_args() {
        let after = with_gpupin(&doc("{}"), &entry(Some("/etc/g.toml")), false).unwrap();
        assert_eq!(
            after["runtimes"]["gpupin"]["runtimeArgs"],
            json!(["--gpupin-config", "/etc/g.toml"])
        );
    }

    #[test]
    fn install_without_config_drops_old_runtime_args() {
        let before = with_gpupin(&doc("{}"), &entry(Some("/etc/g.toml")), false).unwrap();
        let after = with_gpupin(&before, &entry(None), false).unwrap();
        assert!(after["runtimes"]["gpupin"].get("runtimeArgs").is_none());
    }

    #[test]
    fn install_twice_changes_nothing() {
        let once = with_gpupin(&doc(r#"{"a":1}"#), &entry(Some("/c")), true).unwrap();
        let twice = with_gpupin(&once, &entry(Some("/c")), true).unwrap();
        assert_eq!(render(&once), render(&twice));
    }

    #[test]
    fn default_flag_sets_default_runtime() {
        let before = doc(r#"{"default-runtime":"runc"}"#);
        assert_eq!(default_runtime(&before), Some("runc"));
        let after = with_gpupin(&before, &entry(None), true).unwrap();
        assert_eq!(default_runtime(&after), Some("gpupin"));
    }

    #[test]
    fn unknown_keys_of_an_existing_entry_are_kept() {
        let before = doc(r#"{"runtimes":{"gpupin":{"path":"/old","note":"x"}}}"#);
        let after = with_gpupin(&before, &entry(None), false).unwrap();
        assert_eq!(
            after["runtimes"]["gpupin"],
            json!({"path": "/usr/bin/gpupin-runtime", "note": "x"})
        );
    }

    #[test]
    fn uninstall_restores_other_settings() {
        let before = doc(r#"{"log-level":"warn","runtimes":{"runsc":{"path":"/bin/runsc"}}}"#);
        let installed = with_gpupin(&before, &entry(Some("/c")), true).unwrap();
        assert_eq!(without_gpupin(&installed).unwrap(), before);
    }

    #[test]
    fn uninstall_drops_runtimes_left_empty() {
        let installed = with_gpupin(&doc(r#"{"debug":true}"#), &entry(None), false).unwrap();
        assert_eq!(without_gpupin(&installed).unwrap(), json!({"debug": true}));
    }

    #[test]
    fn uninstall_keeps_a_default_runtime_that_is_not_gpupin() {
        let before = doc(r#"{"default-runtime":"runsc","runtimes":{"gpupin":{"path":"/p"}}}"#);
        let after = without_gpupin(&before).unwrap();
        assert_eq!(after, json!({"default-runtime": "runsc"}));
    }

    #[test]
    fn uninstall_of_a_file_without_gpupin_changes_nothing() {
        let before = doc(r#"{"runtimes":{"runsc":{"path":"/bin/runsc"}}}"#);
        assert_eq!(without_gpupin(&before).unwrap(), before);
    }

    #[test]
    fn non_object_documents_are_refused() {
        assert!(matches!(parse("[]"), Err(DaemonJsonError::NotObject)));
        assert!(matches!(parse("{"), Err(DaemonJsonError::Parse(_))));
        let bad = doc(r#"{"runtimes":[]}"#);
        assert!(matches!(
            with_gpupin(&bad, &entry(None), false),
            Err(DaemonJsonError::KeyNotObject("runtimes"))
        ));
    }
}
