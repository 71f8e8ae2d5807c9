//! `gpupin gc`: release the GPUs of holders that are gone, and clear what no holder owns.

use gpupin::command::Config;
use std::process::ExitCode;

pub fn run(config: &Config) -> anyhow::Result<ExitCode> {
    let report = gpupin::command::open_ledger(config)?.gc()?;
    for r in &report.released {
        outln!(
            "released {} ({}): {}",
            r.id,
            pid_text(r.pid),
            r.gpus.join(",")
        )?;
    }
    for path in &report.cleared {
        outln!("removed {path:?}")?;
    }
    // Left in place on purpose; each says how to remove it once inspected.
    for err in &report.left {
        super::out::note(format_args!("kept {}", gpupin::command::one_line(err)));
    }
    let n = report.released.len();
    outln!("{n} stale holder{} released", if n == 1 { "" } else { "s" })?;
    Ok(ExitCode::SUCCESS)
}

fn pid_text(pid: Option<i32>) -> String {
    pid.map_or("never started".into(), |p| format!("pid {p} gone"))
}
