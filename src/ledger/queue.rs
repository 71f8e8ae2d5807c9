//! The wait queue for `gpupin.wait`: a ticket file per waiting request, served strictly in
//! arrival order. A waiter holds no lock while it sleeps; under the lock it only checks
//! whether it is at the head and whether its request fits now. A ticket whose process is
//! gone (a runtime killed the hook at its timeout) is stale and dropped.

use super::store;
use super::{Allocation, HolderId, HolderMeta, Ledger, LedgerError, Machine, Record};
use crate::procinfo;
use crate::regular::{self, Links};
use crate::request::GpuRequest;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

pub(super) const QUEUE_DIR: &str = "queue";
const SEQ_FILE: &str = "queue-seq";
/// How often a waiter looks again. Short enough that a freed GPU is taken well within a
/// second, long enough that a few waiters cost nothing.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Ticket {
    pub seq: u64,
    pub id: String,
    pub pid: i32,
    pub start_time: Option<u64>,
    /// Seconds since the Unix epoch when it started waiting (metrics: the oldest wait).
    #[serde(default)]
    pub queued_at: u64,
}

/// A request waiting in the queue, for `gpupin metrics` and `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub holder: String,
    /// Seconds since the Unix epoch.
    pub queued_at: u64,
}

impl Ticket {
    fn file_name(&self) -> String {
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
        // Not a regular file (a FIFO would block here, under the lock) is no ticket.
        let ticket = regular::read(&path, Links::Refuse)
            .ok()
            .and_then(|t| serde_json::from_slice::<Ticket>(&t).ok());
        match ticket {
            Some(t) if t.start_time.is_some_and(|s| procinfo::is_alive(t.pid, s)) => {
                tickets.push(t)
            }
            // A ticket that does not parse is as stale as one whose waiter died: nobody
            // can be served through it.
            _ => {
                if fs::remove_file(&path).is_ok() {
                    removed.push(path);
                }
            }
        }
    }
    tickets.sort_by_key(|t| t.seq);
    Ok((tickets, removed))
}

/// Queues `holder` behind every live ticket, for as long as process `waiter` lives.
/// Caller holds the lock.
pub(super) fn enqueue(dir: &Path, holder: &HolderId, waiter: i32) -> Result<Ticket, LedgerError> {
    let qdir = store::ensure_subdir(dir, QUEUE_DIR)?;
    // queue-seq may be lost or unreadable: the tickets themselves say how far it got,
    // and a new ticket must sort after all of them.
    let last_ticket = live_tickets(dir)?.last().map_or(0, |t| t.seq);
    let seq = store::read_number::<u64>(&dir.join(SEQ_FILE))
        .unwrap_or(0)
        .max(last_ticket)
        + 1;
    store::write_atomic(dir, SEQ_FILE, format!("{seq}\n").as_bytes())?;
    let pid = waiter;
    let ticket = Ticket {
        seq,
        id: holder.to_string(),
        pid,
        start_time: procinfo::start_time(pid),
        queued_at: super::record::unix_now(),
    };
    let text = serde_json::to_vec(&ticket).expect("tickets serialize");
    store::write_atomic(&qdir, &ticket.file_name(), &text)?;
    Ok(ticket)
}

fn dequeue(dir: &Path, ticket: &Ticket) {
    if let Ok(Some(qdir)) = store::existing_subdir(dir, QUEUE_DIR) {
        let _ = fs::remove_file(qdir.join(ticket.file_name()));
    }
}

/// Errors that can go away when other holders leave.
fn retryable(err: &LedgerError) -> bool {
    match err {
        LedgerError::NotEnoughFree { .. } | LedgerError::DeviceUnavailable { .. } => true,
        // The requester's other holders may end; a request over the limit by itself never fits.
        LedgerError::LimitReached(r) => r.wanted <= r.limit as usize,
        _ => false,
    }
}

impl Ledger {
    /// The requests waiting now, oldest first. Read without the lock: tickets are renamed
    /// into place, and one that goes meanwhile is simply not counted.
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
            .filter_map(|(path, _)| regular::read(&path, Links::Refuse).ok())
            .filter_map(|t| serde_json::from_slice::<Ticket>(&t).ok())
            .filter(|t| t.start_time.is_some_and(|s| procinfo::is_alive(t.pid, s)))
            .collect();
        tickets.sort_by_key(|t| t.seq);
        Ok(tickets
            .into_iter()
            .map(|t| Waiting {
                holder: t.id,
                queued_at: t.queued_at,
            })
            .collect())
    }

    /// As `allocate`, but waits up to `wait` for the request to fit, behind every request
    /// that started waiting earlier.
    pub fn allocate_waiting(
        &self,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: HolderMeta,
        wait: Duration,
    ) -> Result<Allocation, LedgerError> {
        let deadline = Instant::now() + wait;
        let ticket = {
            let _lock = store::lock(&self.dir)?;
            let records = store::read_records(&self.dir)?;
            if let Some(existing) = records.iter().find(|r| r.id == holder.as_str())
                && let Some(allocation) = self.again(existing, request, machine, &meta)?
            {
                return Ok(allocation);
            }
            // The ticket lives as long as its waiter: this process, or the caller that
            // `gpupin serve` waits for.
            let waiter = meta.waiter.unwrap_or(std::process::id() as i32);
            enqueue(&self.dir, holder, waiter)?
        };
        tracing::debug!(
            holder = %holder,
            ticket = ticket.seq,
            wait = %humantime::format_duration(wait),
            "queued"
        );
        let queued_at = Instant::now();
        let mut last = None;
        loop {
            match self.try_from_queue(&ticket, holder, request, machine, &meta) {
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
                    dequeue(&self.dir, &ticket);
                    return Err(err);
                }
            }
            if !ticket
                .start_time
                .is_some_and(|s| procinfo::is_alive(ticket.pid, s))
            {
                let _lock = store::lock(&self.dir)?;
                dequeue(&self.dir, &ticket);
                return Err(LedgerError::WaiterGone {
                    id: holder.to_string(),
                    pid: ticket.pid,
                });
            }
            if Instant::now() >= deadline {
                let _lock = store::lock(&self.dir)?;
                dequeue(&self.dir, &ticket);
                return Err(LedgerError::WaitExpired {
                    id: holder.to_string(),
                    waited: humantime::format_duration(wait).to_string(),
                    last: last.map_or("others were waiting ahead".into(), |e| e.to_string()),
                });
            }
            std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
        }
    }

    /// One look under the lock: `None` while others are ahead.
    fn try_from_queue(
        &self,
        ticket: &Ticket,
        holder: &HolderId,
        request: &GpuRequest,
        machine: &Machine,
        meta: &HolderMeta,
    ) -> Result<Option<Allocation>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let records = store::read_records(&self.dir)?;
        let live: Vec<Record> = self.reap(records, SystemTime::now())?;
        let tickets = live_tickets(&self.dir)?;
        if tickets.first().map(|t| t.seq) != Some(ticket.seq) {
            tracing::trace!(holder = %holder, ahead = ?tickets.first().map(|t| t.seq), "others are ahead in the queue");
            return Ok(None);
        }
        let allocation = self.commit(holder, request, machine, meta.clone(), &live)?;
        dequeue(&self.dir, ticket);
        Ok(Some(allocation))
    }
}
