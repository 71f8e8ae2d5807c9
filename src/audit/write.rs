//! Appending to the audit log, and rotating it when it grows past its cap.
//!
//! Many processes append at once (hooks, the shim, `gpupin serve`): each line is one
//! `write(2)` to a file opened with O_APPEND, so lines never interleave. Rotation happens
//! under an flock of the log itself, and only by a writer that still has the file the path
//! names (another may have rotated it a moment ago), so no rotated file is overwritten.

use super::Event;
use crate::regular;
use rustix::fs::FlockOperation;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const DEFAULT_AUDIT_LOG: &str = "/var/log/gpupin/audit.log";
/// A line is a few hundred bytes: 64 MiB is a few hundred thousand events.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Rotated files kept beside the live one (audit.log.1 is the newest).
pub const DEFAULT_KEEP: u32 = 4;

/// Who used the machine's GPUs is as open as `gpupin status`: everyone may read the log.
/// An administrator who wants the history private makes its directory 0750 (gpupin only
/// creates the directory when it is missing and never changes its mode).
const LOG_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// Where audit lines go, and how much of them is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditLog {
    pub path: PathBuf,
    /// The size past which the log is rotated.
    pub max_bytes: u64,
    /// Rotated files kept; 0 truncates the log instead.
    pub keep: u32,
}

impl AuditLog {
    /// A log at `path` with the default cap and rotation.
    pub fn at(path: impl Into<PathBuf>) -> AuditLog {
        AuditLog {
            path: path.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
        }
    }

    /// The live file and the rotated ones that exist, oldest first.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = (1..=self.keep.max(1))
            .rev()
            .map(|n| rotated(&self.path, n))
            .filter(|p| p.symlink_metadata().is_ok())
            .collect();
        files.push(self.path.clone());
        files
    }

    /// Appends `event`. Best effort by design: an audit line must never be the reason a
    /// container does not start, so a failure is only logged.
    pub fn append(&self, event: &Event) {
        if let Err(err) = self.try_append(event) {
            tracing::warn!(path = ?self.path, error = %err, "could not write the audit log");
        }
    }

    fn try_append(&self, event: &Event) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.ensure_dir()?;
        let mut file = regular::open_append(&self.path, LOG_MODE)?;
        if file.metadata()?.len() + line.len() as u64 > self.max_bytes {
            file = self.rotate(file)?;
        }
        file.write_all(&line)
    }

    /// Creates the log's directory when missing; refuses one that is a symlink or that
    /// others could write (they could swap the log for a link to any file root appends to).
    fn ensure_dir(&self) -> std::io::Result<()> {
        let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) else {
            return Ok(());
        };
        if dir.symlink_metadata().is_err() {
            match fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
            {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let meta = dir.symlink_metadata()?;
        let me = rustix::process::geteuid().as_raw();
        let safe = meta.is_dir()
            && meta.permissions().mode() & 0o022 == 0
            && (meta.uid() == me || meta.uid() == 0);
        if !safe {
            return Err(std::io::Error::other(format!(
                "refusing audit log directory {}: not a directory of root's that only its owner may write",
                dir.display()
            )));
        }
        Ok(())
    }

    /// Rotates the log `file` is open on, unless another writer has just done so; returns
    /// the file to append to.
    fn rotate(&self, file: fs::File) -> std::io::Result<fs::File> {
        rustix::fs::flock(&file, FlockOperation::LockExclusive)?;
        let still_ours = fs::symlink_metadata(&self.path)
            .and_then(|now| file.metadata().map(|open| now.ino() == open.ino()))
            .unwrap_or(false);
        if !still_ours {
            return regular::open_append(&self.path, LOG_MODE);
        }
        if file.metadata()?.len() <= self.max_bytes / 2 {
            // Rotated and refilled a little while this writer waited for the lock.
            return Ok(file);
        }
        if self.keep == 0 {
            file.set_len(0)?;
            return Ok(file);
        }
        for n in (1..self.keep).rev() {
            let from = rotated(&self.path, n);
            if from.symlink_metadata().is_ok() {
                fs::rename(&from, rotated(&self.path, n + 1))?;
            }
        }
        fs::rename(&self.path, rotated(&self.path, 1))?;
        // The flock goes with the old file; writers still holding it append there, which
        // keeps their lines (in audit.log.1).
        regular::open_append(&self.path, LOG_MODE)
    }
}

fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::EventKind;

    fn lines(path: &Path) -> Vec<Event> {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn appends_one_json_object_a_line_and_creates_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("log/gpupin/audit.log"));
        log.append(&Event::new(EventKind::Release, "c1").because("a\nb"));
        log.append(&Event::new(EventKind::Reap, "c2"));
        let text = fs::read_to_string(&log.path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        let events = lines(&log.path);
        assert_eq!(events[0].holder, "c1");
        assert_eq!(events[0].reason.as_deref(), Some("a\nb"));
        assert_eq!(events[1].event, EventKind::Reap);
        let mode = fs::metadata(&log.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, LOG_MODE);
    }

    #[test]
    fn rotates_past_the_cap_and_keeps_as_many_files_as_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog {
            path: tmp.path().join("audit.log"),
            max_bytes: 300,
            keep: 2,
        };
        for i in 0..20 {
            log.append(&Event::new(EventKind::Release, &format!("holder{i:02}")));
        }
        let files = log.files();
        assert_eq!(
            files,
            [
                tmp.path().join("audit.log.2"),
                tmp.path().join("audit.log.1"),
                tmp.path().join("audit.log")
            ]
        );
        for f in &files {
            assert!(fs::metadata(f).unwrap().len() <= 300, "{f:?}");
        }
        let kept: Vec<String> = files
            .iter()
            .flat_map(|f| lines(f))
            .map(|e| e.holder)
            .collect();
        assert_eq!(kept.last().unwrap(), "holder19");
        let mut sorted = kept.clone();
        sorted.sort();
        assert_eq!(kept, sorted, "oldest file first, lines in order");
        assert!(!tmp.path().join("audit.log.3").exists());
    }

    #[test]
    fn never_writes_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("audit.log")).unwrap();
        AuditLog::at(tmp.path().join("audit.log")).append(&Event::new(EventKind::Hold, "h"));
        assert_eq!(fs::read_to_string(&target).unwrap(), "");
    }
}
