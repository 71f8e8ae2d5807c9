//! A blocking CRI client over a Unix socket: tonic's generic unary call with prost's
//! codec, on a single-threaded tokio runtime of its own, so the tests stay plain
//! synchronous code.

use super::api::*;
use std::path::Path;
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

/// The longest one call may take: far beyond any start here, short of a hung test.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Cri {
    runtime: tokio::runtime::Runtime,
    grpc: tonic::client::Grpc<Channel>,
}

impl Cri {
    /// A client of the CRI served on `socket` (connected on its first call).
    pub fn new(socket: &Path) -> Cri {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoint = Endpoint::from_shared(format!("unix://{}", socket.display()))
            .unwrap()
            .timeout(CALL_TIMEOUT);
        // A lazy channel spawns its worker on the runtime it is made in.
        let channel = {
            let _inside = runtime.enter();
            endpoint.connect_lazy()
        };
        Cri {
            runtime,
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// `/runtime.v1.RuntimeService/METHOD` with `request`.
    pub fn call<Q, A>(&self, method: &str, request: Q) -> Result<A, tonic::Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let path = PathAndQuery::try_from(format!("/runtime.v1.RuntimeService/{method}")).unwrap();
        // A clone shares the connection; calls need `&mut`, and a pod's clean-up holds
        // only `&Cri`.
        let mut grpc = self.grpc.clone();
        self.runtime.block_on(async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let codec = tonic_prost::ProstCodec::<Q, A>::default();
            let answer = grpc
                .unary(tonic::Request::new(request), path, codec)
                .await?;
            Ok(answer.into_inner())
        })
    }

    pub fn version(&self) -> Result<VersionResponse, tonic::Status> {
        self.call(
            "Version",
            VersionRequest {
                version: "v1".into(),
            },
        )
    }

    /// The new pod's sandbox id.
    pub fn run_pod_sandbox(
        &self,
        config: &PodSandboxConfig,
        handler: &str,
    ) -> Result<String, tonic::Status> {
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        };
        let answer: RunPodSandboxResponse = self.call("RunPodSandbox", request)?;
        Ok(answer.pod_sandbox_id)
    }

    /// Stops every container of the pod and its sandbox.
    pub fn stop_pod_sandbox(&self, id: &str) -> Result<(), tonic::Status> {
        let request = PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        self.call::<_, Empty>("StopPodSandbox", request).map(drop)
    }

    pub fn remove_pod_sandbox(&self, id: &str) -> Result<(), tonic::Status> {
        let request = PodSandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        self.call::<_, Empty>("RemovePodSandbox", request).map(drop)
    }

    /// The new container's id.
    pub fn create_container(
        &self,
        sandbox: &str,
        config: ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String, tonic::Status> {
        let request = CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let answer: CreateContainerResponse = self.call("CreateContainer", request)?;
        Ok(answer.container_id)
    }

    pub fn start_container(&self, id: &str) -> Result<(), tonic::Status> {
        let request = StartContainerRequest {
            container_id: id.into(),
        };
        self.call::<_, Empty>("StartContainer", request).map(drop)
    }

    /// `cmd` run in the container as `kubectl exec` runs it.
    pub fn exec_sync(&self, id: &str, cmd: &[&str]) -> Result<ExecSyncResponse, tonic::Status> {
        let request = ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: CALL_TIMEOUT.as_secs() as i64,
        };
        self.call("ExecSync", request)
    }
}
