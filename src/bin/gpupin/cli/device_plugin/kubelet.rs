//! The plugin's life beside the kubelet: serve the socket, register it, keep the device
//! list current, reconcile with the pods, and start over when the kubelet restarts.

use super::Endpoints;
use super::service::Plugin;
use anyhow::Context;
use gpupin::command::{Config, DeviceState, Inventory, Ledger, Unit, devices, kube, reconcile};
use gpupin_kubelet_api::DEVICE_PLUGIN_VERSION;
use gpupin_kubelet_api::deviceplugin::device_plugin_server::DevicePluginServer;
use gpupin_kubelet_api::deviceplugin::registration_client::RegistrationClient;
use gpupin_kubelet_api::deviceplugin::{DevicePluginOptions, RegisterRequest};
use gpupin_kubelet_api::podresources::ListPodResourcesRequest;
use gpupin_kubelet_api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};

/// The loops' periods (the flags).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub poll: Duration,
    pub reconcile: Duration,
    pub grace: Duration,
}

/// Serves until SIGTERM or SIGINT; then removes the socket.
pub async fn run(
    config: Config,
    inventory: Inventory,
    endpoints: Endpoints,
    timing: Timing,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let inventory = Arc::new(inventory);
    let unit = endpoints.unit.clone();
    let (tx, devices) = watch::channel(read_devices(&config, &inventory, &unit).await?);
    tokio::spawn(poll(
        config.clone(),
        inventory.clone(),
        unit,
        tx,
        timing.poll,
    ));
    if endpoints.reconciles {
        tokio::spawn(reconcile_loop(config.clone(), endpoints.clone(), timing));
    }
    let plugin = Arc::new(Plugin {
        config,
        inventory,
        devices,
    });
    let mut stop = Box::pin(stop_signal());
    loop {
        let served = serve(&plugin, &endpoints, timing.poll);
        tokio::select! {
            result = served => result?,
            () = &mut stop => break,
        }
        tracing::info!(socket = ?endpoints.plugin_socket, "the socket is gone (the kubelet restarted): serving and registering again");
    }
    remove_socket(&endpoints.plugin_socket)?;
    tracing::info!("stopped");
    Ok(())
}

/// One life of the plugin's socket: serve it, register it, and return once it is gone.
async fn serve(plugin: &Arc<Plugin>, endpoints: &Endpoints, poll: Duration) -> anyhow::Result<()> {
    let socket = &endpoints.plugin_socket;
    let listener = bind_private(socket)?;
    let inode = std::fs::symlink_metadata(socket)?.ino();
    let service = DevicePluginServer::from_arc(plugin.clone());
    let incoming = UnixListenerStream::new(listener);
    let server = tokio::spawn(async move {
        if let Err(err) = Server::builder()
            .serve_with_incoming(service, incoming)
            .await
        {
            tracing::error!(error = %err, "serving the device plugin API");
        }
    });
    tracing::info!(socket = ?socket, resource = %endpoints.resource_name, "serving the device plugin API");
    register(endpoints, poll).await;
    // The kubelet removes every plugin socket when it starts: then register again.
    while std::fs::symlink_metadata(socket).is_ok_and(|m| m.ino() == inode) {
        tokio::time::sleep(poll).await;
    }
    // Not a graceful stop: it would wait for the old kubelet's connections (a
    // ListAndWatch stream lasts as long as its caller), which a restart leaves behind.
    server.abort();
    Ok(())
}

/// A listener at `socket` that only root can connect to: whoever can call `Allocate`
/// could take any GPU. Bound under a temporary name, made 0600, then renamed into place,
/// so that no one connects in between.
fn bind_private(socket: &Path) -> anyhow::Result<UnixListener> {
    let name = socket.file_name().unwrap_or_default().to_string_lossy();
    let temp = socket.with_file_name(format!(".{name}.{}", std::process::id()));
    remove_socket(&temp)?;
    let listener =
        UnixListener::bind(&temp).with_context(|| format!("listening on {}", temp.display()))?;
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("setting the mode of {}", temp.display()))?;
    remove_socket(socket)?;
    std::fs::rename(&temp, socket)
        .with_context(|| format!("moving {} to {}", temp.display(), socket.display()))?;
    Ok(listener)
}

