//! `audit_log`, `audit_max_bytes`, `audit_keep` and `audit_failure` in the config: where
//! the audit trail goes and what an allocation does when it cannot be written. Writing
//! and reading the trail is `state::audit`'s.

use std::path::PathBuf;

pub(crate) const DEFAULT_AUDIT_LOG: &str = "/var/log/gpupin/audit.log";
/// A line is a few hundred bytes: 64 MiB is a few hundred thousand events.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Rotated files kept beside the live one (audit.log.1 is the newest).
pub(crate) const DEFAULT_KEEP: u32 = 4;
/// What an allocation does when its audit line cannot be written (`audit_failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AuditFailure {
    /// The allocation is undone and refused: nothing is held that the trail does not
    /// show. For a log on a file system of its own: elsewhere any local user who fills
    /// the file system (through any world-writable directory on it) stops every
    /// allocation on the node.
    Refuse,
    /// The default: the allocation goes on; the line goes to gpupin's own log instead
    /// (stderr, the journal under systemd), the failure is counted
    /// (`gpupin_audit_write_failures_total`, alert `GpupinAuditWriteFailures`).
    #[default]
    Warn,
}

impl AuditFailure {
    pub fn parse(text: &str) -> Option<AuditFailure> {
        match text.trim() {
            "refuse" => Some(AuditFailure::Refuse),
            "warn" => Some(AuditFailure::Warn),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuditFailure::Refuse => "refuse",
            AuditFailure::Warn => "warn",
        }
    }
}

/// Where audit lines go, and how much of them is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditLog {
    pub path: PathBuf,
    /// The size past which the log is rotated.
    pub max_bytes: u64,
    /// Rotated files kept; 0 truncates the log instead.
    pub keep: u32,
    /// What an allocation does when its line cannot be written (`audit_failure`).
    pub on_failure: AuditFailure,
}

impl AuditLog {
    /// A log at `path` with the default cap and rotation.
    pub fn at(path: impl Into<PathBuf>) -> AuditLog {
        AuditLog {
            path: path.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
            on_failure: AuditFailure::default(),
        }
    }

    /// The log of refusals beside this one, capped and rotated alike: `audit.log` ->
    /// `audit.refusals.log`, any other name `<name>.refusals`.
    pub fn refusals(&self) -> AuditLog {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let name = match name.strip_suffix(".log") {
            Some(stem) => format!("{stem}.refusals.log"),
            None => format!("{name}.refusals"),
        };
        AuditLog {
            path: self.path.with_file_name(name),
            ..self.clone()
        }
    }

    /// The folder of the users' logs beside this one: `audit.users/` for `audit.log`.
    pub fn users_dir(&self) -> PathBuf {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let stem = name.strip_suffix(".log").unwrap_or(&name);
        self.path.with_file_name(format!("{stem}.users"))
    }

    /// Where `gpupin usage` keeps its digests of the log's files (`audit.digests/`).
    pub fn digests_dir(&self) -> PathBuf {
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let stem = name.strip_suffix(".log").unwrap_or(&name);
        self.path.with_file_name(format!("{stem}.digests"))
    }

    /// The log of one user's holders (`audit.users/<uid>.log`), rotated on its own, so
    /// that no user's flood of events rotates another's, or root's, out of the trail.
    pub fn of_user(&self, uid: u32) -> AuditLog {
        AuditLog {
            path: self.users_dir().join(format!("{uid}.log")),
            ..self.clone()
        }
    }
}
