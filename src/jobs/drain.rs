//! `gpupin drain GPU... --reason TEXT` and `gpupin undrain GPU...`: an admin takes whole
//! GPUs out of allocation for maintenance, and puts them back. New requests skip a
//! drained GPU (a request that names it is refused saying who drained it and why); its
//! holders keep it until they end (`holders` says who, for `--wait`); the device plugin
//! reports it unhealthy, as it does a GPU held outside Kubernetes.

use crate::host::inventory::InventoryError;
use crate::input::config::Config;
use crate::model::fence::Fence;
use crate::model::gpu::{Gpu, Inventory};
use crate::state::ledger::{Ledger, LedgerError, Record};

/// The longest `--reason`: one line of the audit log and of `gpupin status`.
pub(crate) const MAX_REASON: usize = 200;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error("unknown GPU {key:?}: this machine has GPUs {known} (by index, UUID or PCI bus id)")]
    UnknownGpu { key: String, known: String },
    #[error(
        "{key:?} is a MIG instance: gpupin drain takes whole GPUs (drain GPU {gpu} to take all its instances out)"
    )]
    MigInstance { key: String, gpu: u32 },
    #[error(
        "--reason {given:?} is not one line of at most {MAX_REASON} printable characters: say why in a short line"
    )]
    BadReason { given: String },
}

/// What a drain did: the fences set, and who still holds those GPUs.
#[derive(Debug)]
pub struct Drained {
    pub fences: Vec<Fence>,
    pub holders: Vec<Record>,
}

/// What an undrain did: the fences taken away, and the GPUs (or MIG instances, by
/// address) named that had none.
#[derive(Debug)]
pub struct Undrained {
    pub cleared: Vec<Fence>,
    pub not_fenced: Vec<String>,
}

/// Takes the GPUs `keys` name out of allocation, saying `reason`, as `by`.
pub fn drain(
    config: &Config,
    keys: &[String],
    reason: &str,
    by: &str,
) -> Result<Drained, DrainError> {
    if !crate::base::message::is_one_short_line(reason, MAX_REASON) {
        return Err(DrainError::BadReason {
            given: reason.chars().take(MAX_REASON).collect(),
        });
    }
    let inventory = config.load_inventory()?;
    let gpus = named(&inventory, keys)?;
    let ledger = crate::state::open_ledger(config)?;
    let fences = ledger.drain(&gpus, reason, by)?;
    let holders = ledger.holders_of_gpus(&gpus)?;
    Ok(Drained { fences, holders })
}

/// Puts the GPUs `keys` name back into allocation, whatever took them out, as `by`: a
/// GPU with its MIG instances, or one instance (`3:1`) whose health fenced it alone.
pub fn undrain(config: &Config, keys: &[String], by: &str) -> Result<Undrained, DrainError> {
    let inventory = config.load_inventory()?;
    let mut named: Vec<(String, Vec<&str>)> = Vec::new();
    for key in keys {
        let (address, uuids) = match inventory.find(key) {
            Some(gpu) => (gpu.index.to_string(), gpu.uuids().collect()),
            None => match inventory.find_mig(key) {
                Some(m) => (m.address(), vec![m.uuid.as_str()]),
                None => return Err(unknown(&inventory, key)),
            },
        };
        if !named.iter().any(|(a, _)| *a == address) {
            named.push((address, uuids));
        }
    }
    let uuids: Vec<&str> = named.iter().flat_map(|(_, u)| u.iter().copied()).collect();
    let ledger = crate::state::open_ledger(config)?;
    let cleared = ledger.undrain(&uuids, by)?;
    let not_fenced = named
        .into_iter()
        .filter(|(_, uuids)| !cleared.iter().any(|f| uuids.contains(&f.uuid.as_str())))
        .map(|(address, _)| address)
        .collect();
    Ok(Undrained {
        cleared,
        not_fenced,
    })
}

/// The live holders of the GPUs `keys` name: whom a drained GPU still waits for.
pub fn holders(config: &Config, keys: &[String]) -> Result<Vec<Record>, DrainError> {
    let inventory = config.load_inventory()?;
    let gpus = named(&inventory, keys)?;
    let ledger = Ledger::open_read_only(&config.ledger_settings())?;
    Ok(ledger.holders_of_gpus(&gpus)?)
}

