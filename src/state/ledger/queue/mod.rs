//! The wait queue for `gpupin.wait`: a ticket file per waiting request, served in arrival
//! order (`queue = "fifo"`) or round-robin by user (`"fair"`, `served_order`). A waiter
//! holds no lock while it sleeps; under the lock it only checks whether it is at the head
//! and whether its request fits now. A ticket whose process is gone (a
//! runtime killed the hook at its timeout) is stale and dropped.
//!
//! A ticket names the GPUs its waiter could ever take (`Ticket::wants`), and holds back
//! only a request that would take one of those: a waiter for a named GPU, a model, a MIG
//! profile or a holder's GPUs is in the way of no request for other GPUs, while a waiter
//! for a plain count keeps its turn against every request for a GPU it could use.
//!
//! A waiter held back only by its own user's limit is *parked*: its ticket says so, and
//! it is in no one's way (neither ahead of another waiter nor of a request that does not
//! wait), so that one user's limit never stalls the node. It is still served in its turn
//! among the parked; once its limit passes and only GPUs are missing, it unparks and
//! waits as any other. One user has at most `limits.max_waiting_per_user` tickets.

mod wait_reason;

pub use wait_reason::WaitReason;

use super::store;
use crate::base::procinfo;
use crate::base::safe_open::{self, Links};
use crate::input::config::QueueOrder;
use crate::input::request::{GpuRequest, Selection};
use crate::model::holder::HolderId;
use crate::state::ledger::decide::{self, Allocation, DecideError, Machine};
use crate::state::ledger::record::{HolderMeta, Record, unix_now};
use crate::state::ledger::{Ledger, LedgerError};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

pub(super) const QUEUE_DIR: &str = "queue";
const SEQ_FILE: &str = "queue-seq";
/// The last turn served (`next_turn`'s round). Lost with the state dir at boot, when
/// nothing waits anyway; a round read as 0 only lets new tickets in early, never starves.
const ROUND_FILE: &str = "queue-round";
/// How often a waiter looks again. Short enough that a freed GPU is taken well within a
/// second, long enough that a few waiters cost nothing.
const POLL: Duration = Duration::from_millis(200);
/// A waiter takes the lock only when `holders/` or `queue/` changed since its last look
/// (their mtimes, read without the lock), or after this long: a holder whose process
/// ended changes no directory, and is reaped by a look under the lock. Hundreds of
/// waiters then do not keep the lock busy that every container's hook takes.
const LOOK_AGAIN: Duration = Duration::from_secs(5);
/// A directory changed this recently may change again within the same mtime tick
/// (tmpfs stamps with a coarse clock): look again until it is older.
const RECENT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Ticket {
    pub seq: u64,
    pub id: String,
    pub pid: i32,
    pub start_time: Option<u64>,
    /// Seconds since the Unix epoch when it started waiting (metrics: the oldest wait).
    #[serde(default)]
    pub queued_at: u64,
    /// The user the request is for, when it has one (containers have none): the bound
    /// on tickets per user counts these.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Held back only by its own user's limit: in no one's way (see the module's doc).
    #[serde(default)]
    pub parked: bool,
    /// Its turn under `queue = "fair"` (`next_turn`); set whatever the order, so that a
    /// change of `queue` finds every ticket with one. A ticket from before turns reads 0:
    /// first, as it was already.
    #[serde(default)]
    pub turn: u64,
    /// What `gpupin queue` and `status` show of the waiter: the name people know it by
    /// (a container's), whose it is, and what it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default)]
    pub request: String,
    /// The GPUs (UUIDs; a MIG instance's GPU) it could ever take (`allocate::wanted_gpus`):
    /// only a request for one of these waits behind it. `None` (a ticket from before, or
    /// a request whose scope did not resolve): every GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wants: Option<Vec<String>>,
    /// The process that asked (a `gpupin exec`, a hook's container), for `gpupin queue`:
    /// `pid` is the waiter, which for a user's request is `gpupin serve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_pid: Option<i32>,
    /// Why it still waits, as its waiter's last look found (`None` before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<WaitReason>,
}

