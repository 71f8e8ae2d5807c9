//! The kubelet's side of gpupin (`gpupin device-plugin`), without the gRPC around it:
//! what the plugin advertises ([`devices`]), which GPUs it prefers for a container
//! ([`prefer`]), what it records and returns at `Allocate` ([`allocate`]), and which of
//! its holders the kubelet no longer assigns ([`reconcile`]). Plain functions over the
//! ledger and the inventory; the binary turns their results into protobuf messages.
//!
//! A container's GPUs are one holder, a hold until released (`until_release`, no
//! process: the kubelet starts the container later, through whatever runtime), named
//! `k8s-<digest of its GPUs' UUIDs>` and made by source [`SOURCE`]. Holders of that name
//! and source are the plugin's own: nobody else's are ever released by it.

pub mod allocate;
pub(crate) mod devices;
pub(crate) mod prefer;
pub(crate) mod reconcile;

use crate::state::ledger::Record;

use crate::model::holder::HolderKind;

/// The resource pods ask for unless `--resource-name` says otherwise.
pub const DEFAULT_RESOURCE: &str = "gpupin.io/gpu";

/// The `source` of the plugin's records.
pub(crate) const SOURCE: &str = "device-plugin";

/// How the plugin's holder ids start.
pub(crate) const HOLDER_PREFIX: &str = crate::model::holder::KUBE_PREFIX;

/// The engine the plugin's records name.
pub(crate) const ENGINE: &str = "kubernetes";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeError {
    #[error("unknown device id {id:?}: expected the UUID of one of this machine's GPUs ({known})")]
    UnknownDevice { id: String, known: String },
    #[error("the kubelet asked to allocate no devices: expected at least one GPU UUID")]
    NoDevices,
    #[error(transparent)]
    Grant(#[from] crate::admission::grant::GrantError),
    #[error(transparent)]
    Ledger(#[from] crate::state::ledger::LedgerError),
    #[error(transparent)]
    Inventory(#[from] crate::host::inventory::InventoryError),
    #[error(transparent)]
    Driver(#[from] crate::admission::driver::DriverError),
    #[error("--mig-strategy single: {reason}; use --mig-strategy mixed")]
    MigSingle { reason: String },
}

/// Whether `record` is one of the plugin's holders.
pub(crate) fn is_plugin_holder(record: &Record) -> bool {
    record.kind == HolderKind::Hold
        && record.source == SOURCE
        && record.id.starts_with(HOLDER_PREFIX)
}

/// Whether `record` belongs to Kubernetes: one of the plugin's holders, or a holder
/// nested in one (a container of the pod that went through gpupin's runtime, with the
/// `gpupin.within` the plugin gave it), however deep.
pub(crate) fn inside_kubernetes(record: &Record, live: &[Record]) -> bool {
    let mut next = Some(record);
    // A chain longer than the records is a loop in them.
    for _ in 0..=live.len() {
        let Some(r) = next else { return false };
        if is_plugin_holder(r) {
            return true;
        }
        next = r
            .request
            .within
            .as_ref()
            .and_then(|w| live.iter().find(|l| &l.id == w));
    }
    false
}

/// The records of `ledger` that are not stale: whose holders still hold their GPUs.
pub fn live_records(
    ledger: &crate::state::ledger::Ledger,
) -> Result<Vec<Record>, crate::state::ledger::LedgerError> {
    Ok(ledger
        .records()?
        .into_iter()
        .filter(|r| !ledger.is_stale(r))
        .collect())
}

/// The units' UUIDs, for messages: `GPU-a,GPU-b,MIG-c`.
fn known_uuids(inventory: &crate::model::gpu::Inventory) -> String {
    let uuids: Vec<&str> = inventory
        .gpus
        .iter()
        .filter(|g| !g.in_mig_mode())
        .map(|g| g.uuid.as_str())
        .chain(inventory.mig_instances().map(|m| m.uuid.as_str()))
        .collect();
    uuids.join(",")
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::model::holder::HolderKind;
    use crate::state::ledger::Record;

    /// A live record of `id` holding `gpus`, of the plugin when `id` starts with `k8s-`.
    pub(crate) fn record(id: &str, gpus: &[&str]) -> Record {
        let plugin = id.starts_with(super::HOLDER_PREFIX);
        Record {
            kind: if plugin {
                HolderKind::Hold
            } else {
                HolderKind::Container
            },
            until_release: plugin,
            request: GpuRequest::new(Selection::Count(1), Origin::Cli),
            source: if plugin {
                super::SOURCE.into()
            } else {
                "hook:prestart".into()
            },
            pid: None,
            start_time: None,
            created_at: crate::state::ledger::unix_now(),
            ..crate::state::ledger::testing::record(id, gpus)
        }
    }

    /// `record`, nested in `within`.
    pub(crate) fn nested(id: &str, gpus: &[&str], within: &str) -> Record {
        let mut r = record(id, gpus);
        r.request.within = Some(within.into());
        r
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{nested, record};
    use super::*;

    #[test]
    fn only_the_plugins_own_holds_are_its_holders() {
        assert!(is_plugin_holder(&record("k8s-1", &["A"])));
        assert!(!is_plugin_holder(&record("c1", &["A"])));
        let mut user_hold = record("k8s-2", &["A"]);
        user_hold.source = "cli".into();
        assert!(!is_plugin_holder(&user_hold), "a hold someone named k8s-");
    }

    #[test]
    fn holders_nested_in_the_plugins_belong_to_kubernetes() {
        let live = vec![
            record("k8s-1", &["A"]),
            nested("c1", &["A"], "k8s-1"),
            nested("c2", &["A"], "c1"),
            record("other", &["B"]),
            nested("c3", &["B"], "other"),
        ];
        let inside: Vec<bool> = live.iter().map(|r| inside_kubernetes(r, &live)).collect();
        assert_eq!(inside, [true, true, true, false, false]);
        let looped = vec![nested("x", &["C"], "y"), nested("y", &["C"], "x")];
        assert!(!inside_kubernetes(&looped[0], &looped));
    }
}
