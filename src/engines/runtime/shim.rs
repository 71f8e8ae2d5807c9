//! One gpupin-runtime invocation from start to end: gpupin's part on `create` and
//! `delete`, the real runtime for everything. The binary only replaces itself with the
//! real runtime when told to, and turns an outcome into an exit status.

use super::argv::{Action, Invocation};
use super::{ShimError, create, real_runtime};
use crate::admission::edits::HookCommand;
use crate::input::config::{Config, ConfigError};
use crate::model::holder::HolderId;
use crate::state::ledger::Ledger;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// What the binary does next.
#[derive(Debug)]
pub enum Handover {
    /// Replace this process with `runtime`, the arguments unchanged: every command but
    /// `create` and `delete`, and a `create` that asks for no GPU. No child, no wait.
    Exec { runtime: PathBuf },
    /// The real runtime ran as a child and gpupin did its part after it: exit as it did.
    Ran(ExitStatus),
}

/// Runs `inv` under `config` (the binary loads it, from `argv::config_path`, and sets up
/// logging from it first). `own_exe` is gpupin-runtime's path; `gpupin-hook` is beside it.
pub fn run(inv: &Invocation, config: &Config, own_exe: &Path) -> Result<Handover, ShimError> {
    let runtime = real_runtime(config, own_exe)?;
    match &inv.action {
        Action::Other => Ok(Handover::Exec { runtime }),
        Action::Create { bundle, id } => {
            let hook = HookCommand::beside(own_exe, config.path.clone());
            if create::prepare(config, bundle, id, &hook, inv.runc_root.as_deref())?.is_none() {
                return Ok(Handover::Exec { runtime });
            }
            // The container never comes to be when the runtime fails: no poststop will
            // run for it, so its GPUs go back now.
            let status = match run_child(&runtime, &inv.runtime_args) {
                Ok(status) => status,
                Err(err) => return Err(release_after(config, id, err)),
            };
            if !status.success() {
                release(config, id)?;
            }
            Ok(Handover::Ran(status))
        }
        Action::Delete { id } => {
            // Nothing held (a container that asked for nothing): nothing to do after the
            // runtime, so no child and no wait. A record cannot appear now: create and
            // the hooks that write one are over when delete comes.
            if holds(config, id) == Some(false) {
                return Ok(Handover::Exec { runtime });
            }
            let status = run_child(&runtime, &inv.runtime_args)?;
            // Poststop has usually released already; this covers a container whose hooks
            // never ran (killed before start, a runtime crash).
            release(config, id)?;
            Ok(Handover::Ran(status))
        }
    }
}

/// gpupin's config did not load (`error`). One typo must not stop every container on
/// the box: a `create` whose container has nothing to do with GPUs (`foreign::
/// mentions_gpus`, and no gpupin label or `--gpus` of Docker's) goes to the real runtime
/// (`--gpupin-runtime`, else `runc`) with a one-line warning for the caller to print, and
/// so does every other command (a container created before the config broke must still
/// stop and go). A create that has anything to do with GPUs fails with `error`: nothing
/// may reach a GPU around the ledger.
pub fn run_without_config(
    inv: &Invocation,
    own_exe: &Path,
    error: ConfigError,
) -> Result<(Handover, Option<String>), ShimError> {
    let mut fallback = Config::default();
    if let Some(real) = super::argv::runtime_override(inv.gpupin_runtime.as_deref())? {
        fallback.runtime = real;
    }
    let runtime = real_runtime(&fallback, own_exe)?;
    let Action::Create { bundle, id } = &inv.action else {
        return Ok((Handover::Exec { runtime }, None));
    };
    if touches_gpus(bundle, id) {
        return Err(error.into());
    }
    let warning = format!(
        "{}; container {id} asks for no GPU and starts without gpupin",
        crate::base::message::one_line(&error)
    );
    Ok((Handover::Exec { runtime }, Some(warning)))
}

