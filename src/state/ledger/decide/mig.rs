//! MIG instances as units of the ledger: which a request may take and which it gets.
//! Pure, called by `allocate::plan` under the ledger's lock.
//!
//! An instance is exclusive: one holder at a time, never shared. A GPU in MIG mode is
//! never handed out whole (`allocate` refuses it), and while a holder still has such a
//! GPU whole (a record from before its geometry changed), none of its instances is free.
//! Policies: `pack` (and `topology`, which does not apply within a GPU) fill the fullest
//! GPU first; `spread` (and the live-figure policies, which have no figures per
//! instance) take one instance per GPU in turn, emptiest GPU first.

use super::DecideError;
use super::machine::Machine;
use super::occupancy::Occupancy;
use super::scope::Scope;
use crate::base::units::format_size;
use crate::input::config::MigUnits;
use crate::input::config::PolicyName;
use crate::input::request::{GpuRequest, MigWant, Selection};
use crate::model::gpu::{Gpu, Inventory};
use crate::model::holder::HolderId;
use crate::model::mig::MigInstance;
use crate::state::ledger::record::Record;
use std::collections::BTreeMap;

/// Why an instance cannot take this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::state::ledger) enum Unfit {
    /// The inventory names no GI and CI ids for it (an import of `nvidia-smi -L`).
    NoAccess,
    Profile,
    Model,
    Memory,
    Held,
    OutOfScope,
    /// It, or its GPU, is out of allocation (drained, or unhealthy).
    Fenced,
}

impl Unfit {
    fn reason(self, instance: &MigInstance, request: &GpuRequest, holders: &str) -> String {
        match self {
            Unfit::NoAccess => "gpupin does not know its capability nodes: the inventory names no GPU and compute instance ids for it or no nvidia-caps major (add gi and ci to the inventory file, or use NVML or procfs)".into(),
            Unfit::Profile => format!(
                "its profile {} is not gpupin.mig={}",
                instance.profile_name(),
                request.mig.as_ref().map(ToString::to_string).unwrap_or_default()
            ),
            Unfit::Model => format!(
                "its GPU's name does not match gpupin.model={}",
                request.model.as_deref().unwrap_or_default()
            ),
            Unfit::Memory => format!(
                "it has less memory than gpupin.memory={}",
                format_size(request.memory.unwrap_or_default())
            ),
            Unfit::Held => format!("it is held by {holders}"),
            Unfit::OutOfScope => "it is not among the GPUs this request may take".into(),
            Unfit::Fenced => format!("its GPU {} is out of allocation (gpupin status says why)", instance.parent_index),
        }
    }
}

/// Whether a plain count may fall back to instances (`mig = "instances-too"`).
pub(in crate::state::ledger) fn count_may_take_instances(
    request: &GpuRequest,
    machine: &Machine,
) -> bool {
    machine.mig_units == MigUnits::InstancesToo
        && request.mig.is_none()
        && matches!(request.selection, Selection::Count(_))
        && request.share == crate::input::request::Share::Exclusive
        && machine.inventory.has_mig()
}

/// Whether a holder stands in the way of an instance: its own, or its GPU's whole.
pub(in crate::state::ledger) fn blocked(instance: &MigInstance, others: &Occupancy) -> bool {
    others.is_held(&instance.uuid) || others.is_held(&instance.parent_uuid)
}

/// The holders standing in the way of an instance, for a refusal that names them.
fn blockers<'r>(
    instance: &MigInstance,
    others: &'r [Record],
) -> impl Iterator<Item = &'r Record> + 'r {
    let (own, parent) = (instance.uuid.clone(), instance.parent_uuid.clone());
    others
        .iter()
        .filter(move |r| r.gpus.iter().any(|u| *u == own || *u == parent))
}

