//! `gpupin-hook [--config FILE] STAGE`: the OCI hook that runtimes start for containers
//! (hooks.d files, specs gpupin edits, `gpupin install`). It does what `gpupin hook STAGE`
//! does, without the CLI around it: no argument parser library, nothing loaded before
//! the stage's work, so that a container without a request pays little more than an exec.
//! NVML, when a stage needs it, is asked of the `gpupin` binary beside this one.

use gpupin::hook::{NvmlAccess, binaries, stage};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: gpupin-hook [--config FILE] STAGE
Runs one OCI hook stage for gpupin: the container state on stdin (precreate: the spec,
written back edited on stdout).
STAGE: precreate (podman), prestart, createRuntime or poststop
--config FILE: gpupin's config [default: $GPUPIN_CONFIG, else /etc/gpupin/config.toml]";

/// The arguments, as runtimes pass them.
#[derive(Debug, Default, PartialEq)]
struct Args {
    config: Option<PathBuf>,
    stage: Option<String>,
    refuse: Option<String>,
    help: bool,
    version: bool,
}

fn main() -> ExitCode {
    if let Err(err) = gpupin::hook::init_from_env() {
        let line = gpupin::hook::one_line(&err);
        let _ = writeln!(
            std::io::stderr().lock(),
            "gpupin: warning: {line}; logging off"
        );
    }
    let args = match parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(reason) => {
            report(&format!("{reason} (see gpupin-hook --help)"));
            return ExitCode::from(2);
        }
    };
    if args.help || args.version {
        let text = if args.help {
            USAGE.to_string()
        } else {
            format!("gpupin-hook {}", env!("CARGO_PKG_VERSION"))
        };
        let _ = writeln!(std::io::stdout().lock(), "{text}");
        return ExitCode::SUCCESS;
    }
    let Some(stage_name) = args.stage.as_deref() else {
        report("a hook stage is required (see gpupin-hook --help)");
        return ExitCode::from(2);
    };
    let stage_args = stage::StageArgs {
        config: args.config.as_deref(),
        stage: stage_name,
        refuse: args.refuse.as_deref(),
    };
    let outcome = std::env::current_exe()
        .map_err(anyhow::Error::from)
        .and_then(|exe| {
            let nvml = NvmlAccess::Helper(binaries::beside(&exe, binaries::CLI));
            let said = stage::run(&stage_args, std::io::stdin().lock(), &exe, nvml)?;
            said.write_to(std::io::stdout().lock(), std::io::stderr().lock())?;
            Ok(())
        });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            report(&gpupin::hook::one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// One line: runtimes fold hook stderr into their own error message.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "gpupin: {line}");
}

fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Args, String> {
    let mut args = Args::default();
    let mut argv = argv.into_iter();
    while let Some(arg) = argv.next() {
        let text = arg.to_str().map(str::to_owned);
        let mut value_of = |flag: &str| argv.next().ok_or_else(|| format!("{flag} needs a value"));
        match text.as_deref() {
            Some("-h" | "--help") => args.help = true,
            Some("-V" | "--version") => args.version = true,
            Some("--config") => args.config = Some(PathBuf::from(value_of("--config")?)),
            Some(s) if s.starts_with("--config=") => {
                args.config = Some(PathBuf::from(&s["--config=".len()..]));
            }
            Some("--refuse") => {
                let reason = value_of("--refuse")?;
                args.refuse = Some(reason.to_string_lossy().into_owned());
            }
            Some(s) if s.starts_with('-') => return Err(format!("unexpected argument {s:?}")),
            Some(s) if args.stage.is_none() => args.stage = Some(s.to_string()),
            _ => {
                return Err(format!("unexpected argument {:?}", arg.to_string_lossy()));
            }
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(argv: &[&str]) -> Result<Args, String> {
        parse(argv.iter().map(OsString::from))
    }

    #[test]
    fn takes_what_runtimes_pass() {
        assert_eq!(
            parsed(&["--config", "/etc/g.toml", "prestart"]).unwrap(),
            Args {
                config: Some("/etc/g.toml".into()),
                stage: Some("prestart".into()),
                ..Args::default()
            }
        );
        assert_eq!(
            parsed(&["--config=/c.toml", "prestart", "--refuse", "no GPU"]).unwrap(),
            Args {
                config: Some("/c.toml".into()),
                stage: Some("prestart".into()),
                refuse: Some("no GPU".into()),
                ..Args::default()
            }
        );
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        assert_eq!(
            parsed(&["prestart", "poststop"]).unwrap_err(),
            "unexpected argument \"poststop\""
        );
        assert_eq!(
            parsed(&["--bogus"]).unwrap_err(),
            "unexpected argument \"--bogus\""
        );
        assert_eq!(parsed(&["--config"]).unwrap_err(), "--config needs a value");
    }
}
