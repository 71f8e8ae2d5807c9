//! The environment that tells a job which GPUs are its own.

use crate::input::config::CudaIds;
use crate::model::gpu::Inventory;
use crate::model::nvidia::VISIBLE_DEVICES;
use crate::state::ledger::Record;

/// The holder id of the job, for scripts that want to name it (`gpupin release`,
/// `gpupin exec --within`).
pub(super) const HOLDER_ENV: &str = "GPUPIN_HOLDER";

/// CUDA_VISIBLE_DEVICES (indices in PCI bus order with CUDA_DEVICE_ORDER=PCI_BUS_ID, since
/// CUDA's default fastest-first order is not nvidia-smi's; or UUIDs), NVIDIA_VISIBLE_DEVICES
/// (UUIDs, for NVIDIA's container tools a job may run) and GPUPIN_HOLDER.
pub(crate) fn job_env(
    inventory: &Inventory,
    record: &Record,
    ids: CudaIds,
) -> Vec<(String, String)> {
    let mut gpus: Vec<_> = record
        .gpus
        .iter()
        .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
        .collect();
    gpus.sort_by_key(|g| g.index);
    // MIG instances by their UUID whatever `ids` says: CUDA has no index for them.
    let mut instances: Vec<_> = inventory
        .mig_instances()
        .filter(|m| record.gpus.contains(&m.uuid))
        .collect();
    instances.sort_by_key(|m| (m.parent_index, m.index));
    let cuda: Vec<String> = gpus
        .iter()
        .map(|g| match ids {
            CudaIds::Index => g.index.to_string(),
            CudaIds::Uuid => g.uuid.clone(),
        })
        .chain(instances.iter().map(|m| m.uuid.clone()))
        .collect();
    let uuids: Vec<&str> = gpus
        .iter()
        .map(|g| g.uuid.as_str())
        .chain(instances.iter().map(|m| m.uuid.as_str()))
        .collect();
    vec![
        ("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()),
        ("CUDA_VISIBLE_DEVICES".into(), cuda.join(",")),
        (VISIBLE_DEVICES.into(), uuids.join(",")),
        (HOLDER_ENV.into(), record.id.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::model::holder::HolderId;
    use crate::policy::testing::machine;
    use crate::state::ledger::{HolderMeta, Ledger, Machine};

    #[test]
    fn indices_in_bus_order_or_uuids() {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&crate::input::config::LedgerSettings::at(tmp.path())).unwrap();
        let inv = machine(8);
        let request = GpuRequest::new(
            Selection::Devices(vec!["5".into(), "2".into()]),
            Origin::Cli,
        );
        let record = ledger
            .allocate(
                &HolderId::new("j1").unwrap(),
                &request,
                &Machine::new(&inv, PolicyName::Pack),
                HolderMeta::default(),
            )
            .unwrap()
            .record;
        let env = job_env(&inv, &record, CudaIds::Index);
        assert_eq!(
            env,
            [
                ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
                ("CUDA_VISIBLE_DEVICES".into(), "2,5".into()),
                (
                    "NVIDIA_VISIBLE_DEVICES".into(),
                    "GPU-test-2,GPU-test-5".into()
                ),
                ("GPUPIN_HOLDER".into(), "j1".into()),
            ]
        );
        let env = job_env(&inv, &record, CudaIds::Uuid);
        assert_eq!(env[1].1, "GPU-test-2,GPU-test-5");
    }

    #[test]
    fn a_mig_instance_is_named_by_its_uuid() {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&crate::input::config::LedgerSettings::at(tmp.path())).unwrap();
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let request = GpuRequest::new(
            Selection::Devices(vec!["0:1".into(), "3".into()]),
            Origin::Cli,
        );
        let record = ledger
            .allocate(
                &HolderId::new("j1").unwrap(),
                &request,
                &Machine::new(&inv, PolicyName::Pack),
                HolderMeta::default(),
            )
            .unwrap()
            .record;
        let mig = inv.find_mig("0:1").unwrap().uuid.clone();
        let env = job_env(&inv, &record, CudaIds::Index);
        assert_eq!(env[1].1, format!("3,{mig}"));
        assert_eq!(env[2].1, format!("{},{mig}", inv.gpus[3].uuid));
    }
}
