//! Podman's hooks.d files (oci-hooks(5)): one file per stage, so that podman calls
//! `gpupin hook precreate` with the proposed spec, then prestart and poststop.
//!
//! By default the files match only containers with a `gpupin.` annotation: every other
//! container never starts gpupin at all. The `always` variant runs the hooks for every
//! container, which is what an env request (`GPUPIN_COUNT` in the container's env) needs;
//! a container without a request then costs one small spec scan per stage.

use crate::admission::edits::HookCommand;
use crate::admission::spec::{self, SpecError};
use crate::base::binaries;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Where podman reads hooks configured by the administrator (podman also reads
/// /usr/share/containers/oci/hooks.d, which belongs to packages).
pub const HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";
/// The stages gpupin hooks, in the order podman runs them.
pub(crate) const STAGES: [&str; 3] = ["precreate", "prestart", "poststop"];
/// oci-hooks(5) matches annotation keys and values as regular expressions.
const ANNOTATION_KEY_PATTERN: &str = "^gpupin\\.";

/// Which containers the hooks run for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Only containers with a `gpupin.` annotation.
    Annotation,
    /// Every container, so that env requests are seen too.
    Always,
}

/// One hooks.d file: its name in the directory and its content.
#[derive(Debug, Clone, PartialEq)]
pub struct HookFile {
    pub name: String,
    pub content: Value,
}

/// What happened (or, in a dry run, would happen) to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Written,
    /// Already there with the same content.
    Unchanged,
    Removed,
    /// Uninstall: no such file.
    Absent,
    /// Uninstall: a file of that name that gpupin did not write; left alone.
    Foreign,
    /// Uninstall: gpupin's, but the package's hooks still need it; left alone.
    Kept,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub path: PathBuf,
    pub change: Change,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} exists and was not written by gpupin; move it away or pick another --dir")]
    Foreign { path: PathBuf },
    #[error("creating hooks directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("installing podman hook")]
    Write(#[source] SpecError),
    #[error("writing {path}")]
    WriteFile {
        path: PathBuf,
        #[source]
        source: crate::base::atomic::WriteError,
    },
    /// containers.conf (`containers_conf::ConfError`, as text: that module builds on this).
    #[error("reading {path}: {reason}; podman would not start either: fix that file")]
    Conf { path: PathBuf, reason: String },
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file name of a stage's hook.
pub(crate) fn file_name(stage: &str) -> String {
    format!("gpupin-{stage}.json")
}

/// The three hooks.d files that run `hook` at every stage gpupin needs.
pub fn hook_files(hook: &HookCommand, trigger: Trigger) -> Vec<HookFile> {
    STAGES
        .iter()
        .map(|stage| HookFile {
            name: file_name(stage),
            content: hook_json(hook, stage, trigger),
        })
        .collect()
}

fn hook_json(hook: &HookCommand, stage: &str, trigger: Trigger) -> Value {
    let when = match trigger {
        Trigger::Annotation => json!({"annotations": {ANNOTATION_KEY_PATTERN: ".*"}}),
        Trigger::Always => json!({"always": true}),
    };
    json!({
        "version": "1.0.0",
        "hook": {"path": hook.exe.display().to_string(), "args": hook.args(stage)},
        "when": when,
        "stages": [stage],
    })
}

/// Whether `content` is a hook file gpupin wrote for `stage`: it runs
/// `gpupin-hook [--config FILE] STAGE` (or, written by an older gpupin,
/// `gpupin [--config FILE] hook STAGE`) at that stage only. Whatever else an
/// administrator put in the directory is never overwritten or removed.
pub(crate) fn is_gpupin_hook(content: &Value, stage: &str) -> bool {
    let args: Option<Vec<&str>> = content["hook"]["args"]
        .as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect());
    let Some(args) = args else { return false };
    let runs_stage = match args.first() {
        Some(&binaries::HOOK) => args.len() > 1 && args.ends_with(&[stage]),
        Some(&binaries::CLI) => args.ends_with(&["hook", stage]),
        _ => false,
    };
    runs_stage && content["stages"] == json!([stage])
}