/// Whether `instance` of `parent` (at `position`) can take `request`; `by_profile`: the
/// request's profile applies (not for instances named one by one).
#[allow(clippy::too_many_arguments)]
fn fits(
    machine: &Machine,
    instance: &MigInstance,
    parent: &Gpu,
    position: usize,
    request: &GpuRequest,
    others: &Occupancy,
    scope: &Scope,
    by_profile: bool,
) -> Result<(), Unfit> {
    // The profile first: an instance of another profile is not counted among those
    // asked for, whatever else it lacks.
    if by_profile
        && let Some(MigWant::Profile(p)) = &request.mig
        && instance.profile.as_deref().is_none_or(|own| own != p)
    {
        return Err(Unfit::Profile);
    }
    if !machine.what_if && !machine.inventory.can_give(instance) {
        return Err(Unfit::NoAccess);
    }
    if let Some(model) = &request.model
        && !parent
            .name
            .to_ascii_lowercase()
            .contains(&model.to_ascii_lowercase())
    {
        return Err(Unfit::Model);
    }
    if let Some(wanted) = request.memory
        && instance.memory_bytes < wanted
    {
        return Err(Unfit::Memory);
    }
    if !scope.allows(position) || !scope.within_has(&instance.uuid) {
        return Err(Unfit::OutOfScope);
    }
    if machine.fence_of(&parent.uuid).is_some() || machine.fence_of(&instance.uuid).is_some() {
        return Err(Unfit::Fenced);
    }
    if blocked(instance, others) {
        return Err(Unfit::Held);
    }
    Ok(())
}

/// Sort key of a candidate: size, round (spread), fullness, GPU index, MIG index.
type Order = ((u64, u64), usize, i64, u32, u32);

/// The UUIDs of the instances `request` gets, chosen from every instance of the machine
/// by profile (or smallest first for `any`, largest first for a plain count under
/// `instances-too`) and then by policy.
pub(in crate::state::ledger) fn choose(
    holder: &HolderId,
    request: &GpuRequest,
    machine: &Machine,
    others: &Occupancy,
    scope: &Scope,
) -> Result<Vec<String>, DecideError> {
    let count = match request.selection {
        Selection::Count(n) => n as usize,
        // `assemble` gives a MIG request a count; anything else is a caller's mistake.
        _ => 1,
    };
    let inventory = machine.inventory;
    let mut candidates: Vec<&MigInstance> = Vec::new();
    let mut matching = 0;
    let mut no_access = 0;
    let mut fenced = 0;
    let mut free_per_parent: BTreeMap<u32, usize> = BTreeMap::new();
    for (position, parent) in inventory.gpus.iter().enumerate() {
        for instance in parent.mig_instances() {
            let fit = fits(
                machine, instance, parent, position, request, others, scope, true,
            );
            if fit != Err(Unfit::Profile) {
                matching += 1;
            }
            if fit == Err(Unfit::NoAccess) {
                no_access += 1;
            }
            if fit == Err(Unfit::Fenced) {
                fenced += 1;
            }
            if !blocked(instance, others) {
                *free_per_parent.entry(parent.index).or_default() += 1;
            }
            if fit.is_ok() {
                candidates.push(instance);
            }
        }
    }
    if candidates.len() < count {
        return Err(not_enough(
            holder,
            request,
            machine,
            (count, matching, candidates.len()),
            scope,
            (no_access, fenced),
        ));
    }
    let free = |m: &MigInstance| free_per_parent.get(&m.parent_index).copied().unwrap_or(0);
    let spread = matches!(
        request.policy.unwrap_or(machine.default_policy),
        PolicyName::Spread | PolicyName::LeastLoaded | PolicyName::MostFree
    );
    // Size first where the request leaves the profile open: smallest for `any`, largest
    // for a plain count (it asked for a GPU; the biggest slice is the nearest).
    let size = |m: &MigInstance| -> (u64, u64) {
        match &request.mig {
            Some(MigWant::Any) => (u64::from(m.slices()), m.memory_bytes),
            Some(MigWant::Profile(_)) => (0, 0),
            None => (
                u64::MAX - u64::from(m.slices().min(u32::MAX - 1)),
                u64::MAX - m.memory_bytes,
            ),
        }
    };
    // Pack: fullest GPU (fewest free instances) first. Spread: emptiest first, and each
    // GPU's n-th instance only after every GPU's (n-1)-th.
    let mut rank_in_parent: BTreeMap<(u64, u64, u32), usize> = BTreeMap::new();
    let mut keyed: Vec<(Order, &MigInstance)> = candidates
        .iter()
        .map(|m| {
            let s = size(m);
            let round = match spread {
                true => {
                    let n = rank_in_parent
                        .entry((s.0, s.1, m.parent_index))
                        .or_default();
                    *n += 1;
                    *n
                }
                false => 0,
            };
            let fullness = match spread {
                true => -(free(m) as i64),
                false => free(m) as i64,
            };
            ((s, round, fullness, m.parent_index, m.index), *m)
        })
        .collect();
    keyed.sort_by_key(|k| k.0);
    let chosen: Vec<String> = keyed
        .into_iter()
        .take(count)
        .map(|k| k.1.uuid.clone())
        .collect();
    tracing::debug!(holder = %holder, chose = ?chosen, spread, "chose MIG instances");
    Ok(chosen)
}

