//! The kubelet's gRPC APIs that `gpupin device-plugin` speaks, over Unix sockets:
//! - device plugins, `v1beta1` ([`deviceplugin`]): the kubelet serves `Registration` on
//!   `/var/lib/kubelet/device-plugins/kubelet.sock`; a plugin serves `DevicePlugin` on a
//!   socket of its own in the same directory and registers its file name;
//! - pod resources, `v1` ([`podresources`]): the kubelet serves `PodResourcesLister` on
//!   `/var/lib/kubelet/pod-resources/kubelet.sock`, which says which devices each running
//!   container holds.
//!
//! Each module has the messages (prost) and, under `registration`, `device_plugin` and
//! `pod_resources_lister`, the client and server tonic generates for the service.

pub mod deviceplugin;
pub mod podresources;

/// The device plugin API version a plugin registers with.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";

/// `Device::health` of a device a pod may be given.
pub const HEALTHY: &str = "Healthy";
/// `Device::health` of a device the kubelet must not count as allocatable.
pub const UNHEALTHY: &str = "Unhealthy";