/// Registers with the kubelet, trying again every `poll` until it answers.
async fn register(endpoints: &Endpoints, poll: Duration) {
    let mut said = false;
    loop {
        match try_register(endpoints).await {
            Ok(()) => {
                tracing::info!(kubelet = ?endpoints.kubelet_socket, resource = %endpoints.resource_name, "registered with the kubelet");
                return;
            }
            Err(err) if !said => {
                tracing::warn!(kubelet = ?endpoints.kubelet_socket, error = %line(&err), "cannot register yet; trying again");
                said = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(poll).await;
    }
}

async fn try_register(endpoints: &Endpoints) -> anyhow::Result<()> {
    let channel = connect(&endpoints.kubelet_socket).await?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: DEVICE_PLUGIN_VERSION.to_string(),
            endpoint: endpoints.socket_name.clone(),
            resource_name: endpoints.resource_name.clone(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|s| anyhow::anyhow!("the kubelet refused: {}", s.message()))?;
    Ok(())
}

/// A channel to a gRPC server on the Unix socket `path`.
async fn connect(path: &Path) -> anyhow::Result<Channel> {
    let uri = format!("unix://{}", path.display());
    Endpoint::from_shared(uri)?
        .connect()
        .await
        .with_context(|| format!("connecting to {}", path.display()))
}

/// Removes a socket left at `path` (by an earlier run); refuses anything else there.
fn remove_socket(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
        }
        Ok(_) => anyhow::bail!(
            "refusing {}: expected a socket (or nothing) where the plugin listens",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", path.display())),
    }
}

async fn read_devices(
    config: &Arc<Config>,
    inventory: &Arc<Inventory>,
    unit: &Unit,
) -> anyhow::Result<Vec<DeviceState>> {
    let (config, inventory, unit) = (config.clone(), inventory.clone(), unit.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<DeviceState>> {
        let ledger = Ledger::open_read_only(&config.ledger_settings())?;
        Ok(devices::states_of(
            &inventory,
            &kube::live_records(&ledger)?,
            &ledger.fences()?,
            &unit,
        ))
    })
    .await?
}

/// Reads the ledger every `period`; a changed device list goes to every stream.
async fn poll(
    config: Arc<Config>,
    inventory: Arc<Inventory>,
    unit: Unit,
    tx: watch::Sender<Vec<DeviceState>>,
    period: Duration,
) {
    loop {
        tokio::time::sleep(period).await;
        match read_devices(&config, &inventory, &unit).await {
            Ok(states) => {
                tx.send_if_modified(|old| {
                    let changed = *old != states;
                    if changed {
                        let unhealthy: Vec<&str> = states
                            .iter()
                            .filter(|d| !d.healthy)
                            .map(|d| d.uuid.as_str())
                            .collect();
                        tracing::info!(held_outside_kubernetes = ?unhealthy, "device list changed");
                        *old = states;
                    }
                    changed
                });
            }
            Err(err) => tracing::warn!(error = %line(&err), "reading the ledger"),
        }
    }
}

/// At start and every `timing.reconcile`: releases the plugin's holders that no pod
/// has held in any `List` for `timing.grace`. A failed `List` releases nothing.
async fn reconcile_loop(config: Arc<Config>, endpoints: Endpoints, timing: Timing) {
    // Said once until the kubelet answers again, not at every round.
    let mut failing = false;
    // Since when each holder has been left out of every List (kept across rounds).
    let mut unlisted = reconcile::Unlisted::default();
    loop {
        match assigned(&endpoints).await {
            Ok(assigned) => {
                failing = false;
                let config = config.clone();
                let mut seen = unlisted.clone();
                let released = tokio::task::spawn_blocking(move || {
                    let ledger = gpupin::command::open_ledger(&config)?;
                    let released =
                        reconcile::release_unassigned(&ledger, &assigned, timing.grace, &mut seen);
                    released.map(|_| seen)
                })
                .await;
                match released {
                    Ok(Ok(seen)) => unlisted = seen,
                    Ok(Err(err)) => {
                        tracing::warn!(error = %gpupin::command::one_line(&err), "reconcile")
                    }
                    Err(_) => {}
                }
            }
            Err(_) if failing => {}
            Err(err) => {
                failing = true;
                tracing::warn!(
                    socket = ?endpoints.pod_resources_socket,
                    error = %line(&err),
                    "cannot list the pods' devices: nothing released"
                )
            }
        }
        tokio::time::sleep(timing.reconcile).await;
    }
}

/// The device ids of our resources that the kubelet's containers hold: every resource
/// this plugin registers, since a MIG profile's holders are released by this list too.
async fn assigned(endpoints: &Endpoints) -> anyhow::Result<BTreeSet<String>> {
    let channel = connect(&endpoints.pod_resources_socket).await?;
    let pods = PodResourcesListerClient::new(channel)
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("List failed: {}", s.message()))?
        .into_inner();
    Ok(pods
        .pod_resources
        .iter()
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.devices)
        .filter(|d| endpoints.all_resources.contains(&d.resource_name))
        .flat_map(|d| d.device_ids.iter().cloned())
        .collect())
}

/// An error chain on one line, each part once: tonic's transport errors repeat their
/// source's message in their own.
fn line(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for part in err.chain().map(ToString::to_string) {
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    gpupin::command::escape_controls(&text)
}

/// SIGTERM (the DaemonSet's pod stopping) or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}
