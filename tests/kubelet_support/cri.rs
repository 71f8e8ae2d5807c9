//! What the kubelet's pods are, read from the CRI (no API server takes their status):
//! `ListPodSandbox` and `ListContainers`, messages as prost derives written from the API's
//! documented names and field numbers (k8s.io/cri-api, api.proto), the fields read here.

use crate::cri_support::Cri;
use std::collections::HashMap;

/// The label the kubelet puts on each sandbox and container: the pod's name.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// The label the kubelet puts on each container: its name in the pod spec.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    /// 0: SANDBOX_READY, 1: SANDBOX_NOTREADY.
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    /// 0: CREATED, 1: RUNNING, 2: EXITED, 3: UNKNOWN.
    #[prost(int32, tag = "6")]
    pub state: i32,
    #[prost(map = "string, string", tag = "8")]
    pub labels: HashMap<String, String>,
}

pub const CONTAINER_RUNNING: i32 = 1;
pub const SANDBOX_READY: i32 = 0;

pub fn sandboxes(cri: &Cri) -> Vec<PodSandbox> {
    let answer: ListPodSandboxResponse = cri
        .call("ListPodSandbox", ListPodSandboxRequest {})
        .unwrap_or_else(|e| panic!("ListPodSandbox: {e}"));
    answer.items
}

pub fn containers(cri: &Cri) -> Vec<Container> {
    let answer: ListContainersResponse = cri
        .call("ListContainers", ListContainersRequest {})
        .unwrap_or_else(|e| panic!("ListContainers: {e}"));
    answer.containers
}

/// The containers of pod `pod` (its full name, `NAME-NODE` for a static pod), any state.
pub fn containers_of(cri: &Cri, pod: &str) -> Vec<Container> {
    containers(cri)
        .into_iter()
        .filter(|c| c.labels.get(POD_NAME).is_some_and(|p| p == pod))
        .collect()
}
