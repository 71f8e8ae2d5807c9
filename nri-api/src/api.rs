//! NRI's messages (`nri.pkg.api.v1alpha1`), those gpupin sends or reads: field names
//! and numbers as NRI's API documents them. prost skips the fields a newer runtime sends
//! that are not here.

use prost::Message;
use std::collections::HashMap;

/// The service a plugin calls on the runtime (on `RUNTIME_CONN`).
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The service a plugin serves to the runtime (on `PLUGIN_CONN`).
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// NRI's `Event` values; a plugin subscribes to event `e` with bit `1 << (e - 1)` of
/// `ConfigureResponse::events`.
pub mod event {
    pub const RUN_POD_SANDBOX: i32 = 1;
    pub const STOP_POD_SANDBOX: i32 = 2;
    pub const REMOVE_POD_SANDBOX: i32 = 3;
    pub const CREATE_CONTAINER: i32 = 4;
    pub const POST_CREATE_CONTAINER: i32 = 5;
    pub const START_CONTAINER: i32 = 6;
    pub const POST_START_CONTAINER: i32 = 7;
    pub const UPDATE_CONTAINER: i32 = 8;
    pub const POST_UPDATE_CONTAINER: i32 = 9;
    pub const STOP_CONTAINER: i32 = 10;
    pub const REMOVE_CONTAINER: i32 = 11;

