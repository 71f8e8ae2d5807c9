//! NRI's plugin protocol as `gpupin nri` speaks it: the messages of
//! `nri.pkg.api.v1alpha1` it sends and reads ([`api`]), and ttrpc over NRI's multiplexed
//! socket ([`wire`]). A plugin dials the runtime's socket (default
//! `/var/run/nri/nri.sock`), registers on connection 2, and answers the runtime's calls
//! (Configure, Synchronize, the container events) on connection 1.

pub mod api;
pub mod wire;

/// Where containerd 2.x and CRI-O listen for NRI plugins unless configured otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";

#[cfg(test)]
mod tests {
    use super::api::*;
    use prost::Message;

    fn key(field: u8, wire: u8) -> u8 {
        (field << 3) | wire
    }

    #[test]
    fn fields_go_on_the_wire_under_nris_numbers() {
        let configured = ConfigureResponse { events: 8 };
        assert_eq!(configured.encode_to_vec(), [key(2, 0), 8]);
        let adjust = ContainerAdjustment {
            env: vec![KeyValue {
                key: "A".into(),
                value: "1".into(),
            }],
            ..Default::default()
        };
        assert_eq!(
            adjust.encode_to_vec(),
            [key(4, 2), 6, key(1, 2), 1, b'A', key(2, 2), 1, b'1']
        );
        let device = LinuxDevice {
            path: "/d".into(),
            r#type: "c".into(),
            major: 195,
            minor: 0,
            file_mode: Some(OptionalFileMode { value: 0o666 }),
            uid: None,
            gid: None,
        };
        let bytes = device.encode_to_vec();
        assert_eq!(&bytes[..4], [key(1, 2), 2, b'/', b'd']);
        assert_eq!(&bytes[4..7], [key(2, 2), 1, b'c']);
        assert_eq!(&bytes[7..10], [key(3, 0), 195, 1]);
        // A present zero is a present wrapper: minor 0 itself is left out.
        assert_eq!(&bytes[10..], [key(5, 2), 3, key(1, 0), 0xb6, 0x03]);
        let cdi = Container {
            cdi_devices: vec![CdiDevice { name: "x".into() }],
            ..Default::default()
        };
        assert_eq!(cdi.encode_to_vec(), [key(20, 2), 1, 3, key(1, 2), 1, b'x']);
        assert_eq!(event::bit(event::CREATE_CONTAINER), 0x8);
        assert_eq!(event::bit(event::REMOVE_CONTAINER), 0x400);
    }
}
