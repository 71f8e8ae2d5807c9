//! A holder's entry given back under the lock: its record, or whatever else sits in
//! `holders/` under its name, with its audit line first (`remove_entry`). The ways in:
//! a holder by its id (`release`, and `release_container` for a container's own), and an
//! operator's name of one entry (`release_entry`).

use crate::base::safe_open::Links;
use crate::model::holder::{HolderId, HolderKind};
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::queue::Waiting;
use crate::state::ledger::record::Record;
use crate::state::ledger::store::{
    self,
    entry::{self, Entry},
};
use crate::state::ledger::{Ledger, LedgerError};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

impl Ledger {
    /// Whether `holder` has a record: one lstat, no lock. For callers that release only
    /// when something is held (the shim on every `delete`), so that the common case costs
    /// no lock and no ledger check.
    pub fn holds(&self, holder: &HolderId) -> bool {
        store::holders_dir(&self.dir)
            .join(holder.file_name())
            .symlink_metadata()
            .is_ok()
    }

    /// Releases `holder`'s GPUs. Returns the record it had, `None` when it held nothing.
    pub fn release(&self, holder: &HolderId) -> Result<Option<Record>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        self.remove_record_locked(holder)
    }

    /// Releases the record container `holder` made for itself, as poststop and the shim's
    /// delete do; a record of that name that is no container's (a hold, a job: a
    /// container whose id is someone else's holder id, refused at create) is left alone.
    pub fn release_container(&self, holder: &HolderId) -> Result<Option<Record>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let path = store::holders_dir(&self.dir).join(holder.file_name());
        match store::read_record(&path) {
            Ok(record) if record.kind != HolderKind::Container => {
                tracing::info!(
                    holder = %holder,
                    kind = record.kind.as_str(),
                    "a container of this id ended; the record of that name is no container's and stays"
                );
                Ok(None)
            }
            // A corrupt record is released as before: an operator would otherwise have to.
            _ => self.remove_record_locked(holder),
        }
    }

    /// `release` for a caller that holds the lock.
    pub(in crate::state::ledger) fn remove_record_locked(
        &self,
        holder: &HolderId,
    ) -> Result<Option<Record>, LedgerError> {
        match self.remove_entry(holder.file_name().as_bytes(), None)? {
            Some(Released::Holder(record)) => {
                tracing::debug!(holder = %holder, gpus = ?record.gpus, "released");
                Ok(Some(*record))
            }
            _ => {
                tracing::debug!(holder = %holder, "nothing held to release");
                Ok(None)
            }
        }
    }

    /// `gpupin release NAME`: removes the record of holder `NAME`, else the entry of
    /// `holders/` named exactly `NAME`, whatever it is (a corrupt record, a directory, a
    /// FIFO, a link: never followed). `NAME` must be one file-name component.
    pub fn release_entry(&self, name: &OsStr) -> Result<Released, LedgerError> {
        let names = entry::release_names(name)?;
        let _lock = store::lock(&self.dir)?;
        for name in names {
            if let Some(released) = self.remove_entry(&name, None)? {
                return Ok(released);
            }
        }
        Ok(Released::Nothing)
    }

    /// Removes `holders/<name>` when it exists (caller holds the lock); `reason` goes into
    /// the audit line of a holder's release (who released it, and how).
    ///
    /// A holding ends in one order everywhere (here and in `reap`): its `release` or
    /// `reap` line is appended to the audit log first, then its record is removed, both
    /// under the lock. A reader that takes the records and then the log (`gpupin usage`)
    /// so finds every holding in one or the other, or in both, which it counts once; the
    /// other order left a moment where it was in neither. Should the removal then fail
    /// (an I/O error), the next release writes the line again.
    pub(in crate::state::ledger) fn remove_entry(
        &self,
        name: &[u8],
        reason: Option<&str>,
    ) -> Result<Option<Released>, LedgerError> {
        let Some(holders) = store::existing_subdir(&self.dir, store::HOLDERS_DIR)? else {
            return Ok(None);
        };
        let path = holders.join(OsStr::from_bytes(name));
        let kind = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta.file_type(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(LedgerError::Io {
                    action: "inspecting",
                    path,
                    source,
                });
            }
        };
        let kind_of_entry = entry::classify(OsStr::from_bytes(name), kind);
        let audited = match kind_of_entry {
            Entry::Record => strip_json(name),
            _ => name.to_vec(),
        };
        // A corrupt record can still be released: that is how an operator clears it.
        let record = match kind_of_entry {
            Entry::Record => crate::base::safe_open::read_to_string(&path, Links::Refuse)
                .ok()
                .and_then(|t| serde_json::from_str::<Record>(&t).ok()),
            _ => None,
        };
        let event = match &record {
            Some(record) => {
                let event = Event::for_record(EventKind::Release, record).held_since(record);
                match reason {
                    Some(reason) => event.because(reason),
                    None => event,
                }
            }
            None => Event::new(EventKind::Release, &store::audit_name(&audited))
                .because("no readable record: the entry was removed"),
        };
        // The line first, then the removal: the order the doc above gives.
        self.audit_done(&event);
        let released = match kind_of_entry {
            Entry::Record => {
                store::remove_record(&self.dir, &String::from_utf8_lossy(name))?;
                record.map_or(Released::Entry(path), |r| Released::Holder(Box::new(r)))
            }
            _ => {
                store::remove_entry(&path, kind)?;
                Released::Entry(path)
            }
        };
        self.changed();
        Ok(Some(released))
    }
}

/// What `Ledger::release_entry` removed.
#[derive(Debug)]
pub enum Released {
    /// A holder's record, as it read.
    Holder(Box<Record>),
    /// An entry that was no readable record.
    Entry(PathBuf),
    /// Nothing: no such entry.
    Nothing,
    /// A queued request, cancelled (`cancel`).
    Request(Box<Waiting>),
}

/// A record's file name without `.json`: the holder id the audit log names.
fn strip_json(name: &[u8]) -> Vec<u8> {
    name.strip_suffix(b".json").unwrap_or(name).to_vec()
}
