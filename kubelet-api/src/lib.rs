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

#[cfg(test)]
mod tests {
    use super::deviceplugin::*;
    use super::podresources::*;
    use prost::Message;

    /// The first byte of a field on the wire: its number and wire type (0 varint, 2 bytes).
    fn key(field: u8, wire: u8) -> u8 {
        (field << 3) | wire
    }

    #[test]
    fn fields_go_on_the_wire_under_the_apis_numbers() {
        let device = Device {
            id: "GPU-1".into(),
            health: super::HEALTHY.into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        };
        let bytes = device.encode_to_vec();
        assert_eq!(bytes[0], key(1, 2));
        assert_eq!(&bytes[2..7], b"GPU-1");
        assert_eq!(bytes[7], key(2, 2));
        assert_eq!(bytes[bytes.len() - 6], key(3, 2));

        let ask = ContainerPreferredAllocationRequest {
            available_device_ids: vec![],
            must_include_device_ids: vec!["m".into()],
            allocation_size: 2,
        };
        assert_eq!(ask.encode_to_vec(), [key(2, 2), 1, b'm', key(3, 0), 2]);

        let cdi = ContainerAllocateResponse {
            cdi_devices: vec![CdiDevice { name: "x".into() }],
            ..Default::default()
        };
        assert_eq!(cdi.encode_to_vec(), [key(5, 2), 3, key(1, 2), 1, b'x']);

        let options = RegisterRequest {
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
            ..Default::default()
        };
        assert_eq!(options.encode_to_vec(), [key(4, 2), 2, key(2, 0), 1]);
    }

    #[test]
    fn pod_resources_decode_the_fields_gpupin_reads_and_skip_the_rest() {
        // A container with a device list (field 2) and CPU ids (field 3, skipped).
        let devices = ContainerDevices {
            resource_name: "r".into(),
            device_ids: vec!["d".into()],
        }
        .encode_to_vec();
        let mut container = vec![key(1, 2), 1, b'c', key(2, 2), devices.len() as u8];
        container.extend(&devices);
        container.extend([key(3, 2), 1, 7]);
        let decoded = ContainerResources::decode(&container[..]).unwrap();
        assert_eq!(decoded.name, "c");
        assert_eq!(decoded.devices[0].device_ids, ["d"]);
    }
}
