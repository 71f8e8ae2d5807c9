//! One look at the machine: the value `gpupin status` shows and `gpupin serve`'s `status`
//! op returns. The inventory, the ledger (records, queue, idle holders, the jobs'
//! leftovers), the live figures where a source has them and, where asked, whose each
//! GPU's processes are; and which GPUs a person asked to see (`GpuFilter`).

use super::Status;
use crate::base::message::{escape_controls, one_line};
use crate::host::inventory::{self, InventoryError};
use crate::host::users;
use crate::host::whose::{self, Seen};
use crate::input::config::Config;
use crate::model::fence::Fences;
use crate::model::gpu::{Gpu, Inventory};
use crate::model::live::Live;
use crate::report::{Leftover, leftovers};
use crate::state::ledger::{Idle, Ledger, LedgerError, Record, Waiting, holders_of};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Why there is no look at the machine: its inventory or its ledger could not be read.
/// Each says what its error says, with the same sources.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// What `gpupin serve` answers its `status` op with (the Python client's
/// `gpupin.status()`): `gpupin status --json`'s JSON, without the GPUs' processes: whose
/// they are is for each user's own `gpupin status` to read from /proc, not for the root
/// daemon to hand to anyone who asks. The error is one line, for the reply.
pub(crate) fn served(config: &Config) -> Result<serde_json::Value, String> {
    let snapshot = Snapshot::read(config, false).map_err(|e| one_line(&e))?;
    Ok(snapshot.status(None).json())
}

/// Which GPUs `gpupin status` shows (`--gpu`, `--user`, `--free`); every GPU where none
/// is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFilter {
    /// Only these GPUs, by index; empty: any.
    pub gpus: Vec<u32>,
    /// Only the GPUs a holder of this user holds.
    pub user: Option<String>,
    /// Only the GPUs nobody holds and no process runs on.
    pub free: bool,
}

/// One look at the machine: the ledger, and what the GPUs do now where a source says.
pub struct Snapshot {
    grace: Duration,
    inventory: Inventory,
    records: Vec<Record>,
    waiting: Vec<Waiting>,
    idle: Vec<Idle>,
    leftovers: Vec<Leftover>,
    live: Option<Vec<Live>>,
    processes: Option<Vec<Vec<Seen>>>,
    live_error: Option<String>,
    fences: Fences,
    fences_error: Option<String>,
}

impl Snapshot {
    /// Reads the machine as `config` names it. `processes`: whether to say what runs on
    /// each GPU, and whose.
    pub fn read(config: &Config, processes: bool) -> Result<Snapshot, SnapshotError> {
        let inventory = config.load_inventory()?;
        let ledger = Ledger::open_read_only(&config.ledger_settings())?;
        let records = ledger.records()?;
        let waiting = ledger.waiting()?;
        // What gpupin serve's looks found (the figures read here are one moment: they
        // cannot say how long a holder has been quiet).
        let idle = ledger.idle(&records);
        let leftovers = leftovers(&records);
        let (fences, fences_error) = match ledger.fences() {
            Ok(fences) => (fences, None),
            Err(err) => (Fences::default(), Some(one_line(&err))),
        };
        // Fresh figures, not the allocations' snapshot cache: a person watching wants
        // now, and may not write the state dir.
        let file = config.live_file.as_deref();
        let (live, live_error) = match inventory::read_live(file, &inventory, &config.nvml, None) {
            Ok(live) => (live, None),
            Err(err) => (None, Some(one_line(&err))),
        };
        let names = user_names();
        let processes = match processes {
            true => live.as_deref().map(|l| whose::observe(l, &names)),
            false => None,
        };
        Ok(Snapshot {
            grace: config.claim_grace,
            inventory,
            records,
            waiting,
            idle,
            leftovers,
            live,
            processes,
            live_error,
            fences,
            fences_error,
        })
    }

