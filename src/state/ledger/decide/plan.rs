//! Turning a request into a concrete set of GPUs, given what is held. Pure: the ledger
//! calls it under its lock and writes the outcome.

use super::DecideError;
use super::machine::Machine;
use super::mig;
use super::occupancy::{Held, Occupancy, UnitUse};
use super::scope::Scope;
use crate::base::units::format_size;
use crate::host::whose::Seen;
use crate::input::request::{GpuRequest, Selection, Share};
use crate::model::gpu::{Gpu, Inventory};
use crate::model::holder::HolderId;
use crate::policy::PolicyInput;
use crate::state::ledger::record::{Record, holder_of, holders_of};

/// The outcome of an allocation: the holder's record as written.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub record: Record,
}

impl Allocation {
    /// The allocated GPUs, in the order of the record, as the inventory describes them.
    pub fn gpus<'a>(&self, inventory: &'a Inventory) -> Vec<&'a Gpu> {
        self.record
            .gpus
            .iter()
            .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
            .collect()
    }
}

#[derive(Debug)]
pub(in crate::state::ledger) struct Plan {
    pub uuids: Vec<String>,
    pub next_cursor: usize,
    /// Per position, whether the GPU could take the request: what the policy chose from.
    pub free: Vec<bool>,
}

/// Why a GPU cannot take this request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unfit {
    /// Its name does not match `gpupin.model`.
    Model,
    /// Too little (free) memory for `gpupin.memory`.
    Memory,
    /// Held by someone this request may not share with.
    Held,
    /// Outside what the request may take from (`gpupin.within`, a group's GPUs).
    OutOfScope,
    /// Shared already by as many holders as `max_shared` allows.
    SharedFull,
    /// The reservation does not fit beside the shared holders' (or memory is unknown).
    NoRoom,
    /// Not held, but this process, which no holder of it owns, runs on it.
    Foreign(i32),
    /// In MIG mode: handed out as its instances, never whole.
    MigMode,
    /// Out of allocation: drained by an admin, or unhealthy.
    Fenced(crate::model::fence::FenceState),
}

impl Unfit {
    fn word(&self) -> &'static str {
        match self {
            Unfit::Model => "model",
            Unfit::Memory => "memory",
            Unfit::Held => "held",
            Unfit::OutOfScope => "out-of-scope",
            Unfit::SharedFull => "shared-full",
            Unfit::NoRoom => "no-room-to-reserve",
            Unfit::Foreign(_) => "foreign-process",
            Unfit::MigMode => "mig-mode",
            Unfit::Fenced(state) => state.as_str(),
        }
    }
}

