//! One hook stage from its arguments and stdin to what the binary writes: the same for
//! `gpupin hook STAGE` and the lean `gpupin-hook`, so that neither keeps a copy. Only the
//! precreate stage has anything for stdout, and only the spec: podman parses it.

use super::{HookError, Outcome, Stage};
use crate::base::log;
use crate::host::inventory::NvmlAccess;
use crate::input::config::{Config, ConfigError};
use std::io::{Read, Write};
use std::path::Path;

/// What the runtime asked for.
pub struct StageArgs<'a> {
    /// `--config`, from the hook's arguments (runtimes give hooks an empty environment).
    pub config: Option<&'a Path>,
    pub stage: &'a str,
    /// `--refuse REASON`: fail with it whatever the state says (see `hook::precreate`).
    pub refuse: Option<&'a str>,
}

/// What the binary writes once the stage is done.
#[derive(Debug, Default, PartialEq)]
pub struct Said {
    /// For stdout, whole: the spec a precreate stage gives back.
    pub stdout: Option<Vec<u8>>,
    /// One line for the runtime's log (stderr): what the stage held, bound or released.
    pub note: Option<String>,
}

impl Said {
    /// Writes the note to `log` (a failed write is not worth failing a hook for) and the
    /// spec to `out`, whole and flushed: podman must read all of it, so that failing is
    /// the stage's failure. The binaries pass their stdout and stderr.
    pub fn write_to(&self, mut out: impl Write, mut log: impl Write) -> std::io::Result<()> {
        if let Some(note) = &self.note {
            let _ = writeln!(log, "{note}");
        }
        if let Some(bytes) = &self.stdout {
            out.write_all(bytes)?;
            out.flush()?;
        }
        Ok(())
    }
}

/// Runs the stage on the container state, read whole from `stdin` once the stage is
/// known (a mistyped stage is said at once, even to a terminal). `hook_exe` is the
/// `gpupin-hook` binary written into specs edited at precreate; `nvml` says where NVML
/// runs if the stage needs it. The config, and with it the log level of its `log` key
/// (`base::log::init_from_config`), is loaded only for a container that asks for GPUs.
pub fn run(
    args: &StageArgs,
    mut stdin: impl Read,
    hook_exe: &Path,
    nvml: NvmlAccess,
) -> Result<Said, StageError> {
    let stage: Stage = args.stage.parse()?;
    let mut state = Vec::new();
    stdin.read_to_end(&mut state).map_err(StageError::Stdin)?;
    if let Some(reason) = args.refuse {
        return Err(HookError::Precreate(reason.to_string()).into());
    }
    let load_config = || -> Result<Config, ConfigError> {
        let mut config = Config::discover(args.config)?;
        config.nvml = nvml;
        log::init_from_config(config.log);
        Ok(config)
    };
    Ok(said(super::run(stage, &state, hook_exe, load_config)?))
}

/// Why a stage failed: its own error, or stdin that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error("reading the container state on stdin")]
    Stdin(#[source] std::io::Error),
}

fn said(outcome: Outcome) -> Said {
    let holds =
        |r: &crate::state::ledger::Record| format!("gpupin: {} holds {}", r.id, r.gpus.join(","));
    match outcome {
        Outcome::NoRequest | Outcome::Released(None) => Said::default(),
        Outcome::Spec { bytes, claim } => Said {
            stdout: Some(bytes),
            note: claim.as_ref().map(holds),
        },
        Outcome::Allocated(record) => Said {
            stdout: None,
            note: Some(holds(&record)),
        },
        Outcome::Bound(record) => Said {
            stdout: None,
            note: Some(format!(
                "gpupin: {} bound to pid {}",
                record.id,
                record.pid.unwrap_or_default()
            )),
        },
        Outcome::Released(Some(record)) => Said {
            stdout: None,
            note: Some(format!(
                "gpupin: {} released {}",
                record.id,
                record.gpus.join(",")
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: Option<i32>) -> crate::state::ledger::Record {
        crate::state::ledger::Record {
            pid,
            ..crate::state::ledger::testing::record("web-1", &["GPU-a", "GPU-b"])
        }
    }

    #[test]
    fn each_outcome_is_the_line_the_runtime_logs() {
        assert_eq!(said(Outcome::NoRequest), Said::default());
        assert_eq!(said(Outcome::Released(None)), Said::default());
        assert_eq!(
            said(Outcome::Allocated(record(None))).note.as_deref(),
            Some("gpupin: web-1 holds GPU-a,GPU-b")
        );
        assert_eq!(
            said(Outcome::Bound(record(Some(42)))).note.as_deref(),
            Some("gpupin: web-1 bound to pid 42")
        );
        assert_eq!(
            said(Outcome::Released(Some(record(None)))).note.as_deref(),
            Some("gpupin: web-1 released GPU-a,GPU-b")
        );
        let spec = said(Outcome::Spec {
            bytes: b"{}".to_vec(),
            claim: Some(record(None)),
        });
        assert_eq!(spec.stdout.as_deref(), Some(&b"{}"[..]));
        assert_eq!(
            spec.note.as_deref(),
            Some("gpupin: web-1 holds GPU-a,GPU-b")
        );
        let as_it_came = said(Outcome::Spec {
            bytes: b"{}".to_vec(),
            claim: None,
        });
        assert_eq!(as_it_came.note, None);
    }

    #[test]
    fn the_note_goes_to_the_log_and_the_spec_to_stdout() {
        let said = said(Outcome::Spec {
            bytes: b"{\"ociVersion\":\"1.2.0\"}".to_vec(),
            claim: Some(record(None)),
        });
        let (mut out, mut log) = (Vec::new(), Vec::new());
        said.write_to(&mut out, &mut log).unwrap();
        assert_eq!(out, b"{\"ociVersion\":\"1.2.0\"}");
        assert_eq!(log, b"gpupin: web-1 holds GPU-a,GPU-b\n");
        // A spec podman cannot be given whole fails the stage; a lost note does not.
        assert!(said.write_to(Failing, Vec::new()).is_err());
        let note_only = Said {
            stdout: None,
            note: Some("gpupin: web-1 released GPU-a".into()),
        };
        assert!(note_only.write_to(Vec::new(), Failing).is_ok());
    }

    /// A stdin that cannot be read, a stdout or stderr that cannot be written.
    struct Failing;

    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("closed"))
        }
    }

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("closed"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_unknown_stage_or_a_refusal_is_an_error_before_any_state_is_read() {
        let args = |stage, refuse| StageArgs {
            config: None,
            stage,
            refuse,
        };
        let exe = Path::new("/nonexistent/gpupin-hook");
        // A stage nobody knows is said before stdin is read (a reader that fails shows it).
        let unread = std::io::Cursor::new(Vec::new()).chain(Failing);
        let err = run(&args("prestop", None), unread, exe, NvmlAccess::InProcess);
        assert!(matches!(err, Err(StageError::Hook(HookError::UnknownStage(s))) if s == "prestop"));
        let err = run(&args("prestart", None), Failing, exe, NvmlAccess::InProcess);
        assert!(matches!(err, Err(StageError::Stdin(_))), "{err:?}");
        let err = run(
            &args("precreate", Some("no GPU fits")),
            &b"not json"[..],
            exe,
            NvmlAccess::InProcess,
        );
        assert!(
            matches!(err, Err(StageError::Hook(HookError::Precreate(r))) if r == "no GPU fits")
        );
    }
}