/// A request waiting in the queue, for `gpupin queue`, `status` and `metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub holder: String,
    /// Seconds since the Unix epoch.
    pub queued_at: u64,
    /// A container's name where its engine told it.
    pub name: Option<String>,
    /// The user it is for (containers have none).
    pub user: Option<String>,
    /// `GpuRequest::summary`.
    pub request: String,
    /// Held back only by its own user's limit: nobody waits behind it.
    pub parked: bool,
    /// The process that asked, where the ticket says.
    pub pid: Option<i32>,
    /// Why it waits, as its waiter's last look found; `None` before the first.
    pub reason: Option<WaitReason>,
}

impl From<Ticket> for Waiting {
    fn from(t: Ticket) -> Waiting {
        Waiting {
            holder: t.id,
            queued_at: t.queued_at,
            name: t.name,
            user: t.user,
            request: t.request,
            parked: t.parked,
            pid: t.caller_pid,
            reason: t.reason,
        }
    }
}

impl Ticket {
    /// Whether this waiter could use any of `gpus`: a request taking one of them would
    /// overtake it.
    pub(super) fn could_use_any(&self, gpus: &[String]) -> bool {
        self.wants
            .as_ref()
            .is_none_or(|wants| gpus.iter().any(|g| wants.contains(g)))
    }

    pub(super) fn file_name(&self) -> String {
        // Zero-padded so that name order is arrival order.
        format!("{:020}-{}.json", self.seq, self.id)
    }
}

/// Live tickets in arrival order; stale ones are removed. Caller holds the lock.
pub(super) fn live_tickets(dir: &Path) -> Result<Vec<Ticket>, LedgerError> {
    Ok(scan_tickets(dir)?.0)
}

/// Drops the tickets no waiter can be served through any more; returns their paths.
/// Caller holds the lock (gc: a waiter killed while it waited leaves its ticket).
pub(super) fn drop_stale_tickets(dir: &Path) -> Result<Vec<PathBuf>, LedgerError> {
    Ok(scan_tickets(dir)?.1)
}

/// Live tickets in arrival order, and the stale ones it removed.
fn scan_tickets(dir: &Path) -> Result<(Vec<Ticket>, Vec<PathBuf>), LedgerError> {
    let Some(qdir) = store::existing_subdir(dir, QUEUE_DIR)? else {
        return Ok((Vec::new(), Vec::new()));
    };
    let mut tickets = Vec::new();
    let mut removed = Vec::new();
    for (path, _) in store::list(&qdir)? {
        if path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
        {
            continue;
        }
        match live_ticket(&path) {
            Some(t) => tickets.push(t),
            None => {
                if fs::remove_file(&path).is_ok() {
                    removed.push(path);
                }
            }
        }
    }
    tickets.sort_by_key(|t| t.seq);
    Ok((tickets, removed))
}

/// The ticket at `path` while its waiter lives; `None` for a stale one. Not a regular
/// file (a FIFO would block here, under the lock) is no ticket, and one that does not
/// parse is as stale as one whose waiter died: nobody can be served through it.
fn live_ticket(path: &Path) -> Option<Ticket> {
    safe_open::read(path, Links::Refuse)
        .ok()
        .and_then(|t| serde_json::from_slice::<Ticket>(&t).ok())
        .filter(|t| t.start_time.is_some_and(|s| procinfo::is_alive(t.pid, s)))
}

/// The order `tickets` (in arrival order) are served in. `Fifo`: as they are. `Fair`: by
/// turn (`next_turn`), then arrival.
pub(super) fn served_order(mut tickets: Vec<Ticket>, order: QueueOrder) -> Vec<Ticket> {
    if order == QueueOrder::Fair {
        // Stable, and the tickets came in arrival order: within a turn, arrival.
        tickets.sort_by_key(|t| t.turn);
    }
    tickets
}

/// The turn of a new ticket of `party` under `fair`: one after the later of the round
/// (the last turn served) and the party's last turn among `waiting`. So each party's
/// first waiting request is served in the next round, its second in the one after, and
/// so on: a user's second request goes behind every other user's first, and a user who
/// queues again the moment one request is served does not go ahead of another's second
/// (a turn of its own counted afresh would, and could keep it waiting for ever). A party
/// is a user (by uid); the requests that have none (containers without a trusted user
/// label) are one party together, so that a flood of them counts as one user, and a node
/// that only runs containers serves them in arrival order.
pub(super) fn next_turn(round: u64, waiting: &[Ticket], party: Option<u32>) -> u64 {
    let last = waiting
        .iter()
        .filter(|t| t.uid == party)
        .map(|t| t.turn)
        .max()
        .unwrap_or(0);
    round.max(last) + 1
}