pub(in crate::state::ledger) fn plan(
    holder: &HolderId,
    request: &GpuRequest,
    machine: &Machine,
    held: Held,
    cursor: usize,
    scope: &Scope,
) -> Result<Plan, DecideError> {
    let inventory = machine.inventory;
    let total = inventory.gpus.len();
    if total == 0 {
        return Err(DecideError::NoGpus);
    }
    let live = held.records;
    // The enclosing holders of a nested request hold its GPUs for it. Most requests nest
    // in none, and then the others are everyone's counts as they are, not a copy.
    let others: std::borrow::Cow<Occupancy> = match scope.enclosing.is_empty() {
        true => std::borrow::Cow::Borrowed(held.occupancy),
        false => {
            let mut others = held.occupancy.clone();
            for record in live.iter().filter(|r| scope.enclosing.contains(&r.id)) {
                others.remove(record);
            }
            std::borrow::Cow::Owned(others)
        }
    };
    if request.mig.is_some() {
        let uuids = mig::choose(holder, request, machine, &others, scope)?;
        return Ok(mig_plan(uuids, machine, &others, cursor));
    }
    let fit: Vec<Result<(), Unfit>> = (0..total)
        .map(|p| {
            if scope.allows(p) {
                let in_the_way = in_the_way(machine, p, live, &scope.enclosing);
                let used = others.unit(&inventory.gpus[p].uuid);
                fits(p, request, machine, used, in_the_way)
            } else {
                Err(Unfit::OutOfScope)
            }
        })
        .collect();
    let free: Vec<bool> = fit.iter().map(Result::is_ok).collect();
    log_fit(holder, request, machine, &fit);
    let not_enough =
        |wanted: usize| not_enough_error(holder, request, machine, live, &fit, wanted, scope);
    let mut mig_named: Vec<String> = Vec::new();
    let positions = match &request.selection {
        Selection::Devices(keys) => {
            // Before any key is looked at: a list longer than the machine names some GPU
            // twice or one it does not have, and its refusal should say so in one short
            // line rather than quote one of a thousand names.
            let units = total + inventory.mig_instances().count();
            if keys.len() > units {
                return Err(DecideError::TooManyDevices {
                    listed: keys.len(),
                    total: units,
                });
            }
            // MIG instances named among them (`0:1`, `MIG-...`) are checked one by one.
            let mut instances = Vec::new();
            let mut gpu_keys = Vec::new();
            for key in keys {
                match mig::named(holder, key, request, machine, live, &others, scope) {
                    Some(found) => {
                        let uuid = found?;
                        if !instances.contains(&uuid) {
                            instances.push(uuid);
                        }
                    }
                    None => gpu_keys.push(key.clone()),
                }
            }
            if gpu_keys.is_empty() {
                return Ok(mig_plan(instances, machine, &others, cursor));
            }
            mig_named = instances;
            let positions = resolve_devices(&gpu_keys, inventory)?;
            for &p in &positions {
                if let Err(unfit) = &fit[p] {
                    return Err(device_unfit(
                        holder, request, machine, live, p, unfit, scope,
                    ));
                }
            }
            positions
        }
        // Inside another holder: what is left of its GPUs, at least one.
        Selection::All if request.within.is_some() => {
            let left: Vec<usize> = (0..total).filter(|&p| free[p]).collect();
            if left.is_empty() {
                return Err(not_enough(1));
            }
            left
        }
        // Every GPU the request may take (a group's, where limits name them), all free.
        Selection::All => {
            let in_scope: Vec<usize> = (0..total).filter(|&p| scope.allows(p)).collect();
            if in_scope.iter().any(|&p| !free[p]) || in_scope.is_empty() {
                return Err(not_enough(in_scope.len()));
            }
            in_scope
        }
        Selection::Count(count) => {
            let count = *count as usize;
            if count > total {
                return Err(DecideError::CountTooLarge {
                    count: count as u32,
                    total,
                });
            }
            let policy = request.policy.unwrap_or(machine.default_policy).policy();
            let input = PolicyInput {
                inventory,
                free: &free,
                count,
                cursor,
                live: machine.live,
            };
            match policy.choose(&input) {
                Some(positions) => positions,
                // `mig = "instances-too"`: a count whole GPUs cannot meet takes instances.
                None if mig::count_may_take_instances(request, machine) => {
                    let uuids = mig::choose(holder, request, machine, &others, scope)
                        .map_err(|_| not_enough(count))?;
                    return Ok(mig_plan(uuids, machine, &others, cursor));
                }
                None => return Err(not_enough(count)),
            }
        }
    };
    let next_cursor = positions.last().map_or(cursor, |p| (p + 1) % total);
    let mut sorted = positions;
    sorted.sort_unstable();
    tracing::debug!(
        holder = %holder,
        chose = ?indices(inventory, &sorted),
        "chose"
    );
    Ok(Plan {
        uuids: sorted
            .into_iter()
            .map(|p| inventory.gpus[p].uuid.clone())
            .chain(mig_named)
            .collect(),
        next_cursor,
        free,
    })
}

/// The plan of MIG instances: `free` says which GPUs have an instance no one holds.
fn mig_plan(mut uuids: Vec<String>, machine: &Machine, others: &Occupancy, cursor: usize) -> Plan {
    uuids.sort();
    let free = machine
        .inventory
        .gpus
        .iter()
        .map(|g| g.mig_instances().iter().any(|m| !mig::blocked(m, others)))
        .collect();
    Plan {
        uuids,
        next_cursor: cursor,
        free,
    }
}

