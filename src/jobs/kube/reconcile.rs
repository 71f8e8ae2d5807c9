//! Releasing what the kubelet no longer assigns: the PodResources API's `List` says which
//! devices each running container holds; a plugin holder none of whose GPUs any container
//! holds belonged to a pod that is gone, and is released.
//!
//! A holder younger than the grace is kept whatever `List` says: the kubelet records a
//! container's devices only after `Allocate` returns, so a `List` in between does not
//! show them yet. Nobody else's holders are ever touched, and a failed `List` releases
//! nothing (the caller does not get here).

use super::is_plugin_holder;
use crate::model::holder::HolderId;
use crate::state::ledger::{Ledger, LedgerError, Record};
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

/// The ids of the plugin's holders in `records` to release, given the device ids pods
/// hold (`assigned`) at `now`.
pub fn unassigned<'r>(
    records: &'r [Record],
    assigned: &BTreeSet<String>,
    now: SystemTime,
    grace: Duration,
) -> Vec<&'r Record> {
    records
        .iter()
        .filter(|r| is_plugin_holder(r))
        .filter(|r| !r.gpus.iter().any(|g| assigned.contains(g)))
        .filter(|r| {
            now.duration_since(r.created())
                .is_ok_and(|age| age >= grace)
        })
        .collect()
}

/// Releases the plugin's holders whose GPUs no pod holds; returns their records.
pub fn release_unassigned(
    ledger: &Ledger,
    assigned: &BTreeSet<String>,
    grace: Duration,
) -> Result<Vec<Record>, LedgerError> {
    let records = ledger.records()?;
    let mut released = Vec::new();
    for record in unassigned(&records, assigned, SystemTime::now(), grace) {
        if let Some(gone) = ledger.release(&HolderId::new(&record.id)?)? {
            tracing::info!(
                holder = %gone.id,
                gpus = ?gone.gpus,
                "released: no pod holds its GPUs any more"
            );
            released.push(gone);
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::kube::testing::record;

    fn ids(records: Vec<&Record>) -> Vec<&str> {
        records.iter().map(|r| r.id.as_str()).collect()
    }

    #[test]
    fn plugin_holders_whose_gpus_no_pod_holds_are_released() {
        let records = [
            record("k8s-a", &["A", "B"]),
            record("k8s-b", &["C"]),
            record("docker-1", &["D"]),
        ];
        let assigned: BTreeSet<String> = ["B".to_string()].into();
        let now = SystemTime::now();
        assert_eq!(
            ids(unassigned(&records, &assigned, now, Duration::ZERO)),
            ["k8s-b"]
        );
        assert_eq!(
            ids(unassigned(&records, &BTreeSet::new(), now, Duration::ZERO)),
            ["k8s-a", "k8s-b"]
        );
    }

    #[test]
    fn holders_younger_than_the_grace_are_kept() {
        let records = [record("k8s-a", &["A"])];
        let now = records[0].created();
        let grace = Duration::from_secs(30);
        assert!(unassigned(&records, &BTreeSet::new(), now, grace).is_empty());
        let later = now + grace;
        assert_eq!(
            ids(unassigned(&records, &BTreeSet::new(), later, grace)),
            ["k8s-a"]
        );
    }

    #[test]
    fn release_unassigned_removes_the_records_and_audits_them() {
        let tmp = tempfile::tempdir().unwrap();
        let config = crate::input::config::Config {
            state_dir: tmp.path().join("state"),
            inventory: "sim:nvswitch8".parse().unwrap(),
            audit_log: tmp.path().join("audit.log"),
            ..crate::input::config::Config::default()
        };
        let inv = crate::host::inventory::load(&config.inventory, &config.state_dir, &config.nvml)
            .unwrap();
        let kept =
            crate::jobs::kube::allocate::allocate(&config, &inv, &[inv.gpus[0].uuid.clone()])
                .unwrap();
        let gone =
            crate::jobs::kube::allocate::allocate(&config, &inv, &[inv.gpus[1].uuid.clone()])
                .unwrap();
        let ledger = crate::state::open_ledger(&config).unwrap();
        let assigned: BTreeSet<String> = [inv.gpus[0].uuid.clone()].into();
        let released = release_unassigned(&ledger, &assigned, Duration::ZERO).unwrap();
        assert_eq!(
            released.iter().map(|r| &r.id).collect::<Vec<_>>(),
            [&gone.holder]
        );
        let left: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(left, [kept.holder]);
        let audit = std::fs::read_to_string(tmp.path().join("audit.log")).unwrap();
        assert!(
            audit
                .lines()
                .any(|l| l.contains("\"release\"") && l.contains(&gone.holder)),
            "{audit}"
        );
    }
}