/// Whether the container in `bundle` has anything to do with GPUs, read without a config:
/// its spec (`foreign::mentions_gpus`), and Docker's labels and `--gpus` where the spec
/// shows Docker's folder. What cannot be read counts as GPU-related.
fn touches_gpus(bundle: &Path, id: &str) -> bool {
    let Ok(spec) = crate::admission::spec::read(&bundle.join("config.json")) else {
        return true;
    };
    if crate::admission::foreign::mentions_gpus(&spec) {
        return true;
    }
    let Some(dir) = crate::engines::docker::container_dir(&spec, id) else {
        return false;
    };
    let labels = match crate::engines::docker::DockerContainer::read(&dir) {
        Ok(docker) => docker.labels(),
        Err(_) => return true,
    };
    labels
        .keys()
        .any(|k| k.starts_with(crate::input::request::ANNOTATION_PREFIX))
        || !matches!(crate::engines::docker::gpus_request(&dir), Ok(None))
}

fn run_child(runtime: &Path, args: &[OsString]) -> Result<ExitStatus, ShimError> {
    Command::new(runtime)
        .args(args)
        .status()
        .map_err(|source| ShimError::RunRuntime {
            path: runtime.to_path_buf(),
            source,
        })
}

/// Releases `id` if it holds anything. Cheap when it does not: one lstat of its record.
pub(super) fn release(config: &Config, id: &str) -> Result<(), ShimError> {
    let holder = HolderId::new(id)?;
    let ledger = crate::state::open_ledger(config)?;
    if ledger.holds(&holder) {
        ledger.release_container(&holder)?;
    }
    Ok(())
}

/// Whether `id` has a record: one lstat. `None` when the ledger cannot even be opened
/// read-only, which `release` then reports.
fn holds(config: &Config, id: &str) -> Option<bool> {
    let holder = HolderId::new(id).ok()?;
    let ledger = Ledger::open_read_only(&config.ledger_settings()).ok()?;
    Some(ledger.holds(&holder))
}