/// What the choice starts from: the GPUs that can take the request, and why each other
/// cannot (held, a filter, the sharing limit). Nothing is built unless debug is on.
fn log_fit(holder: &HolderId, request: &GpuRequest, machine: &Machine, fit: &[Result<(), Unfit>]) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let gpus = &machine.inventory.gpus;
    let free: Vec<u32> = (0..fit.len())
        .filter(|&p| fit[p].is_ok())
        .map(|p| gpus[p].index)
        .collect();
    let excluded: Vec<String> = (0..fit.len())
        .filter_map(|p| {
            fit[p]
                .as_ref()
                .err()
                .map(|u| format!("{}:{}", gpus[p].index, u.word()))
        })
        .collect();
    let policy = match request.selection {
        Selection::Count(_) => request.policy.unwrap_or(machine.default_policy).as_str(),
        Selection::All | Selection::Devices(_) => "none (GPUs named)",
    };
    tracing::debug!(
        holder = %holder,
        selection = ?request.selection,
        policy,
        share = ?request.share,
        max_shared = machine.max_shared,
        free = ?free,
        excluded = ?excluded,
        "choosing"
    );
}

/// GPU indices of inventory positions, as people name GPUs.
fn indices(inventory: &Inventory, positions: &[usize]) -> Vec<u32> {
    positions.iter().map(|&p| inventory.gpus[p].index).collect()
}

/// The first process on the GPU at `position` that stands in the way of an exclusive
/// request: one that has not ended and that is not the enclosing holders' (a nested
/// request's GPUs run its enclosing job). Whose else it is does not matter: a GPU no one
/// holds has no holder whose process it could be.
fn in_the_way<'m>(
    machine: &Machine<'m>,
    position: usize,
    records: &[Record],
    enclosing: &[String],
) -> Option<&'m Seen> {
    machine.processes?.get(position)?.iter().find(|seen| {
        seen.process.as_ref().is_some_and(|p| {
            enclosing.is_empty()
                || !holder_of(p, records).is_some_and(|r| enclosing.contains(&r.id))
        })
    })
}

/// Whether the GPU at `position` can take `request` now; `used`: how its holders hold
/// it; `in_the_way`: a process on it that an exclusive request must not share it with.
fn fits(
    position: usize,
    request: &GpuRequest,
    machine: &Machine,
    used: UnitUse,
    in_the_way: Option<&Seen>,
) -> Result<(), Unfit> {
    let gpu = &machine.inventory.gpus[position];
    if let Some(fence) = machine.fence_of(&gpu.uuid) {
        return Err(Unfit::Fenced(fence.state));
    }
    if gpu.in_mig_mode() {
        return Err(Unfit::MigMode);
    }
    if let Some(model) = &request.model
        && !gpu
            .name
            .to_ascii_lowercase()
            .contains(&model.to_ascii_lowercase())
    {
        return Err(Unfit::Model);
    }
    if let Some(wanted) = request.memory {
        // Free memory where live figures are on; else what the GPU has in all.
        let have = machine
            .live
            .map_or(gpu.memory_bytes, |l| l[position].memory_free);
        if have < wanted {
            return Err(Unfit::Memory);
        }
    }
    match request.share {
        Share::Exclusive if used.holders() > 0 => Err(Unfit::Held),
        Share::Exclusive => in_the_way.map_or(Ok(()), |seen| Err(Unfit::Foreign(seen.pid))),
        Share::Shared => shared_fit(gpu, request, machine, used),
    }
}

