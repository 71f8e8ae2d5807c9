//! Why a holder was ended: `gpupin evict` leaves a note under `ended/<holder id>.json`
//! before it stops the holder, so that the evicted job's own `gpupin exec`, which sees
//! only a signal, can tell its user who ended it and why (as Slurm's "CANCELLED BY").
//! A cancelled queued request gets one too (`cancel`), which its waiter reads. A note is
//! one small file per holder id, replaced by the next one of that id.

use crate::base::safe_open::{self, Links};
use crate::state::ledger::store;
use crate::state::ledger::{Ledger, LedgerError};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DIR: &str = "ended";
/// How long a note is kept: its reader looks right after its job died (or its wait
/// ended); each new note removes the older ones, so that `ended/` stays small.
const KEEP: Duration = Duration::from_secs(3600);

/// Who ended a holder, how and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    /// The user name of who evicted it: `root`, `bob`, `root (sudo by alice)`.
    pub by: String,
    /// `gpupin evict`.
    pub how: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Seconds since the epoch when it was written.
    pub at: u64,
}

impl Ended {
    /// `exec-1234 was ended by root (gpupin evict): maintenance`.
    pub fn line(&self, holder: &str) -> String {
        let why = self
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        format!("{holder} was ended by {} ({}){why}", self.by, self.how)
    }
}

impl Ledger {
    /// Leaves the note that `holder` is being ended by `by` with `how` (`gpupin evict`).
    pub fn note_ended(
        &self,
        holder: &str,
        by: &str,
        reason: Option<&str>,
        how: &str,
    ) -> Result<(), LedgerError> {
        let dir = store::ensure_subdir(&self.dir, DIR)?;
        let note = Ended {
            by: by.to_string(),
            how: how.to_string(),
            reason: reason.map(str::to_string),
            at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
        };
        prune(&dir);
        let bytes = serde_json::to_vec(&note).unwrap_or_default();
        store::write_atomic(&dir, &format!("{holder}.json"), &bytes)
    }

    /// Refuses to go on waiting when the ticket at `ticket` (of `holder`, queued at
    /// `queued_at`) is gone while its waiter still waits: its owner or root cancelled it
    /// (`cancel`), and the note says who. Caller holds the lock.
    pub(in crate::state::ledger) fn cancelled_while_waiting(
        &self,
        ticket: &std::path::Path,
        holder: &str,
        queued_at: u64,
    ) -> Result<(), LedgerError> {
        if std::fs::symlink_metadata(ticket).is_ok() {
            return Ok(());
        }
        let since = UNIX_EPOCH + Duration::from_secs(queued_at);
        let (by, how) = match self.ended(holder, since) {
            Some(note) => (note.by, note.how),
            // Only root can remove a ticket without a note (by hand).
            None => ("root".to_string(), "its ticket was removed".to_string()),
        };
        Err(LedgerError::Cancelled {
            id: holder.to_string(),
            by,
            how,
        })
    }

    /// The note that `holder` was ended, if one was written at `since` or later (an
    /// older note is of an earlier holder of the same id).
    pub fn ended(&self, holder: &str, since: SystemTime) -> Option<Ended> {
        if holder.contains('/') || holder.starts_with('.') {
            return None;
        }
        let path = self.dir.join(DIR).join(format!("{holder}.json"));
        let text = safe_open::read(&path, Links::Refuse).ok()?;
        let note: Ended = serde_json::from_slice(&text).ok()?;
        // Whole seconds: a note of this second counts.
        let since = since
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(1))
            .as_secs();
        (note.at >= since).then_some(note)
    }
}

/// Removes the notes older than `KEEP` (best effort: a note left is only a small file).
fn prune(dir: &std::path::Path) {
    let Ok(entries) = store::list(dir) else {
        return;
    };
    for (path, kind) in entries {
        let old = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > KEEP));
        if old {
            let _ = store::remove_entry(&path, kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::state::ledger::tests::ledger;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_note_names_who_and_why_and_an_older_one_is_not_this_holders() {
        let (_t, l) = ledger();
        let before = SystemTime::now();
        assert_eq!(l.ended("exec-7", before), None);
        l.note_ended("exec-7", "root", Some("node maintenance"), "gpupin evict")
            .unwrap();
        let note = l.ended("exec-7", before).unwrap();
        assert_eq!(
            note.line("exec-7"),
            "exec-7 was ended by root (gpupin evict): node maintenance"
        );
        let later = SystemTime::now() + Duration::from_secs(60);
        assert_eq!(l.ended("exec-7", later), None);
        assert_eq!(l.ended("../exec-7", before), None);
    }

    /// A note an hour old is gone once the next one is written: `ended/` stays small.
    #[test]
    fn an_old_note_is_removed_by_the_next() {
        let (_t, l) = ledger();
        l.note_ended("exec-1", "root", None, "gpupin evict")
            .unwrap();
        let old = l.dir().join("ended/exec-1.json");
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(7200))
            .unwrap();
        l.note_ended("exec-2", "root", None, "gpupin evict")
            .unwrap();
        assert!(!old.exists());
        assert!(l.dir().join("ended/exec-2.json").exists());
    }
}
