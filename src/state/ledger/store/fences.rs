//! `<state_dir>/fences.json`: the GPUs out of allocation (`model::fence`). Written under
//! the lock, by rename after an fsync (a drain must outlive a crash where the state dir
//! outlives one); read on every allocation, so an absent file (no fence, the common case)
//! costs one failed open. Like a record, the file must be root's or gpupin's own user's,
//! a regular file no one else may write, opened without following a link: whoever could
//! write it could keep every GPU from everyone. One that fails that, or does not parse, is
//! refused, and so is every allocation while it stands: a fence silently dropped would
//! hand out a GPU an admin took out.

use super::super::LedgerError;
use super::FILE_MODE;
use crate::base::atomic::{self, Durability};
use crate::base::safe_open::{self, Links};
use crate::model::fence::Fences;
use std::path::Path;

pub(in crate::state::ledger) const FENCES_FILE: &str = "fences.json";

/// The fences in `dir`, without those a reboot ended (`Fences::after_boot`).
pub(in crate::state::ledger) fn load(dir: &Path) -> Result<Fences, LedgerError> {
    let path = dir.join(FENCES_FILE);
    let refused = |reason: String| LedgerError::CorruptFences {
        path: path.clone(),
        reason,
    };
    let (file, stat) = match safe_open::open_with_stat(&path, Links::Refuse) {
        Ok(opened) => opened,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Fences::default()),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            return Err(refused(e.to_string()));
        }
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(refused("a symlink".into()));
        }
        Err(source) => {
            return Err(LedgerError::Io {
                action: "reading",
                path,
                source,
            });
        }
    };
    safe_open::written_by_us(&stat).map_err(refused)?;
    let bytes =
        safe_open::read_file(file, stat.st_size as u64).map_err(|e| refused(e.to_string()))?;
    let fences: Fences = serde_json::from_slice(&bytes).map_err(|e| refused(e.to_string()))?;
    Ok(fences.after_boot(crate::base::procinfo::boot_time()))
}

/// Writes `fences` (removes the file when there are none). Caller holds the lock.
pub(in crate::state::ledger) fn store(dir: &Path, fences: &Fences) -> Result<(), LedgerError> {
    let path = dir.join(FENCES_FILE);
    if fences.is_empty() {
        return match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LedgerError::Io {
                action: "removing",
                path,
                source,
            }),
        };
    }
    let mut text = serde_json::to_string_pretty(fences).expect("fences serialize");
    text.push('\n');
    atomic::replace(&path, text.as_bytes(), FILE_MODE, Durability::Synced).map_err(|e| {
        LedgerError::Io {
            action: "writing",
            path: e.path,
            source: e.source,
        }
    })
}