/// The live tickets that are not parked and come before `own` in `order`: the waiters it
/// must not overtake where it would take a GPU they could use. Caller holds the lock.
fn tickets_ahead(dir: &Path, own: &Ticket, order: QueueOrder) -> Result<Vec<Ticket>, LedgerError> {
    Ok(live_tickets(dir)?
        .into_iter()
        .filter(|t| !t.parked && t.seq != own.seq)
        .filter(|t| match order {
            QueueOrder::Fifo => t.seq < own.seq,
            QueueOrder::Fair => (t.turn, t.seq) < (own.turn, own.seq),
        })
        .collect())
}

/// Queues `holder` behind every live ticket, for as long as process `waiter` lives.
/// A request for a limited user who has `max_waiting` tickets already is refused.
/// Caller holds the lock.
pub(super) fn enqueue(
    dir: &Path,
    holder: &HolderId,
    request: &GpuRequest,
    waiter: i32,
    meta: &HolderMeta,
    max_waiting: u32,
    wants: Option<Vec<String>>,
) -> Result<Ticket, LedgerError> {
    let qdir = store::ensure_subdir(dir, QUEUE_DIR)?;
    let tickets = live_tickets(dir)?;
    // Root's own requests are not limited; containers have no user to count.
    let uid = meta.owner.as_ref().map(|o| o.uid);
    if let (true, Some(owner)) = (meta.limited, &meta.owner) {
        let waiting = tickets.iter().filter(|t| t.uid == uid).count();
        if waiting >= max_waiting as usize {
            return Err(LedgerError::TooManyWaiting {
                id: holder.to_string(),
                user: owner.user.clone(),
                waiting,
                limit: max_waiting,
            });
        }
    }
    // queue-seq may be lost or unreadable: the tickets themselves say how far it got,
    // and a new ticket must sort after all of them.
    let last_ticket = tickets.last().map_or(0, |t| t.seq);
    let seq = store::read_number::<u64>(&dir.join(SEQ_FILE))
        .unwrap_or(0)
        .max(last_ticket)
        + 1;
    store::write_atomic(dir, SEQ_FILE, format!("{seq}\n").as_bytes())?;
    let round = store::read_number::<u64>(&dir.join(ROUND_FILE)).unwrap_or(0);
    let pid = waiter;
    let ticket = Ticket {
        seq,
        id: holder.to_string(),
        pid,
        start_time: procinfo::start_time(pid),
        queued_at: unix_now(),
        uid,
        parked: false,
        turn: next_turn(round, &tickets, uid),
        name: meta.container.as_ref().and_then(|c| c.name.clone()),
        user: meta.owner.as_ref().map(|o| o.user.clone()),
        request: request.summary(),
        wants,
        caller_pid: meta.pid,
        reason: None,
    };
    write_ticket(&qdir, &ticket)?;
    Ok(ticket)
}

fn write_ticket(qdir: &Path, ticket: &Ticket) -> Result<(), LedgerError> {
    let text = serde_json::to_vec(ticket).expect("tickets serialize");
    store::write_atomic(qdir, &ticket.file_name(), &text)
}

/// The mtimes of `holders/` and `queue/`: what changes when a record or a ticket comes
/// or goes. Read without the lock. Only how soon a waiter looks again rests on it (a look
/// every `LOOK_AGAIN` and one at expiry happen whatever it says), so a mutant of it or of
/// `recent` (cargo mutants: a constant stamp, `recent` always or never true, its
/// comparisons turned) changes latency alone: equivalent but for time, which no test
/// here asserts.
fn stamp(dir: &Path) -> [Option<SystemTime>; 2] {
    let mtime = |sub: &str| {
        fs::symlink_metadata(dir.join(sub))
            .and_then(|m| m.modified())
            .ok()
    };
    [mtime(store::HOLDERS_DIR), mtime(QUEUE_DIR)]
}

/// Whether a stamp shows a change so recent that another may follow unseen.
fn recent(stamp: &[Option<SystemTime>; 2]) -> bool {
    stamp
        .iter()
        .flatten()
        .any(|t| t.elapsed().map_or(true, |age| age < RECENT))
}

