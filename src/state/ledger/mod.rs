//! The ledger: the lock directory that says which holder has which GPUs. It is the only
//! writer of gpupin's state; every read-modify-write happens under one flock.

// The rooms, bottom first: each uses only the rooms above it in this list
// (tests/layering.rs checks it). `record` is the data every room reads; `decide` is
// pure; `store` is the files on disk; `queue` the wait queue; `life` a holder's life
// from claim to release; `survey` reads them all, changing nothing. A blank line
// between them keeps rustfmt from sorting them.

/// What a holding is, as data: the record a holder's file holds, and who asks.
mod record;

/// What an allocation gets, decided without I/O: the machine, the scope, the plan, MIG.
mod decide;

/// The lock directory on disk: the flock, records, entries, counters.
mod store;

/// The wait queue: tickets, their order, why each waits.
mod queue;

/// A holder's life: claim and bind, its job, release, idleness, its key, its end.
mod life;

/// The ledger as it stands, for `gpupin doctor`: holders and tickets, read only.
mod survey;

#[cfg(test)]
pub(crate) mod testing;

pub use decide::Machine;
pub(crate) use decide::resolve_devices;
pub(crate) use decide::{Allocation, DecideError};
pub(crate) use life::ResetEnd;
pub(crate) use life::WITHIN_SECRET_FILE;
pub(crate) use life::lookup;
pub(crate) use life::{ClaimError, ClaimToken, HEALTH_BY, Idle, IdleRule, RESETTING};
pub use life::{Released, Releaser};
pub use queue::{WaitReason, Waiting};
pub(crate) use record::{Figures, FiguresNow, MemoryLimit, Mode, StillWanted};
pub use record::{HolderMeta, Record};
pub(crate) use record::{holder_of, holders_of, unix_now};
pub(crate) use store::entry::release_arg;
pub(crate) use store::failures::audit_write_failures;
pub(crate) use survey::{IndexState, Survey};

