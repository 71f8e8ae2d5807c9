//! `gpupin install podman` / `gpupin uninstall podman`: the hooks.d files.

use anyhow::Context;
use gpupin::command::{Change, ContainersConf, HookCommand, Step, Trigger, podman};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct PodmanArgs {
    /// hooks.d directory to write to or remove from
    #[arg(long, default_value = podman::HOOKS_DIR, value_name = "DIR")]
    pub dir: PathBuf,
    /// Install: run the hooks for every container, not only those with a gpupin.*
    /// annotation, so that GPUPIN_* in a container's env is a request too
    #[arg(long)]
    pub always: bool,
    /// Show what would be written or removed, and change nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub fn install(config_flag: Option<&Path>, args: &PodmanArgs) -> anyhow::Result<ExitCode> {
    let hook = HookCommand::beside(
        &std::env::current_exe().context("finding the gpupin binary")?,
        super::absolute_config(config_flag)?,
    );
    let trigger = if args.always {
        Trigger::Always
    } else {
        Trigger::Annotation
    };
    let files = podman::hook_files(&hook, trigger);
    let steps = podman::install(&args.dir, &files, args.dry_run)?;
    for (step, file) in steps.iter().zip(&files) {
        outln!("{}", describe(step, args.dry_run))?;
        if args.dry_run && step.change == Change::Written {
            outln!("{:#}", file.content)?;
        }
    }
    let conf = ContainersConf::host();
    if args.dir == Path::new(podman::HOOKS_DIR) {
        // Podman reads this dir only where containers.conf says so: the drop-in does.
        let step = conf.install(args.dry_run)?;
        outln!("{}", describe(&step, args.dry_run))?;
    } else if let Ok(read) = conf.hooks_dirs(false)
        && !read.contains(&args.dir)
    {
        let read: Vec<String> = read.iter().map(|d| d.display().to_string()).collect();
        crate::cli::out::note(format_args!(
            "note: podman reads hooks from {} (containers.conf hooks_dir), not {}: run podman with --hooks-dir {}, or add it to hooks_dir",
            read.join(", "),
            args.dir.display(),
            args.dir.display()
        ));
    }
    for name in podman::nvidia_hooks_before_gpupin(&args.dir) {
        crate::cli::out::note(format_args!(
            "warning: {name} runs NVIDIA's hook at prestart before gpupin's, so without precreate (CRI-O) it cannot see gpupin's choice; rename it to sort after gpupin-prestart.json (the toolkit's name is oci-nvidia-hook.json)"
        ));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn uninstall(args: &PodmanArgs) -> anyhow::Result<ExitCode> {
    for step in podman::uninstall(&args.dir, args.dry_run)? {
        outln!("{}", describe(&step, args.dry_run))?;
    }
    if args.dir == Path::new(podman::HOOKS_DIR) {
        let step = ContainersConf::host().uninstall(args.dry_run)?;
        outln!("{}", describe(&step, args.dry_run))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(step: &Step, dry_run: bool) -> String {
    let verb = match (step.change, dry_run) {
        (Change::Written, false) => "wrote",
        (Change::Written, true) => "would write",
        (Change::Removed, false) => "removed",
        (Change::Removed, true) => "would remove",
        (Change::Unchanged, _) => "unchanged",
        (Change::Kept, _) => "kept (the package's hooks need it)",
        (Change::Absent, _) => "absent",
        (Change::Foreign, _) => "left alone (not written by gpupin)",
    };
    format!("{verb} {}", step.path.display())
}
