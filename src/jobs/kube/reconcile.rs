//! Releasing what the kubelet no longer assigns: the PodResources API's `List` says which
//! devices each running container holds; a plugin holder none of whose GPUs any container
//! holds belonged to a pod that is gone, and is released.
//!
//! Only once every `List` for at least the grace has left it out ([`Unlisted`]): the
//! kubelet records a container's devices only after `Allocate` returns, so a `List` in
//! between does not show them yet; and a kubelet that has just restarted answers `List`
//! before it has taken up its pods again, without the devices of containers that run on
//! (seen with kubelet v1.37: one such `List` released a running pod's GPUs). A holder
//! listed again starts over. Nobody else's holders are ever touched, and a failed `List`
//! releases nothing (the caller does not get here).

use super::is_plugin_holder;
use crate::model::holder::HolderId;
use crate::state::ledger::{Ledger, LedgerError, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

/// Since when each of the plugin's holders has been left out of every `List`: kept by the
/// caller from one reconcile to the next. A holder listed again, or gone, is forgotten.
#[derive(Debug, Default, Clone)]
pub struct Unlisted(BTreeMap<String, SystemTime>);

/// The plugin's holders in `records` to release, given the device ids pods hold
/// (`assigned`) in a `List` at `now`: those `unlisted` has seen left out for at least
/// `grace`. Updates `unlisted` with this `List`.
pub(crate) fn unassigned<'r>(
    records: &'r [Record],
    assigned: &BTreeSet<String>,
    now: SystemTime,
    grace: Duration,
    unlisted: &mut Unlisted,
) -> Vec<&'r Record> {
    let mut still = BTreeMap::new();
    let mut release = Vec::new();
    for record in records.iter().filter(|r| is_plugin_holder(r)) {
        if record.gpus.iter().any(|g| assigned.contains(g)) {
            continue;
        }
        let since = unlisted.0.get(&record.id).copied().unwrap_or(now);
        still.insert(record.id.clone(), since);
        if now.duration_since(since).is_ok_and(|out| out >= grace) {
            release.push(record);
        }
    }
    unlisted.0 = still;
    release
}

/// Releases the plugin's holders that `List` after `List` for the grace showed no pod
/// holding; returns their records.
pub fn release_unassigned(
    ledger: &Ledger,
    assigned: &BTreeSet<String>,
    grace: Duration,
    unlisted: &mut Unlisted,
) -> Result<Vec<Record>, LedgerError> {
    let records = ledger.records()?;
    let mut released = Vec::new();
    for record in unassigned(&records, assigned, SystemTime::now(), grace, unlisted) {
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
        let mut unlisted = Unlisted::default();
        assert_eq!(
            ids(unassigned(
                &records,
                &assigned,
                now,
                Duration::ZERO,
                &mut unlisted
            )),
            ["k8s-b"]
        );
        assert_eq!(
            ids(unassigned(
                &records,
                &BTreeSet::new(),
                now,
                Duration::ZERO,
                &mut unlisted
            )),
            ["k8s-a", "k8s-b"]
        );
    }

    #[test]
    fn holders_unlisted_for_less_than_the_grace_are_kept() {
        let records = [record("k8s-a", &["A"])];
        let now = records[0].created();
        let grace = Duration::from_secs(30);
        let none = BTreeSet::new();
        let mut unlisted = Unlisted::default();
        assert!(unassigned(&records, &none, now, grace, &mut unlisted).is_empty());
        let later = now + grace;
        assert_eq!(
            ids(unassigned(&records, &none, later, grace, &mut unlisted)),
            ["k8s-a"]
        );
    }

    /// A kubelet that has just restarted lists no devices for containers that run on;
    /// an old holder left out of that one `List` stays, and the next `List` that shows
    /// it starts the count over.
    #[test]
    fn one_list_without_a_holder_releases_nothing() {
        let records = [record("k8s-a", &["A"])];
        let grace = Duration::from_secs(60);
        // Long past the grace: the holder's age does not count, only the Lists.
        let restart = records[0].created() + grace * 10;
        let (none, listed) = (BTreeSet::new(), BTreeSet::from(["A".to_string()]));
        let mut unlisted = Unlisted::default();
        assert!(unassigned(&records, &listed, restart - grace, grace, &mut unlisted).is_empty());
        assert!(unassigned(&records, &none, restart, grace, &mut unlisted).is_empty());
        let back = restart + Duration::from_secs(2);
        assert!(unassigned(&records, &listed, back, grace, &mut unlisted).is_empty());
        // Gone for real from here: released once a grace of Lists has left it out.
        let deleted = back + Duration::from_secs(30);
        assert!(unassigned(&records, &none, deleted, grace, &mut unlisted).is_empty());
        assert!(unassigned(&records, &none, deleted + grace / 2, grace, &mut unlisted).is_empty());
        assert_eq!(
            ids(unassigned(
                &records,
                &none,
                deleted + grace,
                grace,
                &mut unlisted
            )),
            ["k8s-a"]
        );
    }

    #[test]
    fn release_unassigned_removes_the_records_and_audits_them() {
        let tmp = tempfile::tempdir().unwrap();
        let config = crate::input::config::testing::sim8_in(tmp.path());
        let inv = config.load_inventory().unwrap();
        let kept =
            crate::jobs::kube::allocate::allocate(&config, &inv, &[inv.gpus[0].uuid.clone()])
                .unwrap();
        let gone =
            crate::jobs::kube::allocate::allocate(&config, &inv, &[inv.gpus[1].uuid.clone()])
                .unwrap();
        let ledger = crate::state::open_ledger(&config).unwrap();
        let assigned: BTreeSet<String> = [inv.gpus[0].uuid.clone()].into();
        let released =
            release_unassigned(&ledger, &assigned, Duration::ZERO, &mut Unlisted::default())
                .unwrap();
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
