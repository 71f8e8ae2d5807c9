//! `gpupin log --follow`: the lines written to the live audit log, its refusals log and
//! its users' logs since the last look, as `tail -F` would give them: a file rotated
//! away (renamed to `.1`, a new one in its place) is read from the start of the new one, and a line not
//! written whole yet waits for its end.

use super::read::{Entry, ReadError, Wanted, open_log, wanted};
use crate::input::config::AuditLog;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// One followed file: where it was read to, and which file that was.
struct Followed {
    path: PathBuf,
    file: Option<File>,
    inode: u64,
    partial: Vec<u8>,
}

/// The live log, the refusals log and the users' logs, followed from their ends at
/// `AuditLog::tail`; a user's log that appears later, from its start.
pub struct Tail {
    log: AuditLog,
    files: Vec<Followed>,
    unreadable: usize,
}

impl AuditLog {
    /// Follows the live log, its refusals log and its users' logs from where they end now.
    pub fn tail(&self) -> Result<Tail, ReadError> {
        let mut files = Vec::new();
        let users = self
            .user_logs()
            .into_iter()
            .map(|uid| self.of_user(uid).path);
        for path in [self.path.clone(), self.refusals().path]
            .into_iter()
            .chain(users)
        {
            let mut followed = Followed {
                path,
                file: None,
                inode: 0,
                partial: Vec::new(),
            };
            followed.reopen()?;
            if let Some(file) = &mut followed.file {
                let _ = file.seek(SeekFrom::End(0));
            }
            files.push(followed);
        }
        Ok(Tail {
            log: self.clone(),
            files,
            unreadable: 0,
        })
    }
}

impl Followed {
    /// Opens the file now at `path` (none yet: nothing to read).
    fn reopen(&mut self) -> Result<(), ReadError> {
        self.file = open_log(&self.path)?;
        self.inode = self
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.ino());
        self.partial.clear();
        Ok(())
    }

    /// Whether another file took the path's place (rotation) or one appeared.
    fn replaced(&self) -> bool {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => self.file.is_none() || meta.ino() != self.inode,
            Err(_) => false,
        }
    }

    /// The whole lines written since the last read.
    fn read_new(&mut self) -> Result<Vec<Vec<u8>>, ReadError> {
        let mut lines = Vec::new();
        self.drain(&mut lines)?;
        if self.replaced() {
            // The rest of the old file was read above; the new one from its start.
            self.reopen()?;
            self.drain(&mut lines)?;
        }
        Ok(lines)
    }

    fn drain(&mut self, lines: &mut Vec<Vec<u8>>) -> Result<(), ReadError> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|source| ReadError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.partial.extend_from_slice(&bytes);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            lines.push(line);
        }
        Ok(())
    }
}

impl Tail {
    /// The events written since the last call, oldest first.
    pub fn poll(&mut self) -> Result<Vec<Entry>, ReadError> {
        // A user's first holder since the tail began starts a log of theirs: every line
        // in it is new.
        for uid in self.log.user_logs() {
            let path = self.log.of_user(uid).path;
            if !self.files.iter().any(|f| f.path == path) {
                self.files.push(Followed {
                    path,
                    file: None,
                    inode: 0,
                    partial: Vec::new(),
                });
            }
        }
        let mut entries = Vec::new();
        for followed in &mut self.files {
            for line in followed.read_new()? {
                match wanted(&line, &|_| true) {
                    Wanted::Skipped => {}
                    Wanted::Unreadable => self.unreadable += 1,
                    Wanted::Event(entry) => entries.push(entry),
                }
            }
        }
        entries.sort_by_key(|e| e.at);
        Ok(entries)
    }

    /// Lines skipped so far because they were no event.
    pub fn unreadable(&self) -> usize {
        self.unreadable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn line(holder: &str) -> String {
        format!(
            "{{\"time\":\"2024-05-01T12:00:00Z\",\"event\":\"release\",\"holder\":\"{holder}\"}}\n"
        )
    }

    fn append(path: &std::path::Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn holders(tail: &mut Tail) -> Vec<String> {
        tail.poll()
            .unwrap()
            .into_iter()
            .map(|e| e.event.holder)
            .collect()
    }

    #[test]
    fn only_new_whole_lines_and_a_rotated_log_from_its_start() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        append(&log.path, &line("before"));
        let mut tail = log.tail().unwrap();
        assert!(holders(&mut tail).is_empty(), "what was there is not new");
        append(&log.path, &line("a"));
        let half = line("b");
        append(&log.path, &half[..10]);
        assert_eq!(holders(&mut tail), ["a"]);
        append(&log.path, &half[10..]);
        assert_eq!(holders(&mut tail), ["b"]);
        // Rotation: the live file renamed to .1 after one more line, a new one made.
        append(&log.path, &line("c"));
        std::fs::rename(&log.path, tmp.path().join("audit.log.1")).unwrap();
        append(&log.path, &line("d"));
        assert_eq!(holders(&mut tail), ["c", "d"]);
        append(&log.refusals().path, &line("refused"));
        append(&log.path, "not json\n");
        assert_eq!(holders(&mut tail), ["refused"]);
        assert_eq!(tail.unreadable(), 1);
    }

    #[test]
    fn a_log_that_does_not_exist_yet_is_followed_once_it_does() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        let mut tail = log.tail().unwrap();
        assert!(holders(&mut tail).is_empty());
        append(&log.path, &line("first"));
        assert_eq!(holders(&mut tail), ["first"]);
    }
}