use crate::input::config::{AuditFailure, AuditLog, LedgerSettings, QueueOrder};
use crate::input::request::{GpuRequest, Share};
use crate::model::holder::{BadHolderId, HolderId, HolderKind, WithinKey};
use crate::state::audit::{Event, EventKind};
use decide::occupancy::{Held, Occupancy};
use life::within;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing state dir {path}: {reason}")]
    UnsafeStateDir { path: PathBuf, reason: &'static str },
    #[error("refusing {path}: {reason}")]
    UnsafeStateFile { path: PathBuf, reason: &'static str },
    /// The GPUs out of allocation cannot be read: nothing is handed out meanwhile.
    #[error(
        "refusing the fences file {path:?}: {reason}; no GPU is handed out while it stands: inspect it, then remove it (every GPU it took out comes back: drain those again)"
    )]
    CorruptFences { path: PathBuf, reason: String },
    #[error(
        "corrupt ledger record {path:?}: {reason} (inspect it, then remove it with `gpupin release {}`)",
        release_arg(.path)
    )]
    CorruptRecord { path: PathBuf, reason: String },
    #[error(
        "stray entry {path:?} in the ledger: {reason} (remove it with `gpupin gc` or `gpupin release {}`)",
        release_arg(.path)
    )]
    StrayEntry { path: PathBuf, reason: &'static str },
    #[error(
        "invalid ledger entry {name:?}: expected a holder id or one file name in the ledger's holders/ (no '/', not '.' or '..')"
    )]
    BadEntryName { name: String },
    #[error(transparent)]
    BadId(#[from] BadHolderId),
    /// A refusal of the pure decision (no GPU fits, a limit, `within`), said as `decide`
    /// words it.
    #[error(transparent)]
    Decide(#[from] DecideError),
    #[error(
        "refusing to allocate for {id} without an audit line (audit_failure = \"refuse\"; \"warn\" allocates anyway)"
    )]
    AuditFailed {
        id: String,
        #[source]
        source: crate::state::audit::WriteError,
    },
    #[error(
        "cannot allocate for {id}: {waiting} request{s} waiting ahead of it; add gpupin.wait to queue behind them",
        s = if *waiting == 1 { " is" } else { "s are" }
    )]
    QueueAhead { id: String, waiting: usize },
    #[error("stopped waiting for GPUs for {id}: its process {pid} is gone")]
    WaiterGone { id: String, pid: i32 },
    #[error("stopped waiting for GPUs for {id}: the caller closed its connection")]
    CallerGone { id: String },
    #[error(
        "cannot queue {id}: {user} has {waiting} request{s} waiting already; the limit is {limit} (limits.max_waiting_per_user)",
        s = if *waiting == 1 { "" } else { "s" }
    )]
    TooManyWaiting {
        id: String,
        user: String,
        waiting: usize,
        limit: u32,
    },
    #[error("gave up waiting for GPUs for {id} after {waited}: {last}")]
    WaitExpired {
        id: String,
        waited: String,
        last: String,
    },
    #[error("container {id} carries gpupin.claim for {claim}, refused: {reason}")]
    ClaimRefused {
        id: String,
        claim: String,
        reason: &'static str,
    },
    #[error("container {id} carries gpupin.assigned={claimed} but the ledger gives it {held}")]
    NotAssigned {
        id: String,
        claimed: String,
        held: String,
    },
    #[error("cannot bind {id} to process {pid}: {reason}")]
    NotAdopted {
        id: String,
        pid: i32,
        reason: &'static str,
    },
    #[error("holder {id} is {owner}'s, not {by}'s: only {owner} or root may release it")]
    NotYours {
        id: String,
        owner: String,
        by: String,
    },
    #[error(
        "holder {id} holds GPUs {held} already, not the GPUs {asked} asked for: release it first (gpupin release {id})"
    )]
    HeldOtherwise {
        id: String,
        held: String,
        asked: String,
    },
    #[error(
        "holder name {id:?} starts with {prefix}, which gpupin keeps for the holders it names itself (Slurm jobs, pods, claims, unnamed jobs): choose another name"
    )]
    ReservedName { id: String, prefix: &'static str },
    #[error("holder {id} exists already ({kind} of {owner}): choose another name")]
    HolderExists {
        id: String,
        kind: &'static str,
        owner: String,
    },
    #[error(
        "no holder {given:?}: give a name or id as gpupin status shows it (an id may be cut to its first 12 characters)"
    )]
    NoSuchHolder { given: String },
    #[error("{given:?} could be any of {candidates}: give the id")]
    AmbiguousHolder { given: String, candidates: String },
    #[error(
        "{name} still runs ({what}): releasing it would give its GPUs to the next request while it uses them; end it with gpupin evict {name}, which releases them once it is gone"
    )]
    StillRunning { name: String, what: String },
    #[error("{name} is {owner}'s request: only {owner} or root may cancel it")]
    NotYourRequest { name: String, owner: String },
    #[error("{id} was cancelled by {by} ({how}) while it waited for GPUs")]
    Cancelled { id: String, by: String, how: String },
    #[error(
        "only root may release a holder that still runs ({name}: {what}); end it with gpupin evict {name}, which releases its GPUs once it is gone"
    )]
    ForceIsRoots { name: String, what: String },
}

