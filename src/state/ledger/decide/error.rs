//! Why a request gets no GPUs, as decided: the refusals of `plan`, `mig` and `scope`.
//! The ledger wraps each in `LedgerError::Decide`, which says it as written here.

use crate::state::ledger::record::HolderMeta;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecideError {
    #[error("count {count} is more than the {total} GPUs of this machine")]
    CountTooLarge { count: u32, total: usize },
    #[error("unknown GPU {key:?}: this machine has GPUs {known}")]
    UnknownGpu { key: String, known: String },
    #[error(
        "the devices list names {listed} GPUs, more than the {total} GPUs of this machine: name each GPU once"
    )]
    TooManyDevices { listed: usize, total: usize },
    #[error("cannot allocate GPU {index} ({uuid}) for {id}: {reason}")]
    DeviceUnavailable {
        id: String,
        index: u32,
        uuid: String,
        reason: String,
    },
    #[error("cannot allocate MIG instance {} ({}) for {}: {}", .0.address, .0.uuid, .0.id, .0.reason)]
    MigUnavailable(Box<MigUnavailable>),
    #[error(
        "cannot allocate {} MIG instance{} of {} for {}: {} of the {} instances of {} can take it{}",
        .0.wanted, if .0.wanted == 1 { "" } else { "s" }, .0.what, .0.id, .0.fitting, .0.matching, .0.what, .0.detail
    )]
    NotEnoughMig(Box<NotEnoughMig>),
    #[error(
        "cannot allocate {wanted} GPU{s} for {id}: {held} of {total} GPUs held, {out}{free} free{detail}",
        s = if *wanted == 1 { "" } else { "s" },
        out = if *fenced > 0 { format!("{fenced} out of allocation, ") } else { String::new() },
        free = total.saturating_sub(held + *busy as usize + *fenced as usize)
    )]
    NotEnoughFree {
        id: String,
        wanted: usize,
        /// GPUs held, of the `total` that are handed out whole (a GPU in MIG mode is not).
        held: usize,
        total: usize,
        /// GPUs no one holds that run a process of no holder: not free either.
        busy: u32,
        /// GPUs no one holds that are out of allocation (drained, unhealthy).
        fenced: u32,
        /// How many GPUs could take the request if every holder and process went: a
        /// wait can succeed only when this is at least `wanted`.
        ever: usize,
        /// What else narrowed the choice (filters, sharing), starting with "; ".
        detail: String,
    },
    #[error("the machine has no GPUs to allocate")]
    NoGpus,
    #[error("cannot allocate for {id}: gpupin.within={within} names no holder in the ledger")]
    NoSuchWithin { id: String, within: String },
    #[error(
        "cannot allocate for {}: gpupin.within={} is {}'s, not {}'s (its owner can give you its key: gpupin key {})",
        .0.id, .0.within, .0.owner, .0.user, .0.within
    )]
    WithinNotYours(Box<NotYourHolder>),
    #[error(
        "cannot allocate for {id}: taking GPUs from {within} needs its key, not just its name: give gpupin.within={within}:KEY (GPUPIN_WITHIN for env), with the key `gpupin key {within}` prints for its owner or root"
    )]
    WithinNeedsKey { id: String, within: String },
    #[error(
        "cannot allocate for {id}: the key given for {within} is not its key (a key lasts as long as its holder: ask its owner for the current one with `gpupin key {within}`)"
    )]
    WithinKeyWrong { id: String, within: String },
    #[error(transparent)]
    LimitReached(Box<LimitReached>),
}

/// A nested request inside a holder of someone else's.
#[derive(Debug)]
pub struct NotYourHolder {
    pub id: String,
    pub within: String,
    pub owner: String,
    pub user: String,
}

/// A request that would take its user, or their group, past a limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "{who} {held} GPU{s} and {user} asks for {wanted} more; {whose} limit is {limit} ({key})",
    s = if *held == 1 { "" } else { "s" },
    who = match group { Some(g) => format!("group {g} holds"), None => format!("{user} holds") },
    whose = if group.is_some() { "the group's" } else { "their" },
)]
pub struct LimitReached {
    pub user: String,
    pub group: Option<String>,
    pub held: usize,
    pub wanted: usize,
    pub limit: u32,
    /// The config key that sets the limit.
    pub key: String,
}

/// A MIG instance named in a request that cannot be given (`DecideError::MigUnavailable`).
#[derive(Debug)]
pub struct MigUnavailable {
    pub id: String,
    /// `0:1`.
    pub address: String,
    pub uuid: String,
    pub reason: String,
}

/// Too few MIG instances for a request (`DecideError::NotEnoughMig`).
#[derive(Debug)]
pub struct NotEnoughMig {
    pub id: String,
    pub wanted: usize,
    /// `1g.10gb`, or `any profile`.
    pub what: String,
    /// Instances of that profile on the machine.
    pub matching: usize,
    /// Of those, the ones free and passing every filter.
    pub fitting: usize,
    /// What else narrowed the choice, starting with "; ".
    pub detail: String,
}

impl DecideError {
    /// The refusal naming the holder as people know it, where its engine told a name:
    /// the container they started, not the id gpupin filed it under (a podman container
    /// is refused while it is still a claim, `claim-...`).
    pub fn naming(mut self, meta: &HolderMeta) -> DecideError {
        if let Some(name) = meta.container.as_ref().and_then(|c| c.name.clone())
            && let DecideError::NotEnoughFree { id, .. } | DecideError::DeviceUnavailable { id, .. } =
                &mut self
        {
            *id = name;
        }
        self
    }

    /// A short, fixed name for why an allocation was refused (`LedgerError::code`).
    pub fn code(&self) -> &'static str {
        match self {
            DecideError::NotEnoughFree { .. } | DecideError::NotEnoughMig(_) => "not_enough_free",
            DecideError::DeviceUnavailable { .. } | DecideError::MigUnavailable(_) => {
                "device_unavailable"
            }
            DecideError::CountTooLarge { .. } | DecideError::TooManyDevices { .. } => {
                "count_too_large"
            }
            DecideError::UnknownGpu { .. } => "unknown_gpu",
            DecideError::LimitReached(_) => "limit",
            DecideError::NoSuchWithin { .. }
            | DecideError::WithinNotYours(_)
            | DecideError::WithinNeedsKey { .. }
            | DecideError::WithinKeyWrong { .. } => "within",
            DecideError::NoGpus => "no_gpus",
        }
    }
}