/// How many GPUs `request` adds at most, to ask the limits about a request that did not
/// get as far as a plan (`None`: it names GPUs, or all).
fn count_of(request: &GpuRequest) -> Option<usize> {
    match &request.selection {
        Selection::Count(n) => Some(*n as usize),
        Selection::Devices(d) => Some(d.len()),
        Selection::All => None,
    }
}

/// Moves the round on to `ticket`'s turn, now that it is served (caller holds the lock).
/// Best effort: the allocation stands, and a round left behind only lets the next new
/// tickets in a turn early.
fn served(dir: &Path, ticket: &Ticket) {
    let round = store::read_number::<u64>(&dir.join(ROUND_FILE)).unwrap_or(0);
    if ticket.turn > round {
        let _ = store::write_atomic(dir, ROUND_FILE, format!("{}\n", ticket.turn).as_bytes());
    }
}

fn dequeue(dir: &Path, ticket: &Ticket) {
    if let Ok(Some(qdir)) = store::existing_subdir(dir, QUEUE_DIR) {
        let _ = fs::remove_file(qdir.join(ticket.file_name()));
    }
}

/// Errors that can go away when other holders leave.
fn retryable(err: &LedgerError) -> bool {
    match err {
        // GPUs that no release would make fit (MIG mode, model, memory, scope) never do.
        LedgerError::Decide(DecideError::NotEnoughFree { wanted, ever, .. }) => wanted <= ever,
        LedgerError::Decide(
            DecideError::DeviceUnavailable { .. } | DecideError::MigUnavailable(_),
        ) => true,
        // More instances of a profile than the machine has never fit (the geometry
        // changes only with a new inventory, which a new request reads).
        LedgerError::Decide(DecideError::NotEnoughMig(e)) => e.wanted <= e.matching,
        // The requester's other holders may end; a request over the limit by itself never fits.
        LedgerError::Decide(DecideError::LimitReached(r)) => r.wanted <= r.limit as usize,
        _ => false,
    }
}

impl Ledger {
    /// The requests waiting now, in the order they are served (`served_order`: oldest
    /// first, or round-robin by user). Read without the lock: tickets are renamed into
    /// place, and one that goes meanwhile is simply not counted.
    pub fn waiting(&self) -> Result<Vec<Waiting>, LedgerError> {
        let Some(qdir) = store::existing_subdir(&self.dir, QUEUE_DIR)? else {
            return Ok(Vec::new());
        };
        let mut tickets: Vec<Ticket> = store::list(&qdir)?
            .into_iter()
            .filter(|(path, _)| {
                !path
                    .file_name()
                    .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
            })
            .filter_map(|(path, _)| safe_open::read(&path, Links::Refuse).ok())
            .filter_map(|t| serde_json::from_slice::<Ticket>(&t).ok())
            .filter(|t| t.start_time.is_some_and(|s| procinfo::is_alive(t.pid, s)))
            .collect();
        tickets.sort_by_key(|t| t.seq);
        Ok(served_order(tickets, self.queue_order)
            .into_iter()
            .map(Waiting::from)
            .collect())
    }