/// Refuses a user's request for a holder id of a kind gpupin names itself: Slurm's prolog
/// holds `slurm-<job>`, the device plugin `k8s-<digest>`, podman's precreate `claim-...`,
/// an unnamed job is `exec-<pid>`. Root's integrations make those ids from public facts,
/// and a user who took one first would stall root's prolog or be handed root's choice. A
/// user's own unnamed job, `exec-<the pid that asks>` (with `-<n>` beside a leftover of
/// that name), is the one such id a user gets.
fn reserved_for_gpupin(holder: &HolderId, meta: &HolderMeta) -> Result<(), LedgerError> {
    if !meta.limited {
        return Ok(());
    }
    let id = holder.as_str();
    let Some(prefix) = crate::model::holder::RESERVED_PREFIXES
        .iter()
        .find(|p| id.starts_with(*p))
    else {
        return Ok(());
    };
    // `exec-<pid>`, or `exec-<pid>-<n>` beside a leftover job of that name.
    let own_job = meta.kind == HolderKind::Exec
        && meta.pid.is_some_and(|pid| {
            id.strip_prefix(&format!("exec-{pid}")).is_some_and(|rest| {
                rest.is_empty()
                    || rest
                        .strip_prefix('-')
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
        });
    if own_job {
        return Ok(());
    }
    Err(LedgerError::ReservedName {
        id: id.to_string(),
        prefix,
    })
}

/// `record`'s owner and the user of `uid`, by name (`uid N` where /etc/passwd has none),
/// for a refusal of someone else's holder.
fn not_yours(record: &Record, uid: u32) -> LedgerError {
    LedgerError::NotYours {
        id: record.id.clone(),
        owner: record
            .owner
            .as_ref()
            .map_or_else(|| "root".to_string(), |o| o.user.clone()),
        by: crate::host::whose::passwd_name(uid).unwrap_or_else(|| format!("uid {uid}")),
    }
}

/// The index of the GPU `uuid` is, or whose MIG instance it is.
fn unit_index(inventory: &crate::model::gpu::Inventory, uuid: &str) -> Option<u32> {
    match inventory.gpus.iter().find(|g| g.uuid == uuid) {
        Some(g) => Some(g.index),
        None => inventory
            .mig_instances()
            .find(|m| m.uuid == uuid)
            .map(|m| m.parent_index),
    }
}

/// GPU indices of `uuids` as people name them, comma-separated.
fn index_list(machine: &Machine, uuids: &[String]) -> String {
    let mut indices: Vec<u32> = uuids
        .iter()
        .filter_map(|u| unit_index(machine.inventory, u))
        .collect();
    indices.sort_unstable();
    indices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl LedgerError {
    /// A short, fixed name for why an allocation was refused: the `code` of audit lines
    /// and the `reason` label of `gpupin_refusals_total`.
    pub fn code(&self) -> &'static str {
        match self {
            LedgerError::Decide(refused) => refused.code(),
            LedgerError::AuditFailed { .. } => "audit",
            LedgerError::QueueAhead { .. } => "queue_ahead",
            LedgerError::WaitExpired { .. } => "wait_expired",
            LedgerError::WaiterGone { .. } | LedgerError::CallerGone { .. } => "waiter_gone",
            LedgerError::TooManyWaiting { .. } => "queue_full",
            LedgerError::HolderExists { .. }
            | LedgerError::HeldOtherwise { .. }
            | LedgerError::ReservedName { .. } => "holder_exists",
            LedgerError::ClaimRefused { .. } | LedgerError::NotAssigned { .. } => "claim",
            LedgerError::NotAdopted { .. }
            | LedgerError::NotYours { .. }
            | LedgerError::NotYourRequest { .. } => "not_yours",
            LedgerError::Cancelled { .. } => "cancelled",
            LedgerError::NoSuchHolder { .. } | LedgerError::AmbiguousHolder { .. } => {
                "no_such_holder"
            }
            LedgerError::StillRunning { .. } | LedgerError::ForceIsRoots { .. } => "still_running",
            LedgerError::Io { .. }
            | LedgerError::UnsafeStateDir { .. }
            | LedgerError::UnsafeStateFile { .. }
            | LedgerError::CorruptFences { .. }
            | LedgerError::CorruptRecord { .. }
            | LedgerError::StrayEntry { .. }
            | LedgerError::BadEntryName { .. }
            | LedgerError::BadId(_) => "state",
        }
    }
}

fn same_set(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    a == b
}

fn not_assigned(holder: &HolderId, assigned: &[String], held: Option<&Record>) -> LedgerError {
    LedgerError::NotAssigned {
        id: holder.to_string(),
        claimed: assigned.join(","),
        held: held.map_or("nothing".into(), |r| r.gpus.join(",")),
    }
}

/// What a request would get now: UUIDs in the record's order, and per inventory position
/// whether the GPU could take the request (held ones, filtered ones and ones out of
/// scope could not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub uuids: Vec<String>,
    pub free: Vec<bool>,
}

/// Told after each change of a ledger, under its lock: the metrics file
/// (`state::metrics::FileSink`), which sits above the ledger and reads it back.
pub trait ChangeObserver: Send + Sync {
    fn changed(&self, ledger: &Ledger);
}

/// A handle on the lock directory. Cheap: opening checks the directory, nothing more.
pub struct Ledger {
    dir: PathBuf,
    unbound_grace: Duration,
    audit: AuditLog,
    /// Told after every change, under the lock (`metrics_file`).
    observer: Option<Box<dyn ChangeObserver>>,
    /// In which order waiters are served (`queue`).
    queue_order: QueueOrder,
}

impl Ledger {
    /// Opens the ledger for writing, creating the directory when missing, with no
    /// observer: `state::open_ledger` adds what a configuration names.
    pub fn open(settings: &LedgerSettings) -> Result<Ledger, LedgerError> {
        store::ensure_safe_dir(&settings.dir)?;
        Ok(Ledger::with_settings(settings))
    }

    /// Opens the ledger for reading only; a missing directory reads as an empty ledger.
    pub fn open_read_only(settings: &LedgerSettings) -> Result<Ledger, LedgerError> {
        let dir = &settings.dir;
        if dir.exists() || dir.is_symlink() {
            store::check_safe_dir(dir)?;
        }
        Ok(Ledger::with_settings(settings))
    }

    /// The handle, once its directory passed the check of the way it is opened.
    fn with_settings(settings: &LedgerSettings) -> Ledger {
        Ledger {
            dir: settings.dir.clone(),
            unbound_grace: settings.claim_grace,
            audit: settings.audit.clone(),
            observer: None,
            queue_order: settings.queue,
        }
    }

    /// Who is told after each change (the metrics file).
    pub fn with_observer(mut self, observer: Box<dyn ChangeObserver>) -> Ledger {
        self.observer = Some(observer);
        self
    }

    /// After a change, under the lock: the observer (if any) sees what the ledger says
    /// now. Under the lock, so that an older view never overwrites a newer one.
    fn changed(&self) {
        if let Some(observer) = &self.observer {
            observer.changed(self);
        }
    }

    /// Tells the observer (if any) what the ledger says now, under the lock, though
    /// nothing changed: `gpupin serve`'s start brings what follows the ledger (the GPU
    /// nodes' ACLs) in line after a crash or a reboot.
    pub fn resync(&self) -> Result<(), LedgerError> {
        if self.observer.is_some() {
            let _lock = store::lock(&self.dir)?;
            self.changed();
        }
        Ok(())
    }

    /// Appends an audit line. For refusals, which happen outside the ledger's writes;
    /// the metrics file (if any) counts them at once, under the lock like every change.
    /// A line that cannot be written is a warning and a count: the request was refused
    /// whatever the log says.
    pub fn audit(&self, event: &Event) {
        let written = self.audit.append(event);
        if (written.is_err() || self.observer.is_some())
            && let Ok(_lock) = store::lock(&self.dir)
        {
            if let Err(err) = written {
                self.audit_failed(&err, Some(event));
            }
            self.changed();
        }
    }

    /// Appends an audit line for a change already made (caller holds the lock): a line
    /// that cannot be written is a warning and a count, the change stands.
    fn audit_done(&self, event: &Event) {
        if let Err(err) = self.audit.append(event) {
            self.audit_failed(&err, Some(event));
        }
    }

    /// Counts an audit line not written (caller holds the lock), and puts `line`, where it
    /// belongs to the trail, into gpupin's own stderr (the journal under systemd, the
    /// engine's log for a hook: `log::AUDIT_FALLBACK`, written whatever the log level),
    /// so that the trail survives in one place while the audit log cannot take it.
    fn audit_failed(&self, err: &crate::state::audit::WriteError, line: Option<&Event>) {
        match line {
            Some(event) => {
                let line = serde_json::to_string(event).unwrap_or_default();
                tracing::error!(target: crate::base::log::AUDIT_FALLBACK, error = %crate::base::message::one_line(err), line = %line, "audit line not written");
            }
            None => {
                tracing::warn!(error = %crate::base::message::one_line(err), "audit line not written")
            }
        }
        store::failures::count_audit_write_failure(&self.dir);
    }

    /// How long a holder may stay without a pid before it counts as stale.
    /// How long a holder may wait for its process before it counts as gone.
    pub fn unbound_grace(&self) -> Duration {
        self.unbound_grace
    }

    /// Whether `record` is stale by this ledger's rules.
    pub fn is_stale(&self, record: &Record) -> bool {
        record.is_stale(SystemTime::now(), self.unbound_grace)
    }

    /// The ids of `records` that are stale by this ledger's rules, in one look: each
    /// holder's process asked of /proc once (what the observers redo after every change).
    pub(crate) fn stale_ids<'r>(
        &self,
        records: &'r [Record],
    ) -> std::collections::HashSet<&'r str> {
        let now = SystemTime::now();
        let mut look = crate::base::procinfo::Liveness::default();
        records
            .iter()
            .filter(|r| r.is_stale_in(now, self.unbound_grace, &mut look))
            .map(|r| r.id.as_str())
            .collect()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every record, live or stale. Records are replaced by rename, so a read without the
    /// lock sees each record whole.
    pub fn records(&self) -> Result<Vec<Record>, LedgerError> {
        store::read_records(&self.dir)
    }

    /// Gives `holder` GPUs for `request`, or returns what it already holds (a retried
    /// create). Stale holders are reaped first. Requests that wait (`gpupin.wait`) go
    /// through `allocate_waiting`; while any waits, others are refused rather than let
    /// overtake them. Nothing is written on error.
    pub fn allocate(
        &self,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: HolderMeta,
    ) -> Result<Allocation, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        if let Some(allocation) = self.allocate_on_index(holder, request, machine, &meta)? {
            return Ok(allocation);
        }
        let records = store::read_records(&self.dir)?;
        if let Some(existing) = records.iter().find(|r| r.id == holder.as_str())
            && let Some(allocation) = self.again(existing, request, machine, &meta)?
        {
            return Ok(allocation);
        }
        let live = self.reap(records, SystemTime::now())?;
        let ahead = self.ahead()?;
        let occupancy = Occupancy::of(&live);
        let held = Held {
            records: &live,
            occupancy: &occupancy,
        };
        let allocation = self.commit(holder, request, machine, meta, held, &ahead)?;
        self.index_anew(live, &allocation);
        Ok(allocation)
    }

    /// After an allocation decided on the records (`live`, read whole under the lock and
    /// reaped): where no index matches them (none yet, or a change it missed), one is
    /// written now, with the new holder. Only after a grant: a refusal writes nothing.
    fn index_anew(&self, mut live: Vec<Record>, allocation: &Allocation) {
        if store::index::load(&self.dir).is_none() {
            live.push(allocation.record.clone());
            store::index::rebuild(&self.dir, &live);
        }
    }

    /// The waiters an allocation must not overtake. A parked ticket (a waiter held back
    /// only by its own user's limit) is in no one's way; the others only where this
    /// request would take a GPU they could use.
    fn ahead(&self) -> Result<Vec<queue::Ticket>, LedgerError> {
        Ok(queue::live_tickets(&self.dir)?
            .into_iter()
            .filter(|t| !t.parked)
            .collect())
    }

    /// `allocate` decided on the index (`store::index`) instead of the records: the same
    /// answer at 10,000 holders as at none, for what most allocations are: a new holder,
    /// nested in none, on a ledger none of whose holders is stale. `None`: the records
    /// decide (no index that is theirs, a stale holder to reap, a name asked again, a
    /// nested request), and so does every refusal, whose message names holders and which a
    /// reap could turn into a grant. Caller holds the lock.
    fn allocate_on_index(
        &self,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: &HolderMeta,
    ) -> Result<Option<Allocation>, LedgerError> {
        if request.within.is_some() {
            return Ok(None);
        }
        let Some(index) = store::index::load_fresh(&self.dir, self.unbound_grace) else {
            return Ok(None);
        };
        if store::read_holder(&self.dir, holder)?.is_some() {
            return Ok(None);
        }
        let held = Held {
            records: &[],
            occupancy: index.occupancy(),
        };
        let ahead = self.ahead()?;
        match self.commit(holder, request, machine, meta.clone(), held, &ahead) {
            Ok(allocation) => Ok(Some(allocation)),
            Err(LedgerError::Decide(_) | LedgerError::QueueAhead { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Plans and writes one allocation; the caller holds the lock. `held`: the live
    /// holders (their records where read, see `Held`). `ahead`: the waiters
    /// this request must not overtake: it is refused (`QueueAhead`) when it would take a
    /// GPU one of them could use (`queue::Ticket::wants`).
    fn commit(
        &self,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: HolderMeta,
        held: Held,
        ahead: &[queue::Ticket],
    ) -> Result<Allocation, LedgerError> {
        // Processes seen on the GPUs before the lock, or before a wait in the queue, that
        // have ended since are in no one's way.
        reserved_for_gpupin(holder, &meta)?;
        let running = machine.processes.map(crate::host::whose::still_running);
        // The GPUs out of allocation, as they stand under the lock.
        let fences = store::fences::load(&self.dir)?;
        let machine = &Machine {
            processes: running.as_deref(),
            fenced: Some(&fences),
            ..*machine
        };
        let cursor = store::read_cursor(&self.dir);
        // The node's secret is read only for a request that presents a key.
        let mut secret = None;
        let mut opens = |parent: &Record, key: &WithinKey| -> Result<bool, LedgerError> {
            if secret.is_none() {
                secret = Some(within::NodeSecret::load_or_create(&self.dir)?);
            }
            Ok(secret.as_ref().is_some_and(|s| s.opens(parent, key)))
        };
        let scope =
            decide::scope::scope(holder, request, machine, &meta, held.records, &mut opens)?;
        let plan = decide::plan::plan(holder, request, machine, held, cursor, &scope)
            .map_err(|e| e.naming(&meta))?;
        decide::scope::check(&meta, machine, held.occupancy, &plan.uuids)?;
        let taking = decide::plan::gpus_of_units(&plan.uuids, machine.inventory);
        let in_the_way = ahead.iter().filter(|t| t.could_use_any(&taking)).count();
        if in_the_way > 0 {
            tracing::debug!(holder = %holder, waiting = in_the_way, "others wait in the queue ahead for these GPUs");
            return Err(LedgerError::QueueAhead {
                id: holder.to_string(),
                waiting: in_the_way,
            });
        }
        let record = Record {
            id: holder.to_string(),
            // One per UUID; a MIG instance's is its GPU's, so that the audit trail names
            // the parent beside the instance's UUID.
            indices: plan
                .uuids
                .iter()
                .filter_map(|u| unit_index(machine.inventory, u))
                .collect(),
            gpus: plan.uuids.clone(),
            kind: meta.kind,
            owner: meta.owner,
            container: meta.container,
            until_release: meta.until_release,
            mode: match request.share {
                Share::Exclusive => Mode::Exclusive,
                Share::Shared => Mode::Shared,
            },
            request: request.clone(),
            source: meta.source,
            start_time: meta.pid.and_then(crate::base::procinfo::start_time),
            pid: meta.pid,
            bundle: meta.bundle,
            claim_digest: meta.claim_digest,
            salt: within::new_salt()?,
            created_at: record::unix_now(),
            cgroups: Vec::new(),
            expires_at: meta.expires_at,
            reason: meta.reason,
            memory_limit: None,
        };
        store::write_record(&self.dir, &holder.file_name(), &record)?;
        let event = match record.kind {
            HolderKind::Hold => EventKind::Hold,
            HolderKind::Container | HolderKind::Exec => EventKind::Allocate,
        };
        let mut audited = Event::for_record(event, &record);
        if let Some(reason) = &record.reason {
            audited = audited.because(reason.clone());
        }
        if let Err(source) = self.audit.append(&audited) {
            // Under "refuse" the allocation is undone, so its line is no part of the
            // trail: only counted (its refusal's line is the trail's).
            let kept = (self.audit.on_failure != AuditFailure::Refuse).then_some(&audited);
            self.audit_failed(&source, kept);
            // Under "refuse" nothing is held that the trail does not show: the record
            // goes again, and the requester is told which log and which key.
            if self.audit.on_failure == AuditFailure::Refuse {
                store::remove_record(&self.dir, &holder.file_name())?;
                self.changed();
                return Err(LedgerError::AuditFailed {
                    id: holder.to_string(),
                    source,
                });
            }
        }
        // The record is the allocation; the cursor only a hint for the next one. Failing
        // here (a full disk) would fail an allocation that is already written.
        let _ = store::write_cursor(&self.dir, plan.next_cursor);
        self.changed();
        tracing::debug!(
            holder = %holder,
            gpus = ?record.gpus,
            mode = ?record.mode,
            pid = ?record.pid,
            "allocated"
        );
        Ok(Allocation { record })
    }

    /// What `request` would get now, without allocating (`gpupin pick`).
    pub fn preview(
        &self,
        request: &GpuRequest,
        machine: &Machine,
    ) -> Result<Vec<String>, LedgerError> {
        self.preview_from(request, machine, None).map(|p| p.uuids)
    }

    /// [`Ledger::preview`], with the GPUs the policy chose from (`gpupin pick --explain`).
    /// `asker`: whose request it would be, so that the answer is what their `gpupin exec`
    /// would get: their groups' GPUs only, and a refusal where it would take them past a
    /// limit (root: none).
    pub fn preview_from(
        &self,
        request: &GpuRequest,
        machine: &Machine,
        asker: Option<&crate::model::holder::Owner>,
    ) -> Result<Preview, LedgerError> {
        // On the index where it is the records' own and none of them is stale (as
        // `allocate`); a refusal is said from the records, which name the holders.
        if request.within.is_none()
            && let Some(index) = store::index::load_fresh(&self.dir, self.unbound_grace)
        {
            let held = Held {
                records: &[],
                occupancy: index.occupancy(),
            };
            if let Ok(preview) = self.preview_on(request, machine, asker, held) {
                return Ok(preview);
            }
        }
        let records = store::read_records(&self.dir)?;
        let now = SystemTime::now();
        let mut look = crate::base::procinfo::Liveness::default();
        let live: Vec<Record> = records
            .into_iter()
            .filter(|r| !r.is_stale_in(now, self.unbound_grace, &mut look))
            .collect();
        let occupancy = Occupancy::of(&live);
        let held = Held {
            records: &live,
            occupancy: &occupancy,
        };
        self.preview_on(request, machine, asker, held)
    }

    /// `preview_from` on the live holders `held`.
    fn preview_on(
        &self,
        request: &GpuRequest,
        machine: &Machine,
        asker: Option<&crate::model::holder::Owner>,
        held: Held,
    ) -> Result<Preview, LedgerError> {
        let holder = HolderId::new("gpupin-pick").expect("a valid id");
        let cursor = store::read_cursor(&self.dir);
        let fences = store::fences::load(&self.dir)?;
        let machine = &Machine {
            fenced: Some(&fences),
            ..*machine
        };
        // A preview takes nothing: it shows what a holder's GPUs would give whoever may
        // enter it, and so asks for no key.
        let looking = HolderMeta {
            kind: HolderKind::Hold,
            limited: asker.is_some_and(|o| o.uid != 0),
            owner: asker.cloned(),
            ..HolderMeta::default()
        };
        let scope = decide::scope::scope::<LedgerError>(
            &holder,
            request,
            machine,
            &looking,
            held.records,
            &mut |_, _| Ok(false),
        )?;
        let plan = decide::plan::plan(&holder, request, machine, held, cursor, &scope)?;
        decide::scope::check(&looking, machine, held.occupancy, &plan.uuids)?;
        Ok(Preview {
            uuids: plan.uuids,
            free: plan.free,
        })
    }

    /// The rotation cursor `spread` starts from: the position after the last GPU handed
    /// out. For callers that choose without allocating, as `preview` does.
    pub fn cursor(&self) -> usize {
        store::read_cursor(&self.dir)
    }

    /// A holder id asked again. A container's retried create, or a hold made again for the
    /// same user (a retried Slurm prolog), gets the same GPUs; an exec'd job never shares
    /// its name with another holder, and no one takes over someone else's.
    /// `None`: the name is free to allocate anew (its old holder is stale, and reaped with
    /// the others).
    fn again(
        &self,
        existing: &Record,
        request: &GpuRequest,
        machine: &Machine,
        meta: &HolderMeta,
    ) -> Result<Option<Allocation>, LedgerError> {
        let same_owner =
            existing.owner.as_ref().map(|o| o.uid) == meta.owner.as_ref().map(|o| o.uid);
        let retry = match meta.kind {
            HolderKind::Container => existing.kind == HolderKind::Container,
            HolderKind::Hold => existing.kind == HolderKind::Hold && same_owner,
            HolderKind::Exec => false,
        };
        if retry {
            // A retried hold names its GPUs again: the record must hold exactly those,
            // never others it happens to have (a Slurm prolog would hand its job GPUs
            // Slurm gave no one, and leave Slurm's free in the ledger).
            if let crate::input::request::Selection::Devices(keys) = &request.selection
                && meta.kind == HolderKind::Hold
                && !self.is_stale(existing)
            {
                let asked: Vec<String> = resolve_devices(keys, machine.inventory)?
                    .into_iter()
                    .map(|p| machine.inventory.gpus[p].uuid.clone())
                    .collect();
                if !same_set(&asked, &existing.gpus) {
                    return Err(LedgerError::HeldOtherwise {
                        id: existing.id.clone(),
                        held: index_list(machine, &existing.gpus),
                        asked: index_list(machine, &asked),
                    });
                }
            }
            return self.rebind(existing.clone(), meta.clone()).map(Some);
        }
        if self.is_stale(existing) {
            return Ok(None);
        }
        Err(LedgerError::HolderExists {
            id: existing.id.clone(),
            kind: existing.kind.as_str(),
            owner: existing
                .owner
                .as_ref()
                .map_or_else(|| "no user".to_string(), |o| o.user.clone()),
        })
    }

    /// A holder asked again: same GPUs; a pid learnt since is recorded. A retried create
    /// of a holder that has no process yet brings a new claim secret (its spec is written
    /// anew); the old one dies with the spec it was written into.
    fn rebind(&self, mut record: Record, meta: HolderMeta) -> Result<Allocation, LedgerError> {
        let before = record.clone();
        if meta.pid.is_some() && meta.pid != record.pid {
            record.pid = meta.pid;
            record.start_time = meta.pid.and_then(crate::base::procinfo::start_time);
        }
        if record.pid.is_none() && meta.claim_digest.is_some() {
            record.claim_digest = meta.claim_digest;
        }
        if record != before {
            let id = HolderId::new(&record.id)?;
            store::write_record(&self.dir, &id.file_name(), &record)?;
        }
        // A retried create: the holder id is validated, the record's id is that id.
        tracing::debug!(
            holder = %record.id,
            gpus = ?record.gpus,
            pid = ?record.pid,
            "already held: the same GPUs again"
        );
        Ok(Allocation { record })
    }

    /// Removes every stale holder, every entry of holders/ that cannot be anyone's
    /// record, and the temp files of dead writers. Corrupt records under a holder's name
    /// are left: they may hold GPUs of a live container, and only an operator who has
    /// looked at them should remove them (`gpupin release`).
    pub fn gc(&self) -> Result<GcReport, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let scan = store::scan_holders(&self.dir)?;
        let mut cleared = Vec::new();
        for (path, _) in &scan.stray {
            if self.clear(path, "")? {
                tracing::info!(path = ?path, "cleared a stray ledger entry");
                cleared.push(path.clone());
            }
        }
        let before = scan.records.clone();
        let live = self.reap(scan.records, SystemTime::now())?;
        let released = before
            .into_iter()
            .filter(|r| !live.iter().any(|l| l.id == r.id))
            .collect();
        for path in &scan.leftovers {
            if self.clear(path, " (from an earlier boot)")? {
                cleared.push(path.clone());
            }
        }
        // Job cgroups whose holder is gone and whose remover went away too (a killed
        // `gpupin exec`, a daemon that died).
        cleared.extend(crate::host::confine::remove_orphans(&|id| {
            live.iter().any(|r| r.id == id)
        }));
        cleared.extend(queue::drop_stale_tickets(&self.dir)?);
        cleared.extend(store::remove_dead_temps(&self.dir)?);
        for sub in [store::HOLDERS_DIR, queue::QUEUE_DIR] {
            if let Some(sub) = store::existing_subdir(&self.dir, sub)? {
                cleared.extend(store::remove_dead_temps(&sub)?);
            }
        }
        // `holders/` read whole and cleared: the index starts again from it, unless a
        // record that does not read may hold GPUs no count could show.
        if scan.corrupt.is_empty() {
            store::index::rebuild(&self.dir, &live);
        }
        // Whatever was reaped or not: what follows the ledger is brought in line.
        self.changed();
        Ok(GcReport {
            released,
            cleared,
            left: scan.corrupt,
        })
    }

    /// Removes the entry at `path`, whatever it is, never following it, with an audit
    /// line (`why` follows the name). `false`: it was gone already. Caller holds the lock.
    fn clear(&self, path: &Path, why: &str) -> Result<bool, LedgerError> {
        let kind = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta.file_type(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(LedgerError::Io {
                    action: "inspecting",
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        store::remove_entry(path, kind)?;
        let name = path.file_name().unwrap_or_default().as_bytes();
        self.audit_done(
            &Event::new(EventKind::Clear, &store::audit_name(name))
                .because(format!("nobody's record{why}")),
        );
        self.changed();
        Ok(true)
    }

    /// Deletes stale records (caller holds the lock) and returns the live ones.
    fn reap(&self, records: Vec<Record>, now: SystemTime) -> Result<Vec<Record>, LedgerError> {
        let mut live = Vec::with_capacity(records.len());
        let mut look = crate::base::procinfo::Liveness::default();
        for record in records {
            if record.is_stale_in(now, self.unbound_grace, &mut look) {
                let id = HolderId::new(&record.id)?;
                // The line before the removal (see `remove_entry`).
                self.audit_done(&Event::for_record(EventKind::Reap, &record).held_since(&record));
                store::remove_record(&self.dir, &id.file_name())?;
                // Stale means its cgroups are empty: nobody else removes them now.
                let _ = crate::host::confine::remove_dirs(&record.cgroups);
                self.changed();
                tracing::info!(
                    holder = %id,
                    pid = ?record.pid,
                    gpus = ?record.gpus,
                    "reaped a stale holder"
                );
            } else {
                live.push(record);
            }
        }
        Ok(live)
    }
}

/// What `Ledger::gc` did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Stale holders whose records were removed.
    pub released: Vec<Record>,
    /// Entries that could be nobody's record, and temp files of dead writers, removed.
    pub cleared: Vec<PathBuf>,
    /// Corrupt records left in place (`CorruptRecord`, which says how to remove each).
    pub left: Vec<LedgerError>,
}

#[cfg(test)]
pub(super) mod tests;

#[cfg(test)]
mod tests_jobs;

#[cfg(test)]
mod tests_foreign;

#[cfg(test)]
mod tests_queue;

#[cfg(test)]
mod tests_mig;

#[cfg(test)]
mod tests_index;

#[cfg(test)]
mod tests_fence;
