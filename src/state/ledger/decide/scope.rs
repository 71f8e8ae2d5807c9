//! What narrows an allocation besides what is held: the enclosing holder of a nested
//! request (`gpupin.within`), the GPUs a user's groups may use, and how many GPUs a user
//! or a group may hold (`[limits]`). Pure, called by the ledger under its lock.

use super::DecideError;
use super::machine::Machine;
use super::occupancy::Occupancy;
use crate::model::holder::WithinKey;
use crate::model::holder::{HolderId, HolderKind};
use crate::state::ledger::record::{HolderMeta, Record};
use std::collections::BTreeSet;

/// Where a request may take GPUs from.
#[derive(Debug, Default)]
pub(in crate::state::ledger) struct Scope {
    /// Positions the request may take at all; `None`: any.
    pub allowed: Option<Vec<bool>>,
    /// Holders whose holding does not stand in the way: the enclosing holder and the
    /// holders it is itself inside.
    pub enclosing: Vec<String>,
    /// What narrowed `allowed`, for messages: `within slurm-42`.
    pub what: Vec<String>,
    /// The enclosing holder's units (GPU and MIG UUIDs), for a nested request: a MIG
    /// instance is inside it only when it holds that instance.
    pub within_gpus: Option<Vec<String>>,
}

impl Scope {
    pub(crate) fn allows(&self, position: usize) -> bool {
        self.allowed.as_ref().is_none_or(|a| a[position])
    }

    /// Whether a nested request's enclosing holder holds the unit `uuid` (true when the
    /// request is not nested).
    pub(crate) fn within_has(&self, uuid: &str) -> bool {
        self.within_gpus
            .as_ref()
            .is_none_or(|gpus| gpus.iter().any(|u| u == uuid))
    }

    fn narrow(&mut self, positions: Vec<bool>, what: String) {
        self.allowed = Some(match self.allowed.take() {
            None => positions,
            Some(a) => a.iter().zip(&positions).map(|(x, y)| *x && *y).collect(),
        });
        self.what.push(what);
    }
}

pub(in crate::state::ledger) fn scope<E: From<DecideError>>(
    holder: &HolderId,
    request: &crate::input::request::GpuRequest,
    machine: &Machine,
    meta: &HolderMeta,
    live: &[Record],
    opens: &mut dyn FnMut(&Record, &WithinKey) -> Result<bool, E>,
) -> Result<Scope, E> {
    let gpus = &machine.inventory.gpus;
    let mut scope = Scope::default();
    if let Some(within) = &request.within {
        let parent =
            live.iter()
                .find(|r| &r.id == within)
                .ok_or_else(|| DecideError::NoSuchWithin {
                    id: holder.to_string(),
                    within: within.clone(),
                })?;
        may_enter(holder, request, meta, parent, opens)?;
        // Up the chain of enclosing holders. Records are finite, so the walk ends at a
        // holder that is inside none, or at one seen before: a loop (a parent released and
        // its name taken again inside its own child).
        let mut next = Some(parent);
        while let Some(r) = next {
            if scope.enclosing.contains(&r.id) {
                break;
            }
            scope.enclosing.push(r.id.clone());
            next = r
                .request
                .within
                .as_ref()
                .and_then(|w| live.iter().find(|l| &l.id == w));
        }
        // A GPU is inside the holder when it holds it, or one of its MIG instances
        // (`within_has` then says which).
        let positions = gpus
            .iter()
            .map(|g| {
                parent.gpus.contains(&g.uuid)
                    || g.mig_instances()
                        .iter()
                        .any(|m| parent.gpus.contains(&m.uuid))
            })
            .collect();
        scope.within_gpus = Some(parent.gpus.clone());
        scope.narrow(positions, format!("within {within}"));
    }
    if meta.limited
        && let (Some(limits), Some(owner)) = (machine.limits, &meta.owner)
        && let Some(keys) = limits.allowed_gpus(&owner.groups)
    {
        let named: Vec<&str> = keys
            .iter()
            .filter_map(|k| machine.inventory.find(k))
            .map(|g| g.uuid.as_str())
            .collect();
        let positions = gpus
            .iter()
            .map(|g| named.contains(&g.uuid.as_str()))
            .collect();
        scope.narrow(
            positions,
            format!("the GPUs {}'s groups may use", owner.user),
        );
    }
    Ok(scope)
}

/// Whether the request of `meta` may take from `parent`'s GPUs. Root's own requests
/// (its exec, its holds, the device plugin's) may, and so may a user's request inside a
/// holder of their own: the kernel says who asks (SO_PEERCRED). Everyone else presents the
/// parent's key (`within`), which `opens` checks: a container, whose author gpupin does not
/// know and whose env and annotations are the image's or the pod spec's text, and a user
/// inside someone else's holder, who got its key from its owner.
pub(in crate::state::ledger) fn may_enter<E: From<DecideError>>(
    holder: &HolderId,
    request: &crate::input::request::GpuRequest,
    meta: &HolderMeta,
    parent: &Record,
    opens: &mut dyn FnMut(&Record, &WithinKey) -> Result<bool, E>,
) -> Result<(), E> {
    let roots_own = !meta.limited && meta.kind != HolderKind::Container;
    let users_own = meta.limited
        && meta
            .owner
            .as_ref()
            .zip(parent.owner.as_ref())
            .is_some_and(|(me, theirs)| me.uid == theirs.uid);
    if roots_own || users_own {
        return Ok(());
    }
    let within = || parent.id.clone();
    let refused = match &request.within_key {
        Some(key) if opens(parent, key)? => return Ok(()),
        Some(_) => DecideError::WithinKeyWrong {
            id: holder.to_string(),
            within: within(),
        },
        None => match (meta.limited, &meta.owner) {
            (true, Some(me)) => DecideError::WithinNotYours(Box::new(super::NotYourHolder {
                id: holder.to_string(),
                within: within(),
                owner: parent
                    .owner
                    .as_ref()
                    .map_or_else(|| format!("a {}", parent.kind.as_str()), |o| o.user.clone()),
                user: me.user.clone(),
            })),
            _ => DecideError::WithinNeedsKey {
                id: holder.to_string(),
                within: within(),
            },
        },
    };
    Err(refused.into())
}

/// Refuses `planned` when it would take the requester past one of their limits. GPUs they
/// (or their group) hold already do not count twice: a job inside their own hold adds none.
/// `held`: what every live holder holds.
pub(in crate::state::ledger) fn check(
    meta: &HolderMeta,
    machine: &Machine,
    held: &Occupancy,
    planned: &[String],
) -> Result<(), DecideError> {
    let (true, Some(limits), Some(owner)) = (meta.limited, machine.limits, &meta.owner) else {
        return Ok(());
    };
    for limit in limits.applicable(&owner.user, &owner.groups) {
        let theirs: BTreeSet<&str> = match &limit.group {
            None => held.held_by_uid(owner.uid).collect(),
            Some(group) => held.held_by_group(group).collect(),
        };
        let wanted = planned
            .iter()
            .filter(|u| !theirs.contains(u.as_str()))
            .count();
        if theirs.len() + wanted > limit.max_gpus as usize {
            return Err(DecideError::LimitReached(Box::new(super::LimitReached {
                user: owner.user.clone(),
                group: limit.group,
                held: theirs.len(),
                wanted,
                limit: limit.max_gpus,
                key: limit.key,
            })));
        }
    }
    Ok(())
}