    /// As `allocate`, but waits up to `wait` for the request to fit, behind every request
    /// ahead of it in the queue's order that is not parked.
    pub fn allocate_waiting(
        &self,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: HolderMeta,
        wait: Duration,
    ) -> Result<Allocation, LedgerError> {
        let deadline = Instant::now() + wait;
        let max_waiting = machine
            .limits
            .map_or(crate::model::limits::DEFAULT_MAX_WAITING, |l| {
                l.max_waiting()
            });
        let mut last = None;
        let mut ticket = {
            let _lock = store::lock(&self.dir)?;
            let records = store::read_records(&self.dir)?;
            if let Some(existing) = records.iter().find(|r| r.id == holder.as_str())
                && let Some(allocation) = self.again(existing, request, machine, &meta)?
            {
                return Ok(allocation);
            }
            // The ticket lives as long as the process that waits (`gpupin serve` itself
            // for its callers, whose connection `still_wanted` watches).
            let waiter = std::process::id() as i32;
            // What it could ever take: its scope read as if its key opened the holder (a
            // wrong key is refused at the first look below, and the ticket goes).
            let now = SystemTime::now();
            let mut look = crate::base::procinfo::Liveness::default();
            let live: Vec<Record> = records
                .iter()
                .filter(|r| !r.is_stale_in(now, self.unbound_grace, &mut look))
                .cloned()
                .collect();
            let wants = decide::scope::scope::<DecideError>(
                holder,
                request,
                machine,
                &meta,
                &live,
                &mut |_, _| Ok(true),
            )
            .ok()
            .map(|scope| decide::plan::wanted_gpus(request, machine, &scope));
            let mut ticket = enqueue(
                &self.dir,
                holder,
                request,
                waiter,
                &meta,
                max_waiting,
                wants,
            )?;
            // The first look under the same lock: a waiter held back by its own limit is
            // parked before anyone could count it as ahead.
            match self.look(&mut ticket, holder, request, machine, &meta) {
                Ok(Some(allocation)) => return Ok(allocation),
                Ok(None) => {}
                // (A mutant that calls every error retryable here only delays the same
                // refusal by one poll: the loop's look gets it again and ends.)
                Err(err) if retryable(&err) => last = Some(err),
                Err(err) => {
                    dequeue(&self.dir, &ticket);
                    return Err(err);
                }
            }
            ticket
        };
        tracing::debug!(
            holder = %holder,
            ticket = ticket.seq,
            parked = ticket.parked,
            wait = %humantime::format_duration(wait),
            "queued"
        );
        let queued_at = Instant::now();
        let mut seen = stamp(&self.dir);
        let mut looked = Instant::now();
        loop {
            std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
            let gone = !ticket
                .start_time
                .is_some_and(|s| procinfo::is_alive(ticket.pid, s));
            let unwanted = meta.still_wanted.as_ref().is_some_and(|w| !(w.0)());
            if gone || unwanted {
                let _lock = store::lock(&self.dir)?;
                dequeue(&self.dir, &ticket);
                return Err(match gone {
                    true => LedgerError::WaiterGone {
                        id: holder.to_string(),
                        pid: ticket.pid,
                    },
                    false => LedgerError::CallerGone {
                        id: holder.to_string(),
                    },
                });
            }
            let now = stamp(&self.dir);
            let expired = Instant::now() >= deadline;
            // Which of the first three holds changes only how soon it looks (mutants of
            // `!=`, the first `||` and `>=` are equivalent but for time); `expired` and
            // the periodic look (a holder whose process ended changes no directory) are
            // what the tests hold it to.
            if now != seen || recent(&now) || looked.elapsed() >= LOOK_AGAIN || expired {
                seen = now;
                looked = Instant::now();
                // The machine as it is now (read before the lock: NVML may be slow): a
                // GPU a process of no holder took during the wait is not handed out.
                let figures = meta.figures_now.as_ref().map(|f| (f.0)());
                let now_machine = match &figures {
                    Some(f) => Machine {
                        live: f.live.as_deref().or(machine.live),
                        processes: f.processes.as_deref().or(machine.processes),
                        ..*machine
                    },
                    None => *machine,
                };
                match self.try_from_queue(&mut ticket, holder, request, &now_machine, &meta) {
                    Ok(Some(allocation)) => {
                        tracing::debug!(
                            holder = %holder,
                            waited_ms = queued_at.elapsed().as_millis() as u64,
                            "served from the queue"
                        );
                        return Ok(allocation);
                    }
                    Ok(None) => {}
                    Err(err) if retryable(&err) => last = Some(err),
                    Err(err) => {
                        let _lock = store::lock(&self.dir)?;
                        dequeue(&self.dir, &ticket);
                        return Err(err);
                    }
                }
            }
            if expired {
                let _lock = store::lock(&self.dir)?;
                dequeue(&self.dir, &ticket);
                return Err(LedgerError::WaitExpired {
                    id: holder.to_string(),
                    waited: humantime::format_duration(wait).to_string(),
                    last: last.map_or("others were waiting ahead".into(), |e| e.to_string()),
                });
            }
        }
    }