/// `error`, after releasing `id`; a failed release joins it rather than replace it.
fn release_after(config: &Config, id: &str, error: ShimError) -> ShimError {
    match release(config, id) {
        Ok(()) => error,
        Err(undo) => ShimError::Undo {
            error: Box::new(error),
            undo: Box::new(undo),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::runtime::argv;
    use serde_json::json;

    /// A config whose real runtime is `runtime`, and a bundle asking for one GPU.
    fn setup(runtime: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("gpupin.toml");
        let text = format!(
            "state_dir = \"state\"\ninventory = \"sim:nvswitch8\"\nruntime = {runtime:?}\n"
        );
        std::fs::write(&config, text).unwrap();
        let bundle = tmp.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let spec = json!({"ociVersion": "1.0.2", "process": {"args": ["true"]},
            "root": {"path": "rootfs"}, "annotations": {"gpupin.count": "1"}});
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        (tmp, config, bundle)
    }

    fn create(config: &Path, bundle: &Path) -> Invocation {
        create_as(config, bundle, "c1")
    }

    fn create_as(config: &Path, bundle: &Path, id: &str) -> Invocation {
        let args = [
            "--gpupin-config",
            config.to_str().unwrap(),
            "create",
            "--bundle",
        ]
        .iter()
        .map(OsString::from)
        .chain([bundle.as_os_str().to_owned(), id.into()])
        .collect();
        argv::parse(args, bundle.to_path_buf()).unwrap()
    }

    fn run_with(inv: &Invocation) -> Result<Handover, ShimError> {
        let config =
            crate::input::config::Config::load(inv.gpupin_config.as_deref().unwrap()).unwrap();
        run(inv, &config, Path::new("/usr/bin/gpupin-runtime"))
    }

    fn held(tmp: &Path) -> usize {
        Ledger::open(&crate::input::config::LedgerSettings::at(
            &tmp.join("state"),
        ))
        .unwrap()
        .records()
        .unwrap()
        .len()
    }

    #[test]
    fn a_runtime_that_cannot_start_gets_the_gpus_released() {
        let (tmp, config, bundle) = setup("/nonexistent/runc");
        let err = run_with(&create(&config, &bundle)).unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert!(
            text.starts_with("running the runtime /nonexistent/runc: "),
            "{text}"
        );
        assert_eq!(held(tmp.path()), 0);
    }

    #[test]
    fn a_failed_create_releases_and_a_good_one_keeps_its_gpus() {
        let (tmp, config, bundle) = setup("/bin/false");
        let inv = create(&config, &bundle);
        assert!(matches!(run_with(&inv).unwrap(), Handover::Ran(s) if !s.success()));
        assert_eq!(held(tmp.path()), 0);
        let (tmp, config, bundle) = setup("/bin/true");
        let inv = create(&config, &bundle);
        assert!(matches!(run_with(&inv).unwrap(), Handover::Ran(s) if s.success()));
        assert_eq!(held(tmp.path()), 1);
    }

    fn delete(config: &Path, id: &str) -> Invocation {
        let args = ["--gpupin-config", config.to_str().unwrap(), "delete", id];
        argv::parse(
            args.iter().map(OsString::from).collect(),
            PathBuf::from("/"),
        )
        .unwrap()
    }

    #[test]
    fn delete_hands_over_unless_something_is_held_and_then_releases_after() {
        let (tmp, config, bundle) = setup("/bin/true");
        // Nothing held: the runtime replaces the shim, as for any other command.
        assert!(matches!(
            run_with(&delete(&config, "c1")).unwrap(),
            Handover::Exec { .. }
        ));
        run_with(&create(&config, &bundle)).unwrap();
        assert_eq!(held(tmp.path()), 1);
        assert!(matches!(
            run_with(&delete(&config, "c1")).unwrap(),
            Handover::Ran(s) if s.success()
        ));
        assert_eq!(held(tmp.path()), 0);
    }

    /// The review's eleventh finding: a container named like root's hold `slurm-42`
    /// was refused at create, and its cleanup released root's hold.
    #[test]
    fn a_container_releases_no_record_but_its_own() {
        let (tmp, config, bundle) = setup("/bin/true");
        let loaded = crate::input::config::Config::load(&config).unwrap();
        crate::jobs::hold::testing::roots(&loaded, "slurm-42", "3");
        let err = run_with(&create_as(&config, &bundle, "slurm-42")).unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert!(
            text.contains("holder slurm-42 exists already (hold of root)"),
            "{text}"
        );
        assert!(matches!(
            run_with(&delete(&config, "slurm-42")).unwrap(),
            Handover::Ran(s) if s.success()
        ));
        let records = Ledger::open(&crate::input::config::LedgerSettings::at(
            &tmp.path().join("state"),
        ))
        .unwrap()
        .records()
        .unwrap();
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["slurm-42"], "root's hold is still there");
    }

    /// The config does not load (a typo under [limits]), and the shim is run as Docker
    /// runs it, with `--gpupin-runtime`.
    fn broken(tmp: &Path, bundle: &Path, id: &str) -> (Invocation, ConfigError) {
        let config = tmp.join("broken.toml");
        std::fs::write(&config, "[limits]\npolcy = \"pack\"\n").unwrap();
        let args = [
            "--gpupin-config",
            config.to_str().unwrap(),
            "--gpupin-runtime",
            "/bin/true",
            "create",
            "--bundle",
        ]
        .iter()
        .map(OsString::from)
        .chain([bundle.as_os_str().to_owned(), id.into()])
        .collect();
        let inv = argv::parse(args, bundle.to_path_buf()).unwrap();
        let error = crate::input::config::Config::load(&config).unwrap_err();
        (inv, error)
    }

    #[test]
    fn a_broken_config_stops_only_containers_that_touch_gpus() {
        let (tmp, _, bundle) = setup("/bin/true");
        // The bundle asks for a GPU: the config's error, nothing run, nothing held.
        let (inv, error) = broken(tmp.path(), &bundle, "c1");
        let err =
            run_without_config(&inv, Path::new("/usr/bin/gpupin-runtime"), error).unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert!(text.contains("unknown key \"polcy\" in [limits]"), "{text}");
        assert_eq!(held(tmp.path()), 0);
        // A container that has nothing to do with GPUs is handed to the runtime, with a
        // warning that says why gpupin is not there.
        let spec = json!({"ociVersion": "1.0.2", "process": {"args": ["true"], "env": ["PATH=/bin"]},
            "root": {"path": "rootfs"}});
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let (inv, error) = broken(tmp.path(), &bundle, "web");
        let (handover, warning) =
            run_without_config(&inv, Path::new("/usr/bin/gpupin-runtime"), error).unwrap();
        assert!(
            matches!(handover, Handover::Exec { ref runtime } if runtime == Path::new("/bin/true")),
            "{handover:?}"
        );
        let warning = warning.unwrap();
        assert!(
            warning.starts_with("invalid config ")
                && warning.ends_with("; container web asks for no GPU and starts without gpupin"),
            "{warning}"
        );
    }
}
