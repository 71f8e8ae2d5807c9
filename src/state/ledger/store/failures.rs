//! The count of audit lines that could not be written, kept in the state dir so that
//! every process (hooks, the shim, the daemon) adds to one figure (`gpupin metrics`:
//! `gpupin_audit_write_failures_total`).

use std::path::Path;

pub(crate) const AUDIT_FAILURES_FILE: &str = "audit-write-failures";

/// The audit lines that could not be written, as counted in `state_dir`.
pub(crate) fn audit_write_failures(state_dir: &Path) -> u64 {
    crate::base::safe_open::read_to_string(
        &state_dir.join(AUDIT_FAILURES_FILE),
        crate::base::safe_open::Links::Refuse,
    )
    .ok()
    .and_then(|t| t.trim().parse().ok())
    .unwrap_or(0)
}

/// Counts one audit line that could not be written. The ledger calls it under its lock,
/// so that no count is lost to a concurrent one. Best effort: the state dir is a tmpfs
/// of its own by default, so a full log disk does not stop it.
pub(crate) fn count_audit_write_failure(state_dir: &Path) {
    let n = audit_write_failures(state_dir) + 1;
    let path = state_dir.join(AUDIT_FAILURES_FILE);
    if let Err(error) = crate::base::atomic::replace(
        &path,
        format!("{n}\n").as_bytes(),
        0o644,
        crate::base::atomic::Durability::Renamed,
    ) {
        tracing::warn!(file = ?path, error = %error, "could not count an audit write failure");
    }
}