    /// The mask bit of `event`.
    pub const fn bit(event: i32) -> i32 {
        1 << (event - 1)
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct RegisterPluginRequest {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    /// Two digits: plugins are called in this order, lowest first.
    #[prost(string, tag = "2")]
    pub plugin_idx: String,
    #[prost(string, tag = "3")]
    pub nri_version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, Message)]
pub struct ConfigureRequest {
    #[prost(string, tag = "1")]
    pub config: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// Milliseconds.
    #[prost(int64, tag = "4")]
    pub registration_timeout: i64,
    /// Milliseconds.
    #[prost(int64, tag = "5")]
    pub request_timeout: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ConfigureResponse {
    /// The events wanted (`event::bit`); 0 would mean all.
    #[prost(int32, tag = "2")]
    pub events: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct SynchronizeRequest {
    #[prost(message, repeated, tag = "1")]
    pub pods: Vec<PodSandbox>,
    #[prost(message, repeated, tag = "2")]
    pub containers: Vec<Container>,
    /// More of the same follows (a split synchronization): answer with `more` and no update.
    #[prost(bool, tag = "3")]
    pub more: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct SynchronizeResponse {
    #[prost(message, repeated, tag = "1")]
    pub update: Vec<ContainerUpdate>,
    #[prost(bool, tag = "2")]
    pub more: bool,
}

/// `CreateContainerRequest`, and every other request that names a pod and a container
/// (`StopContainer`, `RemoveContainer`, `StartContainer`, ...): the same fields.
#[derive(Clone, PartialEq, Message)]
pub struct ContainerRequest {
    #[prost(message, optional, tag = "1")]
    pub pod: Option<PodSandbox>,
    #[prost(message, optional, tag = "2")]
    pub container: Option<Container>,
}

#[derive(Clone, PartialEq, Message)]
pub struct CreateContainerResponse {
    #[prost(message, optional, tag = "1")]
    pub adjust: Option<ContainerAdjustment>,
    #[prost(message, repeated, tag = "2")]
    pub update: Vec<ContainerUpdate>,
    #[prost(message, repeated, tag = "3")]
    pub evict: Vec<ContainerEviction>,
}

#[derive(Clone, PartialEq, Message)]
pub struct StopContainerResponse {
    #[prost(message, repeated, tag = "1")]
    pub update: Vec<ContainerUpdate>,
}

#[derive(Clone, PartialEq, Message)]
pub struct StateChangeEvent {
    #[prost(int32, tag = "1")]
    pub event: i32,
    #[prost(message, optional, tag = "2")]
    pub pod: Option<PodSandbox>,
    #[prost(message, optional, tag = "3")]
    pub container: Option<Container>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub uid: String,
    #[prost(string, tag = "4")]
    pub namespace: String,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub annotations: HashMap<String, String>,
    #[prost(string, tag = "7")]
    pub runtime_handler: String,
    #[prost(uint32, tag = "9")]
    pub pid: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(int32, tag = "4")]
    pub state: i32,
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "6")]
    pub annotations: HashMap<String, String>,
    #[prost(string, repeated, tag = "7")]
    pub args: Vec<String>,
    /// `KEY=VALUE`.
    #[prost(string, repeated, tag = "8")]
    pub env: Vec<String>,
    #[prost(message, optional, tag = "11")]
    pub linux: Option<LinuxContainer>,
    #[prost(uint32, tag = "12")]
    pub pid: u32,
    #[prost(message, repeated, tag = "20")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxContainer {
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<LinuxDevice>,
    #[prost(string, tag = "5")]
    pub cgroups_path: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxDevice {
    /// The path in the container; `-` before it removes that device.
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(string, tag = "2")]
    pub r#type: String,
    #[prost(int64, tag = "3")]
    pub major: i64,
    #[prost(int64, tag = "4")]
    pub minor: i64,
    #[prost(message, optional, tag = "5")]
    pub file_mode: Option<OptionalFileMode>,
    #[prost(message, optional, tag = "6")]
    pub uid: Option<OptionalUInt32>,
    #[prost(message, optional, tag = "7")]
    pub gid: Option<OptionalUInt32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OptionalFileMode {
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct OptionalUInt32 {
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct OptionalInt64 {
    #[prost(int64, tag = "1")]
    pub value: i64,
}

/// What a plugin changes in a container being created. (NRI numbers it from 2.)
#[derive(Clone, PartialEq, Message)]
pub struct ContainerAdjustment {
    /// `-KEY` removes.
    #[prost(map = "string, string", tag = "2")]
    pub annotations: HashMap<String, String>,
    #[prost(message, repeated, tag = "3")]
    pub mounts: Vec<Mount>,
    /// `-NAME` as the key removes.
    #[prost(message, repeated, tag = "4")]
    pub env: Vec<KeyValue>,
    #[prost(message, optional, tag = "5")]
    pub hooks: Option<Hooks>,
    #[prost(message, optional, tag = "6")]
    pub linux: Option<LinuxContainerAdjustment>,
    #[prost(message, repeated, tag = "8")]
    pub cdi_devices: Vec<CdiDevice>,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub destination: String,
    #[prost(string, tag = "2")]
    pub r#type: String,
    #[prost(string, tag = "3")]
    pub source: String,
    #[prost(string, repeated, tag = "4")]
    pub options: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Hooks {
    #[prost(message, repeated, tag = "1")]
    pub prestart: Vec<Hook>,
    #[prost(message, repeated, tag = "2")]
    pub create_runtime: Vec<Hook>,
    #[prost(message, repeated, tag = "3")]
    pub create_container: Vec<Hook>,
    #[prost(message, repeated, tag = "4")]
    pub start_container: Vec<Hook>,
    #[prost(message, repeated, tag = "5")]
    pub poststart: Vec<Hook>,
    #[prost(message, repeated, tag = "6")]
    pub poststop: Vec<Hook>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Hook {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(string, repeated, tag = "2")]
    pub args: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub env: Vec<String>,
    #[prost(message, optional, tag = "4")]
    pub timeout: Option<OptionalInt64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxContainerAdjustment {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<LinuxDevice>,
    #[prost(message, optional, tag = "2")]
    pub resources: Option<LinuxResources>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxResources {
    #[prost(message, repeated, tag = "7")]
    pub devices: Vec<LinuxDeviceCgroup>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxDeviceCgroup {
    #[prost(bool, tag = "1")]
    pub allow: bool,
    #[prost(string, tag = "2")]
    pub r#type: String,
    /// Absent: any.
    #[prost(message, optional, tag = "3")]
    pub major: Option<OptionalInt64>,
    #[prost(message, optional, tag = "4")]
    pub minor: Option<OptionalInt64>,
    #[prost(string, tag = "5")]
    pub access: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct CdiDevice {
    /// Fully qualified: `vendor.com/class=name`.
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerUpdate {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(bool, tag = "3")]
    pub ignore_failure: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct ContainerEviction {
    #[prost(string, tag = "1")]
    pub container_id: String,
    #[prost(string, tag = "2")]
    pub reason: String,
}
