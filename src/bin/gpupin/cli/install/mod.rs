//! `gpupin install ENGINE` / `gpupin uninstall ENGINE`.

mod podman;

use super::out;
use anyhow::Context;
use gpupin::command::{
    CONFIG_ENV, Config, NvidiaRuntime, Reload, RuntimeEntry, docker, file, reload,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InstallArgs {
    #[command(subcommand)]
    pub engine: Engine,
}

#[derive(clap::Args)]
pub struct UninstallArgs {
    #[command(subcommand)]
    pub engine: UninstallEngine,
}

#[derive(clap::Subcommand)]
pub enum Engine {
    /// Docker: the `gpupin` runtime in /etc/docker/daemon.json
    Docker(DockerArgs),
    /// Podman: hooks in /etc/containers/oci/hooks.d
    Podman(podman::PodmanArgs),
}

#[derive(clap::Subcommand)]
pub enum UninstallEngine {
    /// Docker: take the `gpupin` runtime out of /etc/docker/daemon.json
    Docker(DaemonFileArgs),
    /// Podman: remove gpupin's hooks from /etc/containers/oci/hooks.d
    Podman(podman::PodmanArgs),
}

#[derive(clap::Args)]
pub struct DockerArgs {
    /// Make gpupin Docker's default runtime
    #[arg(long)]
    pub default: bool,
    #[command(flatten)]
    pub file: DaemonFileArgs,
}

#[derive(clap::Args)]
pub struct DaemonFileArgs {
    /// Show the resulting daemon.json without writing it or signalling dockerd
    #[arg(long)]
    pub dry_run: bool,
    /// daemon.json to edit
    #[arg(long, default_value = "/etc/docker/daemon.json", value_name = "FILE")]
    pub daemon_json: PathBuf,
    /// dockerd's pid file: the dockerd told to reload (SIGHUP) after a change
    #[arg(long, default_value = reload::DEFAULT_PIDFILE, value_name = "FILE")]
    pub pidfile: PathBuf,
}

/// `loaded` is the config gpupin runs with (`config` names it when given): its `runtime`
/// says whether gpupin-runtime already hands over to a runtime of the admin's choice.
pub fn install(
    config: Option<&Path>,
    loaded: &Config,
    args: &InstallArgs,
) -> anyhow::Result<ExitCode> {
    let args = match &args.engine {
        Engine::Docker(args) => args,
        Engine::Podman(podman) => return podman::install(config, podman),
    };
    let mut entry = runtime_entry(config)?;
    let before = read_daemon_json(&args.file.daemon_json)?;
    if let Some(nvidia) = docker::nvidia_runtime(&before.doc) {
        entry.hand_over = hand_over_to(&nvidia, loaded)?;
    }
    let after = docker::with_gpupin(&before.doc, &entry, args.default)
        .with_context(|| format!("editing {}", args.file.daemon_json.display()))?;
    if args.default
        && let Some(old) =
            docker::default_runtime(&before.doc).filter(|r| *r != docker::RUNTIME_NAME)
    {
        out::note(format_args!(
            "default-runtime was {old:?}, now {:?}",
            docker::RUNTIME_NAME
        ));
    }
    apply(&args.file, &before, &after)
}

/// Where NVIDIA's container runtime is already Docker's way to GPUs, gpupin-runtime hands
/// containers over to it rather than to runc, so that they keep getting the driver's
/// libraries from NVIDIA's toolkit; unless the config already names a runtime other than
/// runc, which is the admin's choice and stays.
fn hand_over_to(nvidia: &NvidiaRuntime, config: &Config) -> anyhow::Result<Option<PathBuf>> {
    let configured = &config.runtime;
    if *configured != Config::default().runtime {
        out::note(format_args!(
            "daemon.json has NVIDIA's runtime {:?} ({}); gpupin-runtime keeps handing over to {} (runtime in the config)",
            nvidia.name,
            nvidia.path.display(),
            configured.display()
        ));
        return Ok(None);
    }
    out::note(format_args!(
        "daemon.json has NVIDIA's runtime {:?} ({}{}): gpupin-runtime hands containers over to it (--gpupin-runtime), so they still get the driver's libraries",
        nvidia.name,
        nvidia.path.display(),
        if nvidia.is_default {
            ", the default"
        } else {
            ""
        },
    ));
    Ok(Some(nvidia.path.clone()))
}

pub fn uninstall(args: &UninstallArgs) -> anyhow::Result<ExitCode> {
    let args = match &args.engine {
        UninstallEngine::Docker(args) => args,
        UninstallEngine::Podman(podman) => return podman::uninstall(podman),
    };
    let before = read_daemon_json(&args.daemon_json)?;
    if !before.existed {
        outln!(
            "{}: no such file, nothing to remove",
            args.daemon_json.display()
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let after = docker::without_gpupin(&before.doc)
        .with_context(|| format!("editing {}", args.daemon_json.display()))?;
    apply(args, &before, &after)
}

/// daemon.json as found: `existed` tells "no change" apart from "file to create".
struct Found {
    doc: Value,
    existed: bool,
}

fn read_daemon_json(path: &Path) -> anyhow::Result<Found> {
    let text = file::read(path)?;
    let doc = docker::parse(text.as_deref().unwrap_or(""))
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(Found {
        doc,
        existed: text.is_some(),
    })
}

/// gpupin-runtime beside this binary, and the config it is to use, both absolute:
/// dockerd runs them from its own working directory.
fn runtime_entry(config: Option<&Path>) -> anyhow::Result<RuntimeEntry> {
    let exe = std::env::current_exe().context("finding the gpupin binary")?;
    let path = exe.with_file_name("gpupin-runtime");
    anyhow::ensure!(
        path.is_file(),
        "gpupin-runtime not found beside {} (looked for {})",
        exe.display(),
        path.display()
    );
    Ok(RuntimeEntry {
        path,
        config: absolute_config(config)?,
        hand_over: None,
    })
}

/// The config an engine is to hand to gpupin, as an absolute path: dockerd and podman run
/// gpupin with their own working directory and environment, so neither a relative path
/// nor `$GPUPIN_CONFIG` would reach it. `None`: neither was given, the default applies.
/// A symlink is kept as a symlink: an admin who re-points it means gpupin to follow.
pub fn absolute_config(flag: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
    let env = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty());
    let Some(path) = flag.map(Path::to_path_buf).or(env.map(PathBuf::from)) else {
        return Ok(None);
    };
    let absolute = std::path::absolute(&path)
        .with_context(|| format!("making config path {} absolute", path.display()))?;
    Ok(Some(absolute))
}

/// Prints (dry run), reports no change, or writes with a backup and reloads dockerd.
fn apply(args: &DaemonFileArgs, before: &Found, after: &Value) -> anyhow::Result<ExitCode> {
    let path = &args.daemon_json;
    if args.dry_run {
        out!("{}", docker::render(after))?;
        out::note(format_args!(
            "dry run: {} not written, dockerd not signalled",
            path.display()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    if before.existed && before.doc == *after {
        outln!("{}: already up to date, no change", path.display())?;
        return Ok(ExitCode::SUCCESS);
    }
    match file::replace_with_backup(path, &docker::render(after))? {
        Some(backup) => outln!(
            "wrote {} (previous file saved as {})",
            path.display(),
            backup.display()
        )?,
        None => outln!("created {}", path.display())?,
    }
    report_reload(&args.pidfile, path)?;
    Ok(ExitCode::SUCCESS)
}

fn report_reload(pidfile: &Path, daemon_json: &Path) -> anyhow::Result<()> {
    match reload::reload_dockerd(pidfile)? {
        Reload::Signalled(pid) => outln!("dockerd (pid {pid}) told to reload (SIGHUP)")?,
        Reload::NotRunning => outln!(
            "dockerd is not running (no live dockerd in {}): it reads {} when it starts",
            pidfile.display(),
            daemon_json.display()
        )?,
    }
    Ok(())
}