/// The whole GPUs `keys` name (index, UUID, bus id), each once, in the order given.
pub(crate) fn named<'i>(
    inventory: &'i Inventory,
    keys: &[String],
) -> Result<Vec<&'i Gpu>, DrainError> {
    let mut gpus: Vec<&Gpu> = Vec::new();
    for key in keys {
        let gpu = match inventory.find(key) {
            Some(gpu) => gpu,
            None => {
                return Err(match inventory.find_mig(key) {
                    Some(m) => DrainError::MigInstance {
                        key: key.clone(),
                        gpu: m.parent_index,
                    },
                    None => unknown(inventory, key),
                });
            }
        };
        if !gpus.iter().any(|g| g.uuid == gpu.uuid) {
            gpus.push(gpu);
        }
    }
    Ok(gpus)
}

/// The refusal of a key that names no GPU here.
fn unknown(inventory: &Inventory, key: &str) -> DrainError {
    DrainError::UnknownGpu {
        key: key.to_string(),
        known: inventory
            .gpus
            .iter()
            .map(|g| g.index.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::testing::sim8_in as config;

    #[test]
    fn drain_names_gpus_as_people_do_and_undrain_says_what_it_cleared() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let uuid = config.load_inventory().unwrap().gpus[5].uuid.clone();
        let drained = drain(
            &config,
            &["3".into(), uuid.clone(), "3".into()],
            "fan swap",
            "alice",
        )
        .unwrap();
        let indices: Vec<u32> = drained.fences.iter().map(|f| f.index).collect();
        assert_eq!(indices, [3, 5]);
        assert!(drained.holders.is_empty());
        let undrained = undrain(&config, &["5".into(), "6".into()], "root").unwrap();
        assert_eq!(
            undrained
                .cleared
                .iter()
                .map(|f| f.index)
                .collect::<Vec<_>>(),
            [5]
        );
        assert_eq!(undrained.not_fenced, ["6"]);
    }

    /// Drain takes whole GPUs; undrain also takes a MIG instance its health took out
    /// alone, and undrain of its GPU clears the instances' fences with the GPU's.
    #[test]
    fn undrain_takes_an_instance_and_a_gpu_clears_its_instances() {
        use crate::model::fence::{FenceState, FenceTarget};
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            inventory: "sim:dgxa100mig".parse().unwrap(),
            ..config(tmp.path())
        };
        let inventory = config.load_inventory().unwrap();
        let parent = inventory.gpus.iter().find(|g| g.in_mig_mode()).unwrap();
        let [a, b, ..] = parent.mig_instances() else {
            panic!("instances")
        };
        let err = drain(&config, &[a.address()], "x", "root").unwrap_err();
        assert!(matches!(err, DrainError::MigInstance { .. }), "{err}");
        let ledger = crate::state::open_ledger(&config).unwrap();
        for m in [a, b] {
            ledger
                .fence_health(
                    FenceTarget::from(m),
                    FenceState::NeedsReset,
                    "XID 48",
                    false,
                )
                .unwrap();
        }
        let undrained = undrain(&config, &[a.address(), b.uuid.clone()], "root").unwrap();
        assert_eq!(undrained.cleared.len(), 2);
        assert!(undrained.not_fenced.is_empty());
        let again = undrain(&config, &[a.address()], "root").unwrap();
        assert_eq!(again.not_fenced, [a.address()]);

        ledger
            .fence_health(
                FenceTarget::from(b),
                FenceState::NeedsReset,
                "XID 48",
                false,
            )
            .unwrap();
        ledger.drain(&[parent], "fan", "root").unwrap();
        let whole = undrain(&config, &[parent.index.to_string()], "root").unwrap();
        let cleared: Vec<String> = whole.cleared.iter().map(|f| f.address()).collect();
        assert_eq!(cleared, [parent.index.to_string(), b.address()]);
        assert!(ledger.fences().unwrap().is_empty());
    }

    #[test]
    fn bad_input_is_one_line_and_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let line = |e: DrainError| crate::base::message::one_line(&e);
        let err = drain(&config, &["9".into()], "x", "root").unwrap_err();
        assert_eq!(
            line(err),
            "unknown GPU \"9\": this machine has GPUs 0,1,2,3,4,5,6,7 (by index, UUID or PCI bus id)"
        );
        for reason in ["", "  ", "two\nlines", "\u{202E}evil"] {
            let err = drain(&config, &["1".into()], reason, "root").unwrap_err();
            assert!(line(err).starts_with("--reason "), "{reason:?}");
        }
        let long = "x".repeat(MAX_REASON + 1);
        assert!(drain(&config, &["1".into()], &long, "root").is_err());
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert!(ledger.fences().unwrap().is_empty());
    }
}
