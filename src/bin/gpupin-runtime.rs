//! `gpupin-runtime`: an OCI runtime for Docker's daemon.json that pins GPUs on `create`
//! and hands every command to the real runtime (runc). Thin: the work, the runtime's
//! child included, is in `gpupin::engines::runtime::run`; this only execs and exits.

use gpupin::shim::{
    CONFIG_ENV, EntryError, Handover, Invocation, NvmlAccess, argv, binaries, runtime,
};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};

fn main() -> ExitCode {
    if let Err(err) = gpupin::shim::init_from_env() {
        let line = gpupin::shim::one_line(&err);
        let _ = writeln!(
            std::io::stderr().lock(),
            "gpupin: warning: {line}; logging off"
        );
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let invocation = match argv::parse(args, cwd) {
        Ok(inv) => inv,
        Err(err) => return fail(None, &anyhow::Error::from(err)),
    };
    match run(&invocation) {
        Ok(code) => code,
        Err(err) => fail(invocation.log_file.as_deref(), &err),
    }
}

fn run(inv: &Invocation) -> anyhow::Result<ExitCode> {
    let own_exe = std::env::current_exe()?;
    let flag = argv::config_path(inv.gpupin_config.as_deref(), std::env::var_os(CONFIG_ENV))?;
    let mut config = match runtime::load_config(flag.as_deref()) {
        Ok(config) => config,
        Err(runtime::ShimError::Entry(EntryError::Config(error))) => {
            let (handover, warning) = runtime::run_without_config(inv, &own_exe, error)?;
            if let Some(warning) = warning {
                warn(&warning);
            }
            return match handover {
                Handover::Exec { runtime } => Err(exec(&runtime, &inv.runtime_args)),
                Handover::Ran(status) => Ok(exit_code(status)),
            };
        }
        Err(other) => return Err(other.into()),
    };
    if let Some(real) = argv::runtime_override(inv.gpupin_runtime.as_deref())? {
        config.runtime = real;
    }
    // Linked statically in release builds: NVML is asked of the `gpupin` beside it.
    config.nvml = NvmlAccess::Helper(binaries::beside(&own_exe, binaries::CLI));
    gpupin::shim::init_from_config(config.log);
    match runtime::run(inv, &config, &own_exe)? {
        Handover::Exec { runtime } => Err(exec(&runtime, &inv.runtime_args)),
        Handover::Ran(status) => Ok(exit_code(status)),
    }
}

/// One `gpupin: ...` line on stderr (and nowhere else: the container starts).
fn warn(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "gpupin: {line}");
}

/// Replaces this process with the real runtime; returns only on failure.
fn exec(real: &Path, args: &[OsString]) -> anyhow::Error {
    let err = Command::new(real).args(args).exec();
    anyhow::Error::new(err).context(format!("running {}", real.display()))
}

fn exit_code(status: ExitStatus) -> ExitCode {
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Reports on stderr and, as runc does, in the `--log` file: containerd shows the last
/// error line of that file to the user (`docker run` prints it).
fn fail(log_file: Option<&Path>, err: &anyhow::Error) -> ExitCode {
    use std::io::Write;
    let msg = format!("gpupin: {}", gpupin::shim::one_line(err.as_ref()));
    // A closed or full stderr is no reason to panic: the log file may still get the line.
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
    if let Some(path) = log_file {
        append_log(path, &msg);
    }
    ExitCode::FAILURE
}

fn append_log(path: &Path, msg: &str) {
    use std::io::Write;
    let time = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
    let line = serde_json::json!({"level": "error", "msg": msg, "time": time});
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}