/// `counts`: wanted, instances of the profile, those that can take the request.
fn not_enough(
    holder: &HolderId,
    request: &GpuRequest,
    machine: &Machine,
    counts: (usize, usize, usize),
    scope: &Scope,
    (no_access, fenced): (usize, usize),
) -> DecideError {
    let (wanted, matching, fitting) = counts;
    let what = match &request.mig {
        Some(MigWant::Profile(p)) => p.clone(),
        Some(MigWant::Any) | None => "any profile".into(),
    };
    let mut detail = scope
        .what
        .iter()
        .map(|w| format!("; {w}"))
        .collect::<String>();
    if let Some(memory) = request.memory {
        detail.push_str(&format!("; memory >= {}", format_size(memory)));
    }
    if let Some(model) = &request.model {
        detail.push_str(&format!("; gpupin.model={model}"));
    }
    if no_access > 0 {
        detail.push_str(&no_access_detail(machine.inventory, no_access));
    }
    if fenced > 0 {
        detail.push_str(&format!(
            "; {fenced} out of allocation (drained or unhealthy: gpupin status says why)"
        ));
    }
    if matching == 0 {
        // A profile the machine does not have: say which it has.
        let mut profiles: Vec<&str> = machine
            .inventory
            .mig_instances()
            .map(|m| m.profile_name())
            .collect();
        profiles.sort_unstable();
        profiles.dedup();
        detail.push_str(&match profiles.is_empty() {
            true => "; this machine has no MIG instances (gpupin inventory)".to_string(),
            false => format!("; this machine's profiles: {}", profiles.join(", ")),
        });
    }
    DecideError::NotEnoughMig(Box::new(super::NotEnoughMig {
        id: crate::model::holder::shown_id(holder.as_str()).to_string(),
        wanted,
        what,
        matching,
        fitting,
        detail,
    }))
}

/// `; 2 of them have no gi and ci in the inventory ...`: which key of the inventory file
/// keeps `n` instances from being given, and how to add it.
fn no_access_detail(inventory: &Inventory, n: usize) -> String {
    let them = match n {
        1 => "1 of them has".to_string(),
        _ => format!("{n} of them have"),
    };
    if inventory.caps_major.is_none() {
        return format!(
            "; {them} no capability nodes gpupin knows: the inventory file has no caps_major (add \"caps_major\": the nvidia-caps number in /proc/devices, at its top level)"
        );
    }
    format!(
        "; {them} no \"gi\" and \"ci\" in the inventory file, so gpupin does not know their nodes (add both to each instance, from nvidia-smi mig -lgi and -lci; gpupin pick models them as they are)"
    )
}

/// The instance a devices key names, checked as `fits` checks it (any profile).
pub(in crate::state::ledger) fn named(
    holder: &HolderId,
    key: &str,
    request: &GpuRequest,
    machine: &Machine,
    all: &[Record],
    others: &Occupancy,
    scope: &Scope,
) -> Option<Result<String, DecideError>> {
    let inventory = machine.inventory;
    let instance = inventory.find_mig(key)?;
    let position = inventory.position_of(&instance.parent_uuid)?;
    let parent = &inventory.gpus[position];
    Some(
        match fits(
            machine, instance, parent, position, request, others, scope, false,
        ) {
            Ok(()) => Ok(instance.uuid.clone()),
            Err(unfit) => {
                let holders: Vec<&str> = blockers(instance, all).map(Record::shown_name).collect();
                // An instance its health took out alone says why, as a fenced GPU does.
                let reason = match (unfit, machine.fence_of(&instance.uuid)) {
                    (Unfit::Fenced, Some(fence)) => format!("it {}", fence.why()),
                    _ => unfit.reason(instance, request, &holders.join(", ")),
                };
                Err(DecideError::MigUnavailable(Box::new(
                    super::MigUnavailable {
                        id: crate::model::holder::shown_id(holder.as_str()).to_string(),
                        address: instance.address(),
                        uuid: instance.uuid.clone(),
                        reason,
                    },
                )))
            }
        },
    )
}