    /// One look under the lock: `None` while others are ahead.
    fn try_from_queue(
        &self,
        ticket: &mut Ticket,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: &HolderMeta,
    ) -> Result<Option<Allocation>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        // Its owner or root took it out of the queue (`cancel`).
        let path = self.dir.join(QUEUE_DIR).join(ticket.file_name());
        self.cancelled_while_waiting(&path, &ticket.id, ticket.queued_at)?;
        self.look(ticket, holder, request, machine, meta)
    }

    /// `try_from_queue`'s look; the caller holds the lock. A ticket is served when every
    /// ticket ahead of it is parked; a refusal by its own user's limit parks it, and one
    /// for want of GPUs with the limit passing unparks it.
    fn look(
        &self,
        ticket: &mut Ticket,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: &HolderMeta,
    ) -> Result<Option<Allocation>, LedgerError> {
        let ahead = tickets_ahead(&self.dir, ticket, self.queue_order)?;
        let records = store::read_records(&self.dir)?;
        let live: Vec<Record> = self.reap(records, SystemTime::now())?;
        let occupancy = decide::occupancy::Occupancy::of(&live);
        let held = decide::occupancy::Held {
            records: &live,
            occupancy: &occupancy,
        };
        match self.commit(holder, request, machine, meta.clone(), held, &ahead) {
            Ok(allocation) => {
                dequeue(&self.dir, ticket);
                served(&self.dir, ticket);
                self.index_anew(live, &allocation);
                Ok(Some(allocation))
            }
            Err(err) => {
                // Held back by a limit (even where GPUs are missing too): parked, in no
                // one's way; a waiter ahead (`QueueAhead`) leaves it as it was.
                let reason = match &err {
                    // No plan came about: would the limit have let it through?
                    LedgerError::Decide(
                        DecideError::NotEnoughFree { .. }
                        | DecideError::DeviceUnavailable { .. }
                        | DecideError::NotEnoughMig(_)
                        | DecideError::MigUnavailable(_),
                    ) => self
                        .over_limit(request, machine, meta, &live)
                        .or_else(|| WaitReason::of_refusal(&err, request)),
                    _ => WaitReason::of_refusal(&err, request),
                };
                let parked = match &reason {
                    Some(WaitReason::Ahead { .. }) | None => ticket.parked,
                    Some(reason) => reason.is_limit(),
                };
                // A refusal that gives no reason leaves the last one.
                let reason = reason.or_else(|| ticket.reason.clone());
                if parked != ticket.parked || reason != ticket.reason {
                    if reason != ticket.reason
                        && let Some(why) = &reason
                    {
                        tracing::info!(holder = %holder, why = %why, "waits");
                    }
                    ticket.parked = parked;
                    ticket.reason = reason;
                    let qdir = store::ensure_subdir(&self.dir, QUEUE_DIR)?;
                    write_ticket(&qdir, ticket)?;
                    tracing::debug!(holder = %holder, parked, "ticket looked at");
                }
                match err {
                    // A waiter ahead could use the GPUs it would take: its turn first.
                    LedgerError::QueueAhead { .. } => Ok(None),
                    err => Err(err),
                }
            }
        }
    }

    /// The limit (the user's own or a group's) that `request`, taking as many GPUs as it
    /// asks for, would take its user past (a request that names all GPUs is never parked).
    /// A request `within` a holder takes that holder's GPUs: inside one of the user's own
    /// it adds none to their count (as `scope::check` counts), so their limit never holds
    /// it back, and parking it would only let later waiters overtake it. Elsewhere it takes
    /// GPUs nobody holds.
    fn over_limit(
        &self,
        request: &GpuRequest,
        machine: &Machine,
        meta: &HolderMeta,
        live: &[Record],
    ) -> Option<WaitReason> {
        let n = count_of(request)?;
        let parent = request
            .within
            .as_ref()
            .and_then(|w| live.iter().find(|r| &r.id == w));
        let mut probe: Vec<String> = parent
            .iter()
            .flat_map(|p| p.gpus.iter().take(n).cloned())
            .collect();
        // Names no record holds: each counts as a GPU the user does not hold yet. (Past the
        // holder's own GPUs the request never fits; it is counted as before.)
        probe.extend((probe.len()..n).map(|i| format!("\0gpupin-probe-{i}")));
        let held = decide::occupancy::Occupancy::of(live);
        match decide::scope::check(meta, machine, &held, &probe) {
            Err(err) => WaitReason::of_limit(&err),
            Ok(_) => None,
        }
    }
}
