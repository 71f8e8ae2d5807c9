//! `Allocate`: the kubelet has chosen a container's GPUs; the plugin records them in the
//! ledger as one holder and says what the runtime must give the container.
//!
//! - The record: a hold until released, `k8s-<digest of the sorted UUIDs>`, source
//!   `device-plugin`, engine `kubernetes`. The same GPUs asked again (a retried
//!   `Allocate`) get the same holder back. A GPU that a holder outside Kubernetes took
//!   since the kubelet's last `ListAndWatch` fails the call, naming that holder. A plugin
//!   holder of other GPUs overlapping these is released first: the kubelet gives a GPU
//!   again only once its pod is gone, so that holder is one the reconcile has not
//!   reached yet.
//! - The container: the device nodes (`/dev/nvidia<minor>` and the control nodes), or
//!   with `driver = "cdi"` the GPUs' CDI names (the runtime applies the spec); env
//!   `NVIDIA_VISIBLE_DEVICES` (the UUIDs; `void` under CDI, whose edits bring the
//!   driver); and the holder as `gpupin.within` (annotation) and `GPUPIN_WITHIN` (env),
//!   so that a container that also goes through gpupin's hook or runtime takes exactly
//!   these GPUs, nested in the holder, and no others.

use super::{ENGINE, HOLDER_PREFIX, KubeError, SOURCE, is_plugin_holder, known_uuids};
use crate::admission::edits::ContainerEdits;
use crate::admission::grant;
use crate::input::config::Config;
use crate::input::config::Driver;
use crate::input::request::{GpuRequest, Key, Origin, Selection};
use crate::model::gpu::{DeviceNode, Inventory};
use crate::model::holder::{ContainerInfo, HolderId, HolderKind};
use crate::model::nvidia::VISIBLE_DEVICES;
use crate::state::ledger::HolderMeta;
use sha2::{Digest, Sha256};

/// What one container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub holder: String,
    /// UUIDs, in the record's order.
    pub gpus: Vec<String>,
    /// Device nodes to create, the same path inside as on the host; none under CDI.
    pub nodes: Vec<DeviceNode>,
    pub env: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    /// Fully qualified CDI device names (`driver = "cdi"` only).
    pub cdi_devices: Vec<String>,
}