/// A shared holder joins only shared holders, within the per-GPU limit, and its
/// reservation must fit beside theirs in the GPU's memory.
fn shared_fit(
    gpu: &Gpu,
    request: &GpuRequest,
    machine: &Machine,
    used: UnitUse,
) -> Result<(), Unfit> {
    if used.exclusive > 0 {
        return Err(Unfit::Held);
    }
    if used.holders() >= machine.max_shared {
        return Err(Unfit::SharedFull);
    }
    if let Some(reserve) = request.reserve {
        let reserved = used.reserved;
        // Memory 0 means unknown (procfs): no reservation can be promised on it.
        if gpu.memory_bytes == 0 || reserved.saturating_add(reserve) > gpu.memory_bytes {
            return Err(Unfit::NoRoom);
        }
    }
    Ok(())
}

/// `all`: every live record, the enclosing holders' included.
fn not_enough_error(
    holder: &HolderId,
    request: &GpuRequest,
    machine: &Machine,
    all: &[Record],
    fit: &[Result<(), Unfit>],
    wanted: usize,
    scope: &Scope,
) -> DecideError {
    let gpus = &machine.inventory.gpus;
    // Counted among what is handed out whole: a GPU in MIG mode is its instances.
    let whole: Vec<&Gpu> = gpus.iter().filter(|g| !g.in_mig_mode()).collect();
    let held = whole
        .iter()
        .filter(|g| holders_of(&g.uuid, all).any(|r| !scope.enclosing.contains(&r.id)))
        .count();
    let busy = fit
        .iter()
        .filter(|f| matches!(f, Err(Unfit::Foreign(_))))
        .count();
    // Fenced and held counts among the held; fenced and free, here.
    let fenced = whole
        .iter()
        .filter(|g| machine.fence_of(&g.uuid).is_some())
        .filter(|g| !holders_of(&g.uuid, all).any(|r| !scope.enclosing.contains(&r.id)))
        .count();
    let fitting = fit.iter().filter(|f| f.is_ok()).count();
    let ever = (0..gpus.len())
        .filter(|&p| could_ever_fit(p, request, machine, scope))
        .count();
    let mut detail = fit_detail(request, machine, fitting, scope);
    detail.push_str(&foreign_detail(machine, all, fit));
    match ever >= wanted {
        true => detail.push_str(&wait_hint(request)),
        false => detail.push_str(&never_hint(request, machine, scope, ever)),
    }
    DecideError::NotEnoughFree {
        id: crate::model::holder::shown_id(holder.as_str()).to_string(),
        wanted,
        held,
        total: whole.len(),
        busy: busy as u32,
        fenced: fenced as u32,
        ever,
        detail,
    }
}

/// Whether the GPU at `position` could take `request` once every holder and process on
/// it was gone: what no wait changes (MIG mode, the model, the memory it has in all, what
/// the request may take from) allows it.
pub(in crate::state::ledger) fn could_ever_fit(
    position: usize,
    request: &GpuRequest,
    machine: &Machine,
    scope: &Scope,
) -> bool {
    let gpu = &machine.inventory.gpus[position];
    let model_fits = request.model.as_ref().is_none_or(|model| {
        gpu.name
            .to_ascii_lowercase()
            .contains(&model.to_ascii_lowercase())
    });
    // Memory 0 is unknown (procfs): it may be enough.
    let memory_fits = request
        .memory
        .is_none_or(|wanted| gpu.memory_bytes == 0 || gpu.memory_bytes >= wanted);
    let reserve_fits = match (request.share, request.reserve) {
        (Share::Shared, Some(reserve)) => gpu.memory_bytes >= reserve,
        _ => true,
    };
    scope.allows(position)
        && !gpu.in_mig_mode()
        && machine.fence_of(&gpu.uuid).is_none()
        && model_fits
        && memory_fits
        && reserve_fits
}

