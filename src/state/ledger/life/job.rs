//! Holders that are people's jobs rather than containers: an exec'd job's record moves
//! from the process that asked (`gpupin exec`) to the job it started, and through
//! `gpupin serve` a user may only touch holders that are theirs.

use crate::model::holder::HolderId;
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::record::{MemoryLimit, Record};
use crate::state::ledger::store;
use crate::state::ledger::{Ledger, LedgerError};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

impl Ledger {
    /// Moves `holder`'s record from process `from` (which asked for the GPUs) to `to` (the
    /// job it started, which the GPUs are for): the record then lives as long as the job.
    /// Refused unless the record names `from` now, so nobody else's record moves.
    ///
    /// `to_fd` is a pidfd of the job, opened when it was checked to be the caller's: the
    /// start time recorded is read from /proc and then the pidfd is checked to be alive,
    /// so it is that process's and not one that got its pid since (a pid is not reused
    /// while its process lives).
    pub fn adopt(
        &self,
        holder: &HolderId,
        from: i32,
        to: i32,
        to_fd: BorrowedFd<'_>,
    ) -> Result<Record, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let refuse = |reason: &'static str| LedgerError::NotAdopted {
            id: holder.to_string(),
            pid: to,
            reason,
        };
        let mut record =
            store::read_holder(&self.dir, holder)?.ok_or_else(|| refuse("it holds nothing"))?;
        if record.pid != Some(from) {
            return Err(refuse("its record names another process"));
        }
        let start_time = crate::base::procinfo::start_time(to)
            .filter(|_| crate::host::confine::pidfd_alive(to_fd))
            .ok_or_else(|| refuse("the job is gone"))?;
        record.pid = Some(to);
        record.start_time = Some(start_time);
        store::write_record(&self.dir, &holder.file_name(), &record)?;
        self.audit_done(&Event::for_record(EventKind::Bind, &record));
        self.changed();
        tracing::debug!(holder = %holder, from, to, "bound to the job");
        Ok(record)
    }

    /// Records the cgroups job `pid` of `holder` was confined in (`Record::cgroups`), if
    /// the record still names that process. From then on the record lasts until they
    /// are empty, and whoever releases it knows what to remove.
    pub fn record_cgroups(
        &self,
        holder: &HolderId,
        pid: i32,
        dirs: &[PathBuf],
    ) -> Result<(), LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let Some(mut record) =
            store::read_holder(&self.dir, holder)?.filter(|r| r.pid == Some(pid))
        else {
            return Err(LedgerError::NotAdopted {
                id: holder.to_string(),
                pid,
                reason: "its record names another process",
            });
        };
        record.cgroups = dirs.to_vec();
        store::write_record(&self.dir, &holder.file_name(), &record)
    }

    /// Notes on `holder`'s record (if it still names process `pid`) whether the driver
    /// enforces its memory reservation (`Record::memory_limit`).
    pub fn record_memory_limit(
        &self,
        holder: &HolderId,
        pid: i32,
        limit: MemoryLimit,
    ) -> Result<(), LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let Some(mut record) =
            store::read_holder(&self.dir, holder)?.filter(|r| r.pid == Some(pid))
        else {
            return Ok(());
        };
        record.memory_limit = Some(limit);
        store::write_record(&self.dir, &holder.file_name(), &record)
    }

    /// Releases `holder` for a requester with uid `uid`: only their own holders, unless
    /// `uid` is root's. `Ok(None)`: nothing held under that id.
    pub fn release_for(&self, holder: &HolderId, uid: u32) -> Result<Option<Record>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        if uid != 0
            && let Some(record) = store::read_holder(&self.dir, holder)?
            && record.owner.as_ref().is_none_or(|o| o.uid != uid)
        {
            return Err(crate::state::ledger::not_yours(&record, uid));
        }
        self.remove_record_locked(holder)
    }

    /// Releases `holder` if its record still names process `pid` (a job that ended):
    /// never a record the id was given to since.
    pub fn release_job(&self, holder: &HolderId, pid: i32) -> Result<Option<Record>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        match store::read_holder(&self.dir, holder)? {
            Some(r) if r.pid == Some(pid) => self.remove_record_locked(holder),
            _ => Ok(None),
        }
    }
}