/// The plugin's holder id for a container given `uuids`: the same set, the same id.
pub fn holder_for(uuids: &[String]) -> HolderId {
    let mut sorted: Vec<&str> = uuids.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let digest = Sha256::digest(sorted.join(",").as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    HolderId::new(&format!("{HOLDER_PREFIX}{hex}")).expect("prefix and hex make a valid id")
}

/// Records `device_ids` (GPU UUIDs the kubelet chose) for one container.
pub fn allocate(
    config: &Config,
    inventory: &Inventory,
    device_ids: &[String],
) -> Result<Granted, KubeError> {
    if device_ids.is_empty() {
        return Err(KubeError::NoDevices);
    }
    for id in device_ids {
        // Whole GPUs (not in MIG mode) and MIG instances: what `devices` advertises.
        let known = inventory
            .gpus
            .iter()
            .any(|g| &g.uuid == id && !g.in_mig_mode())
            || inventory.mig_instances().any(|m| &m.uuid == id);
        if !known {
            return Err(KubeError::UnknownDevice {
                id: id.clone(),
                known: known_uuids(inventory),
            });
        }
    }
    // Before anything is recorded: a container must not get GPUs without its driver.
    let cdi_devices = match config.driver {
        Driver::Cdi => {
            crate::admission::driver::cdi_names(&config.cdi_spec_dirs, inventory, device_ids)?
        }
        Driver::Auto | Driver::None => Vec::new(),
    };
    let holder = holder_for(device_ids);
    release_overlapping(config, &holder, device_ids)?;
    let request = GpuRequest::new(Selection::Devices(device_ids.to_vec()), Origin::Cli);
    let meta = HolderMeta {
        source: SOURCE.to_string(),
        kind: HolderKind::Hold,
        until_release: true,
        container: Some(ContainerInfo {
            engine: Some(ENGINE.to_string()),
            ..ContainerInfo::default()
        }),
        ..HolderMeta::default()
    };
    let (_, record) = grant::allocate(config, &holder, &request, meta)?;
    // The container's way into its own GPUs (a nested request, gpupin exec inside the
    // pod): the holder and its key, which no pod spec can know.
    let within = match crate::state::open_ledger(config)?.key(&holder)? {
        Some((_, key)) => format!("{holder}:{key}"),
        None => holder.to_string(),
    };
    // What a container holding the record gets, as for any container.
    let mut edits = ContainerEdits::gpus_of(inventory, &record);
    if !cdi_devices.is_empty() {
        // The CDI spec's edits bring the nodes and the driver; NVIDIA's hook, which reads
        // the env, must not give the GPUs a second time.
        edits.nodes.clear();
        for (key, value) in &mut edits.env {
            if key == VISIBLE_DEVICES {
                *value = "void".to_string();
            }
        }
    }
    edits
        .env
        .push((Key::Within.env().to_string(), within.clone()));
    Ok(Granted {
        holder: holder.to_string(),
        nodes: edits.nodes,
        env: edits.env,
        annotations: vec![(Key::Within.as_str().to_string(), within)],
        cdi_devices,
        gpus: record.gpus,
    })
}

/// Releases the plugin's holders, other than `holder`, that hold any of `uuids`.
fn release_overlapping(
    config: &Config,
    holder: &HolderId,
    uuids: &[String],
) -> Result<(), KubeError> {
    let ledger = crate::state::open_ledger(config)?;
    for record in ledger.records()? {
        let overlaps = record.gpus.iter().any(|g| uuids.contains(g));
        if overlaps && record.id != holder.as_str() && is_plugin_holder(&record) {
            let id = HolderId::new(&record.id).map_err(crate::state::ledger::LedgerError::from)?;
            ledger.release(&id)?;
            tracing::info!(
                holder = %record.id,
                gpus = ?record.gpus,
                "released: the kubelet gives its GPUs to another container"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::input::config::testing::sim8_in as config;

    fn sim(config: &Config) -> Inventory {
        config.load_inventory().unwrap()
    }

    #[test]
    fn the_same_gpus_make_the_same_holder_in_any_order() {
        let a = holder_for(&["GPU-b".into(), "GPU-a".into()]);
        assert_eq!(a, holder_for(&["GPU-a".into(), "GPU-b".into()]));
        assert_ne!(a, holder_for(&["GPU-a".into()]));
        assert!(
            a.as_str().starts_with("k8s-") && a.as_str().len() == 4 + 16,
            "{a}"
        );
    }

    #[test]
    fn allocate_records_a_hold_and_returns_nodes_env_and_within() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let inv = sim(&config);
        let ids = vec![inv.gpus[3].uuid.clone(), inv.gpus[1].uuid.clone()];
        let granted = allocate(&config, &inv, &ids).unwrap();
        let records = crate::state::open_ledger(&config)
            .unwrap()
            .records()
            .unwrap();
        assert_eq!(records.len(), 1);
        let r = &records[0];
        assert_eq!(r.id, granted.holder);
        assert!(is_plugin_holder(r) && r.until_release && r.pid.is_none());
        assert_eq!(
            r.container.as_ref().unwrap().engine.as_deref(),
            Some("kubernetes")
        );
        let paths: Vec<&str> = granted.nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(&paths[..2], ["/dev/nvidia1", "/dev/nvidia3"]);
        assert!(paths.contains(&"/dev/nvidiactl"), "{paths:?}");
        let visible = format!("{},{}", inv.gpus[1].uuid, inv.gpus[3].uuid);
        assert!(granted.env.contains(&(VISIBLE_DEVICES.into(), visible)));
        // The holder with its key: a pod spec that names the holder alone gets nothing.
        let holder = HolderId::new(&granted.holder).unwrap();
        let (_, key) = crate::state::open_ledger(&config)
            .unwrap()
            .key(&holder)
            .unwrap()
            .unwrap();
        let within = format!("{}:{key}", granted.holder);
        assert!(
            granted
                .env
                .contains(&(Key::Within.env().into(), within.clone()))
        );
        assert_eq!(
            granted.annotations,
            [(Key::Within.as_str().to_string(), within)]
        );
        assert!(granted.cdi_devices.is_empty());
        // A retried Allocate: the same holder, nothing new.
        assert_eq!(allocate(&config, &inv, &ids).unwrap(), granted);
    }

    #[test]
    fn allocate_of_a_mig_instance_returns_its_capability_nodes() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            inventory: "sim:dgxa100mig".parse().unwrap(),
            ..config(tmp.path())
        };
        let inv = sim(&config);
        let instance = inv.find_mig("0:2").unwrap();
        let granted = allocate(&config, &inv, std::slice::from_ref(&instance.uuid)).unwrap();
        let paths: Vec<&str> = granted.nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            &paths[..3],
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap84",
                "/dev/nvidia-caps/nvidia-cap85"
            ]
        );
        assert!(
            granted
                .env
                .contains(&(VISIBLE_DEVICES.into(), instance.uuid.clone()))
        );
        // GPU 0 itself is in MIG mode: the kubelet cannot be given it whole.
        let err = allocate(&config, &inv, std::slice::from_ref(&inv.gpus[0].uuid))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("unknown device id"), "{err}");
    }

    #[test]
    fn a_gpu_taken_outside_kubernetes_fails_the_call_naming_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let inv = sim(&config);
        crate::jobs::hold::testing::roots(&config, "maintenance", "2");
        let err = allocate(&config, &inv, &[inv.gpus[2].uuid.clone()]).unwrap_err();
        let line = crate::base::message::one_line(&err);
        assert!(
            line.contains("GPU 2") && line.contains("held by maintenance"),
            "{line}"
        );
    }

    #[test]
    fn the_kubelets_new_choice_releases_an_overlapping_plugin_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let inv = sim(&config);
        let old = allocate(
            &config,
            &inv,
            &[inv.gpus[0].uuid.clone(), inv.gpus[1].uuid.clone()],
        )
        .unwrap();
        let new = allocate(&config, &inv, &[inv.gpus[1].uuid.clone()]).unwrap();
        let ids: Vec<String> = crate::state::open_ledger(&config)
            .unwrap()
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, [new.holder]);
        assert_ne!(old.holder, ids[0]);
    }

    #[test]
    fn unknown_or_no_devices_are_refused_before_anything_is_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let inv = sim(&config);
        let err = allocate(&config, &inv, &["GPU-nope".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("unknown device id \"GPU-nope\": expected the UUID"),
            "{err}"
        );
        let err = allocate(&config, &inv, &[]).unwrap_err().to_string();
        assert!(err.contains("no devices"), "{err}");
        assert!(
            crate::state::open_ledger(&config)
                .unwrap()
                .records()
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn under_cdi_the_container_gets_cdi_names_and_no_nodes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = config(tmp.path());
        let inv = sim(&config);
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        let uuid = &inv.gpus[4].uuid;
        std::fs::write(
            dir.join("nvidia.yaml"),
            format!(
                "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: {uuid}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia4\n"
            ),
        )
        .unwrap();
        config.driver = Driver::Cdi;
        config.cdi_spec_dirs = vec![dir.clone()];
        let granted = allocate(&config, &inv, std::slice::from_ref(uuid)).unwrap();
        assert_eq!(granted.cdi_devices, [format!("nvidia.com/gpu={uuid}")]);
        assert!(granted.nodes.is_empty());
        assert!(
            granted
                .env
                .contains(&(VISIBLE_DEVICES.into(), "void".into()))
        );
        // A GPU without an entry: refused, nothing recorded for it.
        let err = allocate(&config, &inv, &[inv.gpus[5].uuid.clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no entry for GPU 5"), "{err}");
    }
}
