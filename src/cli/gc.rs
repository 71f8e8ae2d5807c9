//! `gpupin gc`: release the GPUs of holders that are gone.

use gpupin::config::Config;
use gpupin::ledger::Ledger;
use std::process::ExitCode;

pub fn run(config: &Config) -> anyhow::Result<ExitCode> {
    let reaped = Ledger::for_config(config)?.gc()?;
    for r in &reaped {
        println!(
            "released {} ({}): {}",
            r.id,
            pid_text(r.pid),
            r.gpus.join(",")
        );
    }
    println!(
        "{} stale holder{} released",
        reaped.len(),
        if reaped.len() == 1 { "" } else { "s" }
    );
    Ok(ExitCode::SUCCESS)
}

fn pid_text(pid: Option<i32>) -> String {
    pid.map_or("never started".into(), |p| format!("pid {p} gone"))
}
