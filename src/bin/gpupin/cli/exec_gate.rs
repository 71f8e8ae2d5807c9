//! `gpupin exec-gate` (hidden): the first moments of a job `gpupin exec` starts. It waits
//! until its pid holds the GPUs and sits in its device cgroup (`exec::gate`), then
//! becomes the command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ExecGateArgs {
    /// The pipe `gpupin exec` opens the gate on
    #[arg(long = "gate-fd")]
    pub gate_fd: i32,
    /// Drop the capabilities that would let the job leave its confinement
    #[arg(long)]
    pub drop_caps: bool,
    #[arg(required = true, trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// Exit status when the gate never opened: the job was refused or its gpupin went away;
/// gpupin exec has said why.
const NOT_STARTED: u8 = 125;

pub fn run(args: &ExecGateArgs) -> anyhow::Result<ExitCode> {
    if !gpupin::command::pass_gate(args.gate_fd)? {
        return Ok(ExitCode::from(NOT_STARTED));
    }
    gpupin::command::unblock_all_signals()?;
    if args.drop_caps {
        gpupin::command::drop_job_caps()
            .map_err(|e| anyhow::anyhow!("dropping the job's capabilities: {e}"))?;
    }
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let err = std::process::Command::new(program).args(rest).exec();
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    super::out::note(format_args!(
        "gpupin: cannot run {}: {err}",
        program.to_string_lossy().escape_debug()
    ));
    Ok(ExitCode::from(code))
}