    /// What `gpupin status` shows of this look; `shown`: the GPUs' positions, all where
    /// `None` (`shown` gives them).
    pub fn status<'s>(&'s self, shown: Option<&'s [usize]>) -> Status<'s> {
        Status {
            live: self.live.as_deref(),
            processes: self.processes.as_deref(),
            live_error: self.live_error.as_deref(),
            waiting: &self.waiting,
            idle: &self.idle,
            leftovers: &self.leftovers,
            fences: Some(&self.fences),
            fences_error: self.fences_error.as_deref(),
            shown,
            ..Status::new(&self.inventory, &self.records, self.grace)
        }
    }

    /// The positions of the GPUs the filter lets through; `None` without filters.
    pub fn shown(&self, filter: &GpuFilter) -> Option<Vec<usize>> {
        if filter.gpus.is_empty() && filter.user.is_none() && !filter.free {
            return None;
        }
        let now = SystemTime::now();
        // A GPU's holders, or for a GPU in MIG mode its instances'.
        let holders = |g: &Gpu| {
            g.uuids()
                .flat_map(|uuid| holders_of(uuid, &self.records))
                .collect::<Vec<_>>()
        };
        let busy = |position: usize| {
            self.processes
                .as_ref()
                .and_then(|p| p.get(position))
                .is_some_and(|seen| !seen.is_empty())
        };
        let shown = self
            .inventory
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| filter.gpus.is_empty() || filter.gpus.contains(&g.index))
            .filter(|(_, g)| {
                filter.user.as_ref().is_none_or(|user| {
                    holders(g)
                        .iter()
                        .any(|r| r.owner.as_ref().is_some_and(|o| &o.user == user))
                })
            })
            .filter(|(position, g)| {
                !filter.free
                    || (holders(g).iter().all(|r| r.is_stale(now, self.grace))
                        && !busy(*position)
                        && self.fences.of(&g.uuid).is_none())
            })
            .map(|(position, _)| position)
            .collect();
        Some(shown)
    }
}

/// A uid's name through NSS (LDAP and sssd users too), else /etc/passwd, as text that
/// cannot steer a terminal; each uid looked up once a look.
fn user_names() -> impl Fn(u32) -> Option<String> {
    let seen: RefCell<HashMap<u32, Option<String>>> = RefCell::default();
    move |uid| {
        seen.borrow_mut()
            .entry(uid)
            .or_insert_with(|| {
                users::name_of(uid)
                    .map(|name| escape_controls(&name))
                    .or_else(|| whose::passwd_name(uid))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::DEFAULT_CLAIM_GRACE;
    use crate::model::holder::Owner;
    use crate::policy::testing::machine;
    use crate::state::ledger::testing::record;

    /// Three GPUs: alice holds GPU 1, a process of no holder runs on GPU 2.
    fn three_gpus() -> Snapshot {
        let alice = Record {
            owner: Some(Owner {
                uid: 1000,
                user: "alice".into(),
                groups: Vec::new(),
            }),
            ..record("a", &["GPU-test-1"])
        };
        let stray = Seen {
            pid: 7,
            used_memory: None,
            process: None,
        };
        Snapshot {
            grace: DEFAULT_CLAIM_GRACE,
            inventory: machine(3),
            records: vec![alice],
            waiting: Vec::new(),
            idle: Vec::new(),
            leftovers: Vec::new(),
            live: None,
            processes: Some(vec![Vec::new(), Vec::new(), vec![stray]]),
            live_error: None,
            fences: Fences::default(),
            fences_error: None,
        }
    }

    #[test]
    fn the_filter_lets_through_the_gpus_asked_for() {
        let snapshot = three_gpus();
        let shown = |filter: GpuFilter| snapshot.shown(&filter);
        assert_eq!(shown(GpuFilter::default()), None);
        let gpus = GpuFilter {
            gpus: vec![0, 2],
            ..GpuFilter::default()
        };
        assert_eq!(shown(gpus), Some(vec![0, 2]));
        let alice = GpuFilter {
            user: Some("alice".into()),
            ..GpuFilter::default()
        };
        assert_eq!(shown(alice), Some(vec![1]));
        // Free: no holder, and no process of anyone's on it.
        let free = GpuFilter {
            free: true,
            ..GpuFilter::default()
        };
        assert_eq!(shown(free), Some(vec![0]));
    }
}
