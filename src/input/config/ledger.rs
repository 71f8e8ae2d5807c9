//! What the ledger is opened with: its lock directory and the keys of the config that
//! govern it (`state_dir`, `claim_grace`, the audit log, `queue`). `Config` builds it
//! (`Config::ledger_settings`); a bare directory with every default is
//! `LedgerSettings::at`, for tests and tools.

use super::{AuditLog, DEFAULT_CLAIM_GRACE, QueueOrder};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The audit log of a ledger opened without a config: in its own directory.
pub(super) const LEDGER_AUDIT_FILE: &str = "audit.log";

/// What the ledger is opened with (`Ledger::open`, `Ledger::open_read_only`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSettings {
    /// The lock directory (`state_dir`).
    pub dir: PathBuf,
    /// How long a holder may wait for its process before it counts as gone
    /// (`claim_grace`).
    pub claim_grace: Duration,
    /// Where its audit lines go.
    pub audit: AuditLog,
    /// In which order waiters are served (`queue`).
    pub queue: QueueOrder,
}

impl LedgerSettings {
    /// The ledger in `dir` with every default, its audit lines in `dir`'s own
    /// `audit.log`.
    pub fn at(dir: &Path) -> LedgerSettings {
        LedgerSettings {
            dir: dir.to_path_buf(),
            claim_grace: DEFAULT_CLAIM_GRACE,
            audit: AuditLog::at(dir.join(LEDGER_AUDIT_FILE)),
            queue: QueueOrder::default(),
        }
    }
}