/// Writes `files` into `dir` (created when missing), each atomically; a file already
/// holding the same content is left as it is. Refuses before writing anything when one
/// of the names is taken by a file gpupin did not write. `dry_run`: report only.
pub fn install(dir: &Path, files: &[HookFile], dry_run: bool) -> Result<Vec<Step>, InstallError> {
    let mut plan = Vec::with_capacity(files.len());
    for file in files {
        let path = dir.join(&file.name);
        let change = match read_existing(&path)? {
            Some(Existing::Gpupin(current)) if current == file.content => Change::Unchanged,
            Some(Existing::Gpupin(_)) | None => Change::Written,
            Some(Existing::Foreign) => return Err(InstallError::Foreign { path }),
        };
        plan.push((Step { path, change }, &file.content));
    }
    if !dry_run {
        write_plan(dir, &plan)?;
    }
    Ok(plan.into_iter().map(|(step, _)| step).collect())
}

fn write_plan(dir: &Path, plan: &[(Step, &Value)]) -> Result<(), InstallError> {
    std::fs::create_dir_all(dir).map_err(|source| InstallError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    for (step, content) in plan {
        if step.change == Change::Written {
            spec::write_atomic(&step.path, content).map_err(InstallError::Write)?;
        }
    }
    Ok(())
}

/// Removes gpupin's hook files from `dir`, of either trigger; files of the same name
/// that gpupin did not write stay. `dry_run`: report only.
pub fn uninstall(dir: &Path, dry_run: bool) -> Result<Vec<Step>, InstallError> {
    let mut steps = Vec::with_capacity(STAGES.len());
    for stage in STAGES {
        let path = dir.join(file_name(stage));
        let change = match read_existing(&path)? {
            None => Change::Absent,
            Some(Existing::Foreign) => Change::Foreign,
            Some(Existing::Gpupin(_)) => Change::Removed,
        };
        if change == Change::Removed && !dry_run {
            remove(&path)?;
        }
        steps.push(Step { path, change });
    }
    Ok(steps)
}

/// Programs of NVIDIA's legacy prestart hook (`nvidia-container-runtime-hook`, and the
/// older name `nvidia-container-toolkit`).
const NVIDIA_HOOKS: [&str; 2] = ["nvidia-container-runtime-hook", "nvidia-container-toolkit"];

/// hooks.d files in `dir` that run NVIDIA's legacy hook at prestart and sort before
/// gpupin's prestart file. Runtimes run a stage's hooks in file-name order, so on the
/// prestart path (CRI-O) such a hook runs before gpupin has chosen and finds no
/// NVIDIA_VISIBLE_DEVICES of gpupin's (podman's precreate path is not affected: it edits
/// the spec before any prestart hook). A dir that cannot be read has none to report.
pub fn nvidia_hooks_before_gpupin(dir: &Path) -> Vec<String> {
    let ours = file_name("prestart");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.ends_with(".json") && *name < ours)
        .filter(|name| {
            let Ok(text) = crate::base::safe_open::read(
                &dir.join(name),
                crate::base::safe_open::Links::Follow,
            ) else {
                return false;
            };
            serde_json::from_slice::<Value>(&text).is_ok_and(|v| runs_nvidia_prestart(&v))
        })
        .collect();
    found.sort();
    found
}

fn runs_nvidia_prestart(content: &Value) -> bool {
    let program = |v: &Value| {
        v.as_str()
            .and_then(|p| Path::new(p).file_name())
            .and_then(|n| n.to_str())
            .is_some_and(|n| NVIDIA_HOOKS.contains(&n))
    };
    let at_prestart = content["stages"]
        .as_array()
        .is_some_and(|s| s.iter().any(|s| s == "prestart"));
    at_prestart && (program(&content["hook"]["path"]) || program(&content["hook"]["args"][0]))
}

