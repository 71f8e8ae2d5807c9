//! Device plugin API `v1beta1`: the messages, by their documented names and field numbers,
//! and the generated services.

use std::collections::HashMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// What the plugin tells the kubelet it implements.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DevicePluginOptions {
    #[prost(bool, tag = "1")]
    pub pre_start_required: bool,
    #[prost(bool, tag = "2")]
    pub get_preferred_allocation_available: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegisterRequest {
    /// `v1beta1`.
    #[prost(string, tag = "1")]
    pub version: String,
    /// The plugin's socket: a file name in the kubelet's device-plugins directory.
    #[prost(string, tag = "2")]
    pub endpoint: String,
    /// `vendor-domain/resource`, as pods ask for it in their limits.
    #[prost(string, tag = "3")]
    pub resource_name: String,
    #[prost(message, optional, tag = "4")]
    pub options: Option<DevicePluginOptions>,
}

/// Every device of the resource, sent again whenever one changes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListAndWatchResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

/// `NUMANode` in the API.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Device {
    /// `ID` in the API.
    #[prost(string, tag = "1")]
    pub id: String,
    /// `Healthy` or `Unhealthy` (`crate::HEALTHY`, `crate::UNHEALTHY`).
    #[prost(string, tag = "2")]
    pub health: String,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerRequest {
    /// `devicesIDs` in the API.
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreStartContainerResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerPreferredAllocationRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationRequest {
    /// `available_deviceIDs`: what the kubelet may give this container.
    #[prost(string, repeated, tag = "1")]
    pub available_device_ids: Vec<String>,
    /// `must_include_deviceIDs`: what it gives in any case (a subset of the available).
    #[prost(string, repeated, tag = "2")]
    pub must_include_device_ids: Vec<String>,
    #[prost(int32, tag = "3")]
    pub allocation_size: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PreferredAllocationResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerPreferredAllocationResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerPreferredAllocationResponse {
    /// `deviceIDs` in the API.
    #[prost(string, repeated, tag = "1")]
    pub device_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateRequest {
    #[prost(message, repeated, tag = "1")]
    pub container_requests: Vec<ContainerAllocateRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateRequest {
    /// `devicesIDs` in the API: the devices the kubelet chose for one container.
    #[prost(string, repeated, tag = "1")]
    pub devices_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocateResponse {
    #[prost(message, repeated, tag = "1")]
    pub container_responses: Vec<ContainerAllocateResponse>,
}

/// What the runtime must give one container.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerAllocateResponse {
    #[prost(map = "string, string", tag = "1")]
    pub envs: HashMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    pub mounts: Vec<Mount>,
    #[prost(message, repeated, tag = "3")]
    pub devices: Vec<DeviceSpec>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
    #[prost(message, repeated, tag = "5")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub read_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceSpec {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    /// cgroup permissions: any of `r`, `w`, `m`.
    #[prost(string, tag = "3")]
    pub permissions: String,
}

/// `CDIDevice` in the API.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CdiDevice {
    /// A fully qualified CDI device name: `nvidia.com/gpu=GPU-...`.
    #[prost(string, tag = "1")]
    pub name: String,
}

include!(concat!(env!("OUT_DIR"), "/v1beta1.Registration.rs"));
include!(concat!(env!("OUT_DIR"), "/v1beta1.DevicePlugin.rs"));
