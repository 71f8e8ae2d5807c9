//! `gpupin device-plugin`: gpupin as the kubelet's device plugin (API `v1beta1`), so that
//! the scheduler knows which GPUs gpupin's other holders took. It serves `DevicePlugin`
//! on its own socket in the kubelet's device-plugins directory, registers that socket
//! with the kubelet, and keeps three loops running:
//! - the ledger is read every `--poll-interval` (1s): a change in which GPUs holders
//!   outside Kubernetes have is sent to every `ListAndWatch` stream (`devices`);
//! - every `--reconcile-interval` (and at start) the kubelet's PodResources `List` says
//!   which GPUs pods still hold; the plugin's holders of other GPUs are released
//!   (`kubelet`);
//! - the socket is watched: the kubelet removes every plugin's socket when it restarts,
//!   and then the plugin serves a new one and registers again.
//!
//! The decisions themselves are the library's (`gpupin::jobs::kube`); this module is the gRPC
//! and the tokio around them, and only this binary links either.

mod kubelet;
mod service;

use gpupin::command::{Config, DEFAULT_RESOURCE, MigStrategy, Unit, devices};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct DevicePluginArgs {
    /// The kubelet's device plugin directory: its kubelet.sock and this plugin's socket
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/device-plugins"
    )]
    pub plugin_dir: PathBuf,
    /// The file name of this plugin's socket in --plugin-dir
    #[arg(long, value_name = "NAME", default_value = "gpupin.sock")]
    pub socket_name: String,
    /// The kubelet's PodResources socket, for releasing what pods no longer hold
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pub pod_resources_socket: PathBuf,
    /// The resource pods ask for in their limits
    #[arg(long, value_name = "NAME", default_value = DEFAULT_RESOURCE)]
    pub resource_name: String,
    /// MIG instances as NVIDIA's plugin offers them: none (whole GPUs only), single (every
    /// GPU in MIG mode with one profile: instances under --resource-name), mixed (each
    /// profile as <domain>/mig-<profile>, e.g. nvidia.com/mig-1g.10gb, beside whole GPUs)
    #[arg(long, value_name = "STRATEGY", default_value = "none", value_parser = ["none", "single", "mixed"])]
    pub mig_strategy: String,
    /// How often the ledger is read for GPUs taken or given back outside Kubernetes
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration())]
    pub poll_interval: Duration,
    /// How often the kubelet is asked which GPUs its pods still hold
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration())]
    pub reconcile_interval: Duration,
    /// How long every List must have left a holder out before the reconcile releases it
    /// (the kubelet lists a container's devices only after Allocate returns, and a kubelet
    /// that has just restarted lists none for a moment)
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = super::flag::grace())]
    pub reconcile_grace: Duration,
}

/// Durations as people write them (`1s`, `500ms`, `2m`), zero refused.
fn duration() -> super::flag::Parsed<Duration, String> {
    super::flag::Parsed(|text| match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!(
            "{text:?}: expected a duration above zero, such as 1s or 500ms"
        )),
    })
}

/// Where the plugin listens and whom it tells, as the flags say.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub plugin_socket: PathBuf,
    pub socket_name: String,
    pub kubelet_socket: PathBuf,
    pub pod_resources_socket: PathBuf,
    pub resource_name: String,
    /// What this resource advertises.
    pub unit: Unit,
    /// Every resource the plugin registers (the reconcile reads them all).
    pub all_resources: Vec<String>,
    /// Whether this resource's plugin runs the reconcile: one does, for all of them.
    pub reconciles: bool,
}

pub fn run(config: &Config, args: &DevicePluginArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !args.socket_name.is_empty() && !args.socket_name.contains('/'),
        "invalid --socket-name {:?}: expected a file name in --plugin-dir, without '/'",
        args.socket_name
    );
    gpupin::command::open_ledger(config)?;
    let inventory = config.load_inventory()?;
    let strategy = match args.mig_strategy.as_str() {
        "single" => MigStrategy::Single,
        "mixed" => MigStrategy::Mixed,
        _ => MigStrategy::None,
    };
    let resources = devices::resources(&inventory, strategy, &args.resource_name)?;
    let all_resources: Vec<String> = resources.iter().map(|r| r.name.clone()).collect();
    let timing = kubelet::Timing {
        poll: args.poll_interval,
        reconcile: args.reconcile_interval,
        grace: args.reconcile_grace,
    };
    // Two workers: the ledger's calls are short and run on tokio's blocking threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // One plugin (socket, registration, device list) per resource, as the kubelet wants.
    runtime.block_on(async {
        let mut plugins = tokio::task::JoinSet::new();
        for (i, resource) in resources.into_iter().enumerate() {
            let socket_name = match &resource.unit {
                Unit::Profile(profile) => {
                    let stem = args
                        .socket_name
                        .strip_suffix(".sock")
                        .unwrap_or(&args.socket_name);
                    format!("{stem}-mig-{profile}.sock")
                }
                Unit::Whole | Unit::AllInstances => args.socket_name.clone(),
            };
            let endpoints = Endpoints {
                plugin_socket: args.plugin_dir.join(&socket_name),
                socket_name,
                kubelet_socket: args.plugin_dir.join("kubelet.sock"),
                pod_resources_socket: args.pod_resources_socket.clone(),
                resource_name: resource.name,
                unit: resource.unit,
                all_resources: all_resources.clone(),
                reconciles: i == 0,
            };
            plugins.spawn(kubelet::run(
                config.clone(),
                inventory.clone(),
                endpoints,
                timing,
            ));
        }
        while let Some(done) = plugins.join_next().await {
            done??;
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
