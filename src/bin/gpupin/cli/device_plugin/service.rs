//! The `DevicePlugin` service the kubelet calls: each method hands the request to
//! `gpupin::jobs::kube` on a blocking thread (the ledger takes a file lock) and turns the answer
//! into the API's messages.

use gpupin::command::{
    Config, DeviceState, Granted, HolderId, Inventory, KubeError, Ledger, Machine, kube, prefer,
};
use gpupin_kubelet_api::deviceplugin::device_plugin_server::DevicePlugin;
use gpupin_kubelet_api::deviceplugin::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo,
};
use gpupin_kubelet_api::{HEALTHY, UNHEALTHY};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

pub struct Plugin {
    pub config: Arc<Config>,
    pub inventory: Arc<Inventory>,
    /// The devices as the ledger last read, kept by the poller (`kubelet::poll`).
    pub devices: watch::Receiver<Vec<DeviceState>>,
}

/// The API's message for the device list.
pub fn device_list(states: &[DeviceState]) -> ListAndWatchResponse {
    ListAndWatchResponse {
        devices: states
            .iter()
            .map(|d| Device {
                id: d.uuid.clone(),
                health: (if d.healthy { HEALTHY } else { UNHEALTHY }).to_string(),
                topology: d.numa_node.map(|n| TopologyInfo {
                    nodes: vec![NumaNode { id: i64::from(n) }],
                }),
            })
            .collect(),
    }
}

/// A library error as the kubelet's error: one line, with a code for what went wrong.
fn status(err: KubeError) -> Status {
    let message = gpupin::command::one_line(&err);
    match err {
        KubeError::UnknownDevice { .. } | KubeError::NoDevices => Status::invalid_argument(message),
        KubeError::Grant(_) | KubeError::Driver(_) => Status::failed_precondition(message),
        KubeError::Ledger(_) | KubeError::Inventory(_) => Status::internal(message),
        _ => Status::internal(message),
    }
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("device plugin worker failed: {e}")))?
}

fn container_response(granted: Granted) -> ContainerAllocateResponse {
    ContainerAllocateResponse {
        envs: granted.env.into_iter().collect(),
        mounts: Vec::new(),
        devices: granted
            .nodes
            .into_iter()
            .map(|n| DeviceSpec {
                container_path: n.path.clone(),
                host_path: n.path,
                permissions: "rw".to_string(),
            })
            .collect(),
        annotations: granted.annotations.into_iter().collect(),
        cdi_devices: granted
            .cdi_devices
            .into_iter()
            .map(|name| CdiDevice { name })
            .collect(),
    }
}

/// Allocates for every container of one request, or for none: on an error the holders
/// made by this call (not those a retry found again) are released.
fn allocate_all(
    config: &Config,
    inventory: &Inventory,
    request: &AllocateRequest,
) -> Result<AllocateResponse, KubeError> {
    let ledger = gpupin::command::open_ledger(config)?;
    let before: Vec<String> = ledger.records()?.into_iter().map(|r| r.id).collect();
    let mut made: Vec<String> = Vec::new();
    let mut responses = Vec::new();
    for container in &request.container_requests {
        match kube::allocate::allocate(config, inventory, &container.devices_ids) {
            Ok(granted) => {
                tracing::info!(holder = %granted.holder, gpus = ?granted.gpus, "allocated for the kubelet");
                if !before.contains(&granted.holder) {
                    made.push(granted.holder.clone());
                }
                responses.push(container_response(granted));
            }
            Err(err) => {
                for id in made {
                    if let Ok(id) = HolderId::new(&id)
                        && let Err(undo) = ledger.release(&id)
                    {
                        tracing::warn!(holder = %id, error = %gpupin::command::one_line(&undo), "could not undo");
                    }
                }
                return Err(err);
            }
        }
    }
    Ok(AllocateResponse {
        container_responses: responses,
    })
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    /// The list at once, then again at every change, until the kubelet hangs up.
    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.devices.clone();
        tokio::spawn(async move {
            loop {
                let list = device_list(&devices.borrow_and_update());
                if tx.send(Ok(list)).await.is_err() {
                    break;
                }
                // A kubelet that hung up ends the task now, not at the next change.
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { break },
                    () = tx.closed() => break,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let (config, inventory) = (self.config.clone(), self.inventory.clone());
        let request = request.into_inner();
        blocking(move || {
            let ledger = Ledger::open_read_only(&config.ledger_settings()).map_err(|e| status(e.into()))?;
            let live = kube::live_records(&ledger).map_err(|e| status(e.into()))?;
            let figures = match config.policy.needs_live() {
                true => gpupin::command::read_live(
                    config.live_file.as_deref(),
                    &inventory,
                    &config.nvml,
                    None,
                )
                    .map_err(|e| status(e.into()))?,
                false => None,
            };
            let machine = Machine {
                live: figures.as_deref(),
                ..Machine::new(&inventory, config.policy)
            };
            let cursor = ledger.cursor();
            let container_responses = request
                .container_requests
                .iter()
                .map(|c| {
                    let ask = prefer::Ask {
                        available: &c.available_device_ids,
                        must_include: &c.must_include_device_ids,
                        size: usize::try_from(c.allocation_size).unwrap_or(0),
                    };
                    let device_ids = prefer::preferred(&machine, &live, cursor, &ask);
                    tracing::debug!(size = c.allocation_size, preferred = ?device_ids, "preferred allocation");
                    ContainerPreferredAllocationResponse { device_ids }
                })
                .collect();
            Ok(Response::new(PreferredAllocationResponse {
                container_responses,
            }))
        })
        .await
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let (config, inventory) = (self.config.clone(), self.inventory.clone());
        let request = request.into_inner();
        blocking(move || {
            allocate_all(&config, &inventory, &request)
                .map(Response::new)
                .map_err(|err| {
                    tracing::warn!(error = %gpupin::command::one_line(&err), "Allocate refused");
                    status(err)
                })
        })
        .await
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
