//! `gpupin install ENGINE` / `gpupin uninstall ENGINE`.

use std::path::Path;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InstallArgs {
    #[command(subcommand)]
    pub engine: Engine,
}

#[derive(clap::Args)]
pub struct UninstallArgs {
    #[command(subcommand)]
    pub engine: Engine,
}

#[derive(clap::Subcommand)]
pub enum Engine {
    /// Docker: the `gpupin` runtime in /etc/docker/daemon.json
    Docker(DockerArgs),
    /// Podman: hooks in /etc/containers/oci/hooks.d
    Podman(super::install_podman::PodmanArgs),
}

#[derive(clap::Args)]
pub struct DockerArgs {
    /// Make gpupin Docker's default runtime
    #[arg(long)]
    pub default: bool,
    /// Show the resulting daemon.json without writing it or signalling dockerd
    #[arg(long)]
    pub dry_run: bool,
    /// daemon.json to edit
    #[arg(long, default_value = "/etc/docker/daemon.json", value_name = "FILE")]
    pub daemon_json: std::path::PathBuf,
}

pub fn install(config: Option<&Path>, args: &InstallArgs) -> anyhow::Result<ExitCode> {
    match &args.engine {
        Engine::Podman(podman) => super::install_podman::install(config, podman),
        Engine::Docker(_) => anyhow::bail!("install: not yet"),
    }
}

pub fn uninstall(args: &UninstallArgs) -> anyhow::Result<ExitCode> {
    match &args.engine {
        Engine::Podman(podman) => super::install_podman::uninstall(podman),
        Engine::Docker(_) => anyhow::bail!("uninstall: not yet"),
    }
}
