//! What the holders hold, counted: all an allocation that succeeds reads of the records.
//! Per unit (a GPU or a MIG instance, by UUID) the exclusive and shared holders and the
//! memory they reserve; per owner and per group the units they hold, for the limits.
//! Built from the records (`Occupancy::of`), or kept up to date beside them one record at
//! a time (`add`, `remove`), so that a decision costs the same at 10,000 holders as at
//! none. Refusals name holders, and read the records for that.

use crate::input::request::Share;
use crate::state::ledger::record::Record;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How one unit is held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UnitUse {
    /// Holders that asked for it whole.
    pub exclusive: u32,
    /// Holders that share it.
    pub shared: u32,
    /// Bytes of memory its holders reserve (`gpupin.reserve`), together.
    pub reserved: u64,
}

impl UnitUse {
    pub(crate) fn holders(&self) -> u32 {
        self.exclusive + self.shared
    }
}

/// The counts of a set of records. Equal for equal sets, whatever the order they were
/// added in; `remove` undoes `add` exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Occupancy {
    /// Per unit UUID, only units someone holds.
    units: BTreeMap<String, UnitUse>,
    /// Per owner uid: per unit, how many of their holders hold it.
    by_uid: BTreeMap<u32, BTreeMap<String, u32>>,
    /// Per group name (an owner's groups, as recorded): the same.
    by_group: BTreeMap<String, BTreeMap<String, u32>>,
}

/// Each unit a record names once: a record naming a GPU twice holds it once.
fn units_of(record: &Record) -> Vec<&str> {
    let mut units: Vec<&str> = record.gpus.iter().map(String::as_str).collect();
    units.sort_unstable();
    units.dedup();
    units
}

impl Occupancy {
    pub(crate) fn of<'r>(records: impl IntoIterator<Item = &'r Record>) -> Occupancy {
        let mut occupancy = Occupancy::default();
        for record in records {
            occupancy.add(record);
        }
        occupancy
    }

    pub(crate) fn add(&mut self, record: &Record) {
        self.apply(record, true);
    }

    pub(crate) fn remove(&mut self, record: &Record) {
        self.apply(record, false);
    }

    fn apply(&mut self, record: &Record, adding: bool) {
        let step = |n: &mut u32| match adding {
            true => *n += 1,
            false => *n = n.saturating_sub(1),
        };
        let reserve = record.request.reserve.unwrap_or(0);
        let units = units_of(record);
        for &unit in &units {
            let used = self.units.entry(unit.to_string()).or_default();
            match record.request.share {
                Share::Exclusive => step(&mut used.exclusive),
                Share::Shared => step(&mut used.shared),
            }
            used.reserved = match adding {
                true => used.reserved.saturating_add(reserve),
                false => used.reserved.saturating_sub(reserve),
            };
            if *used == UnitUse::default() {
                self.units.remove(unit);
            }
        }
        let Some(owner) = &record.owner else {
            return;
        };
        let count = |per_unit: &mut BTreeMap<String, u32>| {
            for &unit in &units {
                let n = per_unit.entry(unit.to_string()).or_default();
                step(n);
                if *n == 0 {
                    per_unit.remove(unit);
                }
            }
        };
        count(self.by_uid.entry(owner.uid).or_default());
        if self.by_uid.get(&owner.uid).is_some_and(BTreeMap::is_empty) {
            self.by_uid.remove(&owner.uid);
        }
        let mut groups: Vec<&String> = owner.groups.iter().collect();
        groups.sort_unstable();
        groups.dedup();
        for group in groups {
            count(self.by_group.entry(group.clone()).or_default());
            if self.by_group.get(group).is_some_and(BTreeMap::is_empty) {
                self.by_group.remove(group);
            }
        }
    }

    /// How the unit `uuid` is held (all zero: by no one).
    pub(crate) fn unit(&self, uuid: &str) -> UnitUse {
        self.units.get(uuid).copied().unwrap_or_default()
    }

    /// Whether anyone holds the unit `uuid`.
    pub(crate) fn is_held(&self, uuid: &str) -> bool {
        self.units.contains_key(uuid)
    }

    /// The units the holders of owner `uid` hold.
    pub(crate) fn held_by_uid(&self, uid: u32) -> impl Iterator<Item = &str> {
        self.by_uid
            .get(&uid)
            .into_iter()
            .flat_map(|units| units.keys().map(String::as_str))
    }

    /// The units the holders whose owner is in `group` hold.
    pub(crate) fn held_by_group(&self, group: &str) -> impl Iterator<Item = &str> {
        self.by_group
            .get(group)
            .into_iter()
            .flat_map(|units| units.keys().map(String::as_str))
    }
}

/// What a decision reads of the holders: their counts, and the records themselves where
/// they were read (a refusal names holders from them; so does a nested request, whose
/// enclosing holders are found by name). On the index's fast path `records` is empty:
/// it decides only requests that nest in no holder, and a refusal there is decided again
/// on the records (`Ledger::allocate`).
#[derive(Debug, Clone, Copy)]
pub(in crate::state::ledger) struct Held<'r> {
    /// Every live record, where read; empty on the fast path.
    pub records: &'r [Record],
    /// What every live record holds.
    pub occupancy: &'r Occupancy,
}