/// The GPUs (by UUID; a MIG instance's GPU for an instance) a waiting `request` could
/// ever take: what no release changes allows them (`could_ever_fit`, the GPUs it names,
/// the MIG instances of its profile, its scope). A waiter ahead in the queue holds back
/// only a request that would take one of these (`Ledger::allocate`): one that waits for a
/// GPU it names, a model, a profile or a holder's GPUs is in the way of no request for
/// other GPUs.
pub(in crate::state::ledger) fn wanted_gpus(
    request: &GpuRequest,
    machine: &Machine,
    scope: &Scope,
) -> Vec<String> {
    let inventory = machine.inventory;
    let gpus = &inventory.gpus;
    let positions: Vec<usize> = match (&request.selection, &request.mig) {
        (Selection::Devices(keys), _) => keys
            .iter()
            .filter_map(|key| match inventory.find(key) {
                Some(gpu) => inventory.position_of(&gpu.uuid),
                None => inventory
                    .find_mig(key)
                    .and_then(|m| inventory.position_of(&m.parent_uuid)),
            })
            .collect(),
        (_, Some(want)) => (0..gpus.len())
            .filter(|&p| scope.allows(p))
            .filter(|&p| {
                gpus[p].mig_instances().iter().any(|m| match want {
                    crate::input::request::MigWant::Profile(profile) => {
                        m.profile.as_deref() == Some(profile.as_str())
                    }
                    crate::input::request::MigWant::Any => true,
                })
            })
            .collect(),
        (Selection::All, None) => (0..gpus.len()).collect(),
        (Selection::Count(_), None) => (0..gpus.len())
            .filter(|&p| {
                could_ever_fit(p, request, machine, scope)
                    || (mig::count_may_take_instances(request, machine)
                        && scope.allows(p)
                        && gpus[p].in_mig_mode())
            })
            .collect(),
    };
    positions
        .into_iter()
        .map(|p| gpus[p].uuid.clone())
        .collect()
}

/// The GPUs (by UUID) of `units`: a GPU's own, a MIG instance's parent's.
pub(in crate::state::ledger) fn gpus_of_units(
    units: &[String],
    inventory: &Inventory,
) -> Vec<String> {
    units
        .iter()
        .map(|u| match inventory.find_mig(u) {
            Some(m) => m.parent_uuid.clone(),
            None => u.clone(),
        })
        .collect()
}