/// A file found under one of gpupin's names.
enum Existing {
    Gpupin(Value),
    Foreign,
}

fn read_existing(path: &Path) -> Result<Option<Existing>, InstallError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(InstallError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let stage = stage_of(path);
    Ok(Some(match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if stage.is_some_and(|s| is_gpupin_hook(&v, s)) => Existing::Gpupin(v),
        _ => Existing::Foreign,
    }))
}

/// The stage a hook file name stands for (`gpupin-prestart.json` -> `prestart`).
fn stage_of(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    STAGES.into_iter().find(|s| file_name(s) == name)
}

/// Removes one of gpupin's files; one already gone is the wanted end state.
pub(super) fn remove(path: &Path) -> Result<(), InstallError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        // Gone between the read and the removal: the wanted end state.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(InstallError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary named in the example files under hooks/; `install` writes the real one.
    const PLACEHOLDER_EXE: &str = "/usr/local/bin/gpupin-hook";

    fn hook(config: Option<&str>) -> HookCommand {
        HookCommand {
            exe: PathBuf::from("/opt/gpupin/bin/gpupin-hook"),
            config: config.map(PathBuf::from),
        }
    }

    fn content_of(files: &[HookFile], name: &str) -> Value {
        files
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .content
            .clone()
    }

    #[test]
    fn one_file_per_stage_running_that_stage() {
        let files = hook_files(&hook(Some("/etc/gpupin/c.toml")), Trigger::Annotation);
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpupin-precreate.json",
                "gpupin-prestart.json",
                "gpupin-poststop.json"
            ]
        );
        assert_eq!(
            content_of(&files, "gpupin-prestart.json"),
            json!({
                "version": "1.0.0",
                "hook": {
                    "path": "/opt/gpupin/bin/gpupin-hook",
                    "args": ["gpupin-hook", "--config", "/etc/gpupin/c.toml", "prestart"],
                },
                "when": {"annotations": {"^gpupin\\.": ".*"}},
                "stages": ["prestart"],
            })
        );
    }

    #[test]
    fn always_variant_matches_every_container() {
        for file in hook_files(&hook(None), Trigger::Always) {
            assert_eq!(file.content["when"], json!({"always": true}));
        }
    }

    /// The files shipped under hooks/ are what `install` writes for the placeholder path.
    #[test]
    fn shipped_examples_match_the_generator() {
        let placeholder = HookCommand {
            exe: PathBuf::from(PLACEHOLDER_EXE),
            config: None,
        };
        let shipped = [
            (Trigger::Annotation, "hooks"),
            (Trigger::Always, "hooks/always"),
        ];
        for (trigger, dir) in shipped {
            for file in hook_files(&placeholder, trigger) {
                let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(dir)
                    .join(&file.name);
                let text = std::fs::read_to_string(&path).unwrap();
                let shipped: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(shipped, file.content, "{}", path.display());
            }
        }
    }

    #[test]
    fn recognises_only_its_own_hooks() {
        let ours = content_of(
            &hook_files(&hook(None), Trigger::Always),
            "gpupin-poststop.json",
        );
        assert!(is_gpupin_hook(&ours, "poststop"));
        assert!(!is_gpupin_hook(&ours, "prestart"));
        let nvidia = json!({
            "version": "1.0.0",
            "hook": {"path": "/usr/bin/nvidia-container-toolkit", "args": ["nvidia-container-toolkit", "prestart"]},
            "when": {"always": true},
            "stages": ["prestart"],
        });
        assert!(!is_gpupin_hook(&nvidia, "prestart"));
        assert!(!is_gpupin_hook(&json!({}), "prestart"));
        // An older gpupin's file, which a new install replaces rather than refuses.
        let older = json!({
            "version": "1.0.0",
            "hook": {"path": "/usr/bin/gpupin", "args": ["gpupin", "hook", "poststop"]},
            "when": {"always": true},
            "stages": ["poststop"],
        });
        assert!(is_gpupin_hook(&older, "poststop"));
        assert!(!is_gpupin_hook(&older, "prestart"));
    }

    #[test]
    fn nvidia_hooks_that_run_before_gpupins_prestart_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let nvidia = |path: &str| {
            json!({"version": "1.0.0", "hook": {"path": path, "args": ["nvidia-container-runtime-hook", "prestart"]},
                   "when": {"always": true}, "stages": ["prestart"]})
            .to_string()
        };
        std::fs::write(
            dir.path().join("00-nvidia-hook.json"),
            nvidia("/usr/bin/nvidia-container-runtime-hook"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("oci-nvidia-hook.json"),
            nvidia("/usr/bin/nvidia-container-runtime-hook"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("01-other.json"),
            r#"{"hook": {"path": "/bin/true"}, "stages": ["prestart"]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("02-broken.json"), "{").unwrap();
        install(
            dir.path(),
            &hook_files(&hook(None), Trigger::Annotation),
            false,
        )
        .unwrap();
        assert_eq!(
            nvidia_hooks_before_gpupin(dir.path()),
            ["00-nvidia-hook.json"]
        );
        assert!(nvidia_hooks_before_gpupin(&dir.path().join("missing")).is_empty());
    }

    fn changes(steps: &[Step]) -> Vec<Change> {
        steps.iter().map(|s| s.change).collect()
    }

    #[test]
    fn install_is_idempotent_and_rewrites_changed_files() {
        let dir = tempfile::tempdir().unwrap();
        let hooks_dir = dir.path().join("hooks.d");
        let files = hook_files(&hook(None), Trigger::Annotation);
        let first = install(&hooks_dir, &files, false).unwrap();
        assert_eq!(changes(&first), [Change::Written; 3]);
        let again = install(&hooks_dir, &files, false).unwrap();
        assert_eq!(changes(&again), [Change::Unchanged; 3]);
        let always = hook_files(&hook(None), Trigger::Always);
        let switched = install(&hooks_dir, &always, false).unwrap();
        assert_eq!(changes(&switched), [Change::Written; 3]);
        let written = spec::read(&hooks_dir.join("gpupin-precreate.json")).unwrap();
        assert_eq!(written, always[0].content);
        assert_eq!(std::fs::read_dir(&hooks_dir).unwrap().count(), 3);
    }

    #[test]
    fn dry_run_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let hooks_dir = dir.path().join("hooks.d");
        let files = hook_files(&hook(None), Trigger::Annotation);
        let steps = install(&hooks_dir, &files, true).unwrap();
        assert_eq!(changes(&steps), [Change::Written; 3]);
        assert!(!hooks_dir.exists());
    }

    #[test]
    fn foreign_file_under_our_name_is_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        let foreign = dir.path().join("gpupin-prestart.json");
        std::fs::write(&foreign, "{\"hook\": {\"path\": \"/bin/true\"}}").unwrap();
        let files = hook_files(&hook(None), Trigger::Annotation);
        let err = install(dir.path(), &files, false).unwrap_err();
        assert!(matches!(&err, InstallError::Foreign { path } if *path == foreign));
        // Refused before anything was written.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let steps = uninstall(dir.path(), false).unwrap();
        assert_eq!(
            changes(&steps),
            [Change::Absent, Change::Foreign, Change::Absent]
        );
        assert!(foreign.exists());
    }

    #[test]
    fn uninstall_removes_exactly_gpupins_files() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("oci-nvidia-hook.json");
        std::fs::write(&other, "{}").unwrap();
        install(dir.path(), &hook_files(&hook(None), Trigger::Always), false).unwrap();
        let dry = uninstall(dir.path(), true).unwrap();
        assert_eq!(changes(&dry), [Change::Removed; 3]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
        let steps = uninstall(dir.path(), false).unwrap();
        assert_eq!(changes(&steps), [Change::Removed; 3]);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(left, [other]);
        assert_eq!(
            changes(&uninstall(dir.path(), false).unwrap()),
            [Change::Absent; 3]
        );
    }
}