/// `; 2 GPUs are in MIG mode (handed out as instances), so no wait helps: ask for at
/// most 6`: for a request that more GPUs than could ever take it would not satisfy,
/// what keeps them out and what would have to change, in the requester's words.
fn never_hint(request: &GpuRequest, machine: &Machine, scope: &Scope, ever: usize) -> String {
    use crate::input::request::Key;
    let gpus = &machine.inventory.gpus;
    let count = |keeps: &dyn Fn(&Gpu) -> bool| gpus.iter().filter(|g| keeps(g)).count();
    let gpu_s = |n: usize| if n == 1 { "GPU is" } else { "GPUs are" };
    let mut why = Vec::new();
    let mig = count(&|g| g.in_mig_mode());
    if mig > 0 {
        why.push(format!(
            "{mig} {} in MIG mode (handed out as instances)",
            gpu_s(mig)
        ));
    }
    if let Some(model) = &request.model {
        let other = count(&|g| {
            !g.in_mig_mode()
                && !g
                    .name
                    .to_ascii_lowercase()
                    .contains(&model.to_ascii_lowercase())
        });
        if other > 0 {
            let mut names: Vec<&str> = gpus.iter().map(|g| g.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            why.push(format!(
                "{other} {} not {} (this machine has {})",
                gpu_s(other),
                said(Key::Model, model, request.origin),
                names.join(", ")
            ));
        }
    }
    if let Some(memory) = request.memory {
        let small = count(&|g| !g.in_mig_mode() && g.memory_bytes != 0 && g.memory_bytes < memory);
        if small > 0 {
            why.push(format!(
                "{small} {} smaller than {}",
                gpu_s(small),
                said(Key::Memory, &format_size(memory), request.origin)
            ));
        }
    }
    let fenced = count(&|g| machine.fence_of(&g.uuid).is_some());
    if fenced > 0 {
        why.push(format!(
            "{fenced} {} out of allocation (drained or unhealthy: gpupin status says why)",
            gpu_s(fenced)
        ));
    }
    let outside = (0..gpus.len()).filter(|&p| !scope.allows(p)).count();
    if outside > 0 {
        why.push(format!(
            "{outside} {} outside {}",
            gpu_s(outside),
            scope.what.join(", ")
        ));
    }
    let change = match ever {
        0 => "ask for something this machine has".to_string(),
        n => format!("ask for at most {n}"),
    };
    let why = match why.is_empty() {
        true => format!("only {ever} GPUs here could ever take it"),
        false => why.join(", "),
    };
    format!("; {why}, so no wait helps: {change}")
}

/// A request key with its value as the requester wrote it: `--model A100` on the command
/// line, `GPUPIN_MODEL=A100` in the environment, `gpupin.model=A100` as a label.
fn said(
    key: crate::input::request::Key,
    value: &str,
    origin: crate::input::request::Origin,
) -> String {
    match origin {
        crate::input::request::Origin::Cli => format!("{} {value}", key.name(origin)),
        _ => format!("{}={value}", key.name(origin)),
    }
}

/// `; add gpupin.wait=10m to wait until they free up`, in the requester's words (the
/// label or annotation, `GPUPIN_WAIT`, `--wait 10m`), for a request that did not ask to
/// wait: a refusal for lack of GPUs is where people learn that they can.
fn wait_hint(request: &GpuRequest) -> String {
    if request.wait.is_some() {
        return String::new();
    }
    let key = crate::input::request::Key::Wait;
    format!(
        "; add {} to wait until they free up",
        said(key, "10m", request.origin)
    )
}

/// How many GPUs a refusal names the process of; the others are counted.
const FOREIGN_NAMED: usize = 2;
/// The most of a command a refusal quotes.
const FOREIGN_COMMAND: usize = 40;

/// `; GPU 3 runs pid 4242 (bob: python train.py), not started through gpupin` for the
/// first GPUs a process kept from the request; empty when none did.
fn foreign_detail(machine: &Machine, all: &[Record], fit: &[Result<(), Unfit>]) -> String {
    let kept: Vec<(usize, i32)> = fit
        .iter()
        .enumerate()
        .filter_map(|(p, f)| match f {
            Err(Unfit::Foreign(pid)) => Some((p, *pid)),
            _ => None,
        })
        .collect();
    let mut parts: Vec<String> = kept
        .iter()
        .take(FOREIGN_NAMED)
        .map(|&(p, pid)| {
            let index = machine.inventory.gpus[p].index;
            format!("GPU {index} runs {}", foreign_text(machine, all, p, pid))
        })
        .collect();
    if kept.len() > FOREIGN_NAMED {
        parts.push(format!(
            "{} more GPUs run processes of no holder of theirs",
            kept.len() - FOREIGN_NAMED
        ));
    }
    parts.iter().map(|p| format!("; {p}")).collect()
}

/// `pid 4242 (bob: python train.py), not started through gpupin`, or for a holder's
/// process on a GPU it does not hold, `pid 4242 (…) of holder c2, which does not hold it`.
fn foreign_text(machine: &Machine, all: &[Record], position: usize, pid: i32) -> String {
    let process = machine
        .processes
        .and_then(|p| p.get(position))
        .and_then(|list| list.iter().find(|s| s.pid == pid))
        .and_then(|s| s.process.as_ref());
    let Some(process) = process else {
        return format!("pid {pid}, not started through gpupin");
    };
    let who = process.describe(FOREIGN_COMMAND);
    match holder_of(process, all) {
        Some(r) => format!(
            "pid {pid} ({who}) of holder {}, which does not hold it",
            r.id
        ),
        None => format!("pid {pid} ({who}), not started through gpupin"),
    }
}

/// What besides plain holding narrowed the choice, for the message; empty when nothing did.
fn fit_detail(request: &GpuRequest, machine: &Machine, fitting: usize, scope: &Scope) -> String {
    let mut conditions = scope.what.clone();
    if let Some(model) = &request.model {
        conditions.push(said(
            crate::input::request::Key::Model,
            model,
            request.origin,
        ));
    }
    if let Some(memory) = request.memory {
        let what = if machine.live.is_some() {
            "free memory"
        } else {
            "memory"
        };
        conditions.push(format!("{what} >= {}", format_size(memory)));
    }
    if request.share == Share::Shared {
        let mut s = format!("shared (at most {} per GPU", machine.max_shared);
        if let Some(r) = request.reserve {
            s.push_str(&format!(", reserving {}", format_size(r)));
        }
        s.push(')');
        conditions.push(s);
    }
    // Without conditions only holders and processes narrowed the choice: the message
    // counts the first, `foreign_detail` names the second.
    if conditions.is_empty() {
        return String::new();
    }
    format!("; {fitting} can take {}", conditions.join(", "))
}

/// `all`: every live record, the enclosing holders' included.
fn device_unfit(
    holder: &HolderId,
    request: &GpuRequest,
    machine: &Machine,
    all: &[Record],
    position: usize,
    unfit: &Unfit,
    scope: &Scope,
) -> DecideError {
    let gpu = &machine.inventory.gpus[position];
    let reason = match unfit {
        Unfit::Model => format!(
            "its name {:?} does not match {}",
            gpu.name,
            said(
                crate::input::request::Key::Model,
                request.model.as_deref().unwrap_or_default(),
                request.origin
            )
        ),
        Unfit::Memory => format!(
            "it has less memory than {}",
            said(
                crate::input::request::Key::Memory,
                &format_size(request.memory.unwrap_or_default()),
                request.origin
            )
        ),
        // Say what narrowed the choice: a user cannot tell a hold's GPUs from their
        // groups' otherwise.
        Unfit::OutOfScope => format!(
            "it is not among the GPUs this request may take ({})",
            scope.what.join(", ")
        ),
        // The message names the holders in every case; the log tells the three apart.
        Unfit::Held | Unfit::SharedFull | Unfit::NoRoom => {
            let holders: Vec<&str> = holders_of(&gpu.uuid, all).map(Record::shown_name).collect();
            format!("it is held by {}", holders.join(", "))
        }
        Unfit::Foreign(pid) => format!("it runs {}", foreign_text(machine, all, position, *pid)),
        Unfit::Fenced(_) => match machine.fence_of(&gpu.uuid) {
            Some(fence) => format!("it {}", fence.why()),
            None => "it is out of allocation".into(),
        },
        Unfit::MigMode => match gpu.mig_instances() {
            [] => "it is in MIG mode with no instances: it has nothing to give until an admin creates some".into(),
            list => format!(
                "it is in MIG mode and handed out as its instances ({}): name one, or ask for gpupin.mig=PROFILE",
                list.iter().map(|m| m.address()).collect::<Vec<_>>().join(", ")
            ),
        },
    };
    DecideError::DeviceUnavailable {
        id: crate::model::holder::shown_id(holder.as_str()).to_string(),
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        reason,
    }
}

/// Positions in `inventory.gpus` of GPUs named by index, UUID or PCI bus id.
pub(crate) fn resolve_devices(
    keys: &[String],
    inventory: &Inventory,
) -> Result<Vec<usize>, DecideError> {
    let mut positions: Vec<usize> = Vec::with_capacity(keys.len());
    for key in keys {
        let gpu = inventory.find(key).ok_or_else(|| DecideError::UnknownGpu {
            key: key.clone(),
            known: known_range(inventory),
        })?;
        let p = inventory.position_of(&gpu.uuid).expect("found above");
        // `0,GPU-<uuid of 0>` names one GPU twice: one GPU, not an error.
        if !positions.contains(&p) {
            positions.push(p);
        }
    }
    Ok(positions)
}

fn known_range(inventory: &Inventory) -> String {
    let indices: Vec<String> = inventory.gpus.iter().map(|g| g.index.to_string()).collect();
    format!("{} (by index, UUID or PCI bus id)", indices.join(","))
}
