//! Reading the audit trail back: the rotated files oldest first, then the live one, a line
//! at a time (the files together may be hundreds of MiB, so nothing reads them whole).
//!
//! Every file is opened as the writer opens it (`regular`, never through a symlink, never
//! a FIFO). A line that does not parse is skipped and counted, not fatal: one torn or
//! foreign line must not hide the rest of the machine's history.

use super::Event;
use crate::base::safe_open::{self, Links};
use crate::input::config::AuditLog;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("refusing audit log {}: a symlink (gpupin never reads or writes the log through one)", path.display())]
    Link { path: PathBuf },
    #[error("audit log {} was rotated while gpupin read it, {tries} times over; run the command again", path.display())]
    Rotated { path: PathBuf, tries: usize },
    #[error("reading audit log {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One event of the log, with its time read and its line as written (`gpupin log --json`
/// prints the line, so that fields a later gpupin adds are kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub at: SystemTime,
    pub event: Event,
    pub line: String,
}

/// The events of a log in the order they were written; see `AuditLog::events`.
pub struct Events {
    /// The log, its refusals (`AuditLog::refusals`), then each user's (`AuditLog::of_user`).
    streams: Vec<Stream>,
    /// The next event of each stream, read ahead to merge them by time.
    heads: Vec<Option<Result<Entry, ReadError>>>,
    started: bool,
}

/// The events of one log's files, oldest file first.
struct Stream {
    files: VecDeque<PathBuf>,
    open: Option<(PathBuf, Lines)>,
    unreadable: usize,
    /// Which lines are parsed at all (`AuditLog::events_where`).
    could_be: CouldBe,
}

/// A test of a raw line: could it hold an event the reader wants (see `prefilter`)?
type CouldBe = std::rc::Rc<dyn Fn(&[u8]) -> bool>;

impl AuditLog {
    /// Every event of the rotated files and the live one, and of the refusals log and the
    /// users' logs beside them, oldest first (by time; in the order written within a log). A file that does
    /// not exist has no events (a machine where nothing happened yet, or a file rotated
    /// away while this reads); any other failure ends the iteration with an error.
    pub fn events(&self) -> Events {
        self.events_where(|_| true)
    }

    /// `events`, parsing only the lines `could_be` says could hold an event the reader
    /// wants (`Filter::line_test`, `usage::could_end_in`); the others are skipped as
    /// read, neither parsed nor counted unreadable. A year of a busy box is 750,000 lines
    /// and most readers want few of them.
    pub fn events_where(&self, could_be: impl Fn(&[u8]) -> bool + 'static) -> Events {
        let could_be: CouldBe = std::rc::Rc::new(could_be);
        let mut streams = vec![
            Stream::new(self.files(), could_be.clone()),
            Stream::new(self.refusals().files(), could_be.clone()),
        ];
        for uid in self.user_logs() {
            streams.push(Stream::new(self.of_user(uid).files(), could_be.clone()));
        }
        Events {
            heads: streams.iter().map(|_| None).collect(),
            streams,
            started: false,
        }
    }
}

impl Events {
    /// Lines skipped so far because they were no event (not JSON, not UTF-8, a time
    /// gpupin cannot have written, an event kind this gpupin does not know).
    pub fn unreadable(&self) -> usize {
        self.streams.iter().map(|s| s.unreadable).sum()
    }
}

impl Iterator for Events {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if !self.started {
            self.started = true;
            for (head, stream) in self.heads.iter_mut().zip(&mut self.streams) {
                *head = stream.next();
            }
        }
        // An error ends everything: the caller reports it rather than half a history.
        if let Some(i) = self.heads.iter().position(|h| matches!(h, Some(Err(_)))) {
            let err = self.heads[i].take();
            self.heads.iter_mut().for_each(|h| *h = None);
            return err;
        }
        let (i, _) = self
            .heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| match h {
                Some(Ok(entry)) => Some((i, entry.at)),
                _ => None,
            })
            .min_by_key(|&(i, at)| (at, i))?;
        let entry = self.heads[i].take();
        self.heads[i] = self.streams[i].next();
        entry
    }
}

impl Stream {
    fn new(files: Vec<PathBuf>, could_be: CouldBe) -> Stream {
        Stream {
            files: files.into(),
            open: None,
            unreadable: 0,
            could_be,
        }
    }

    /// The next event of the file open now, or `None` at its end.
    fn next_in_file(&mut self) -> Option<Result<Entry, ReadError>> {
        let (path, lines) = self.open.as_mut()?;
        loop {
            match lines.next_line() {
                Ok(None) => return None,
                Ok(Some((_, line))) => match wanted(line, &*self.could_be) {
                    Wanted::Skipped => {}
                    Wanted::Unreadable => self.unreadable += 1,
                    Wanted::Event(entry) => return Some(Ok(entry)),
                },
                Err(source) => {
                    let path = path.clone();
                    return Some(Err(ReadError::Io { path, source }));
                }
            }
        }
    }
}

impl Iterator for Stream {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.next_in_file() {
                if item.is_err() {
                    self.files.clear();
                    self.open = None;
                }
                return Some(item);
            }
            let path = self.files.pop_front()?;
            match open_log(&path) {
                Ok(Some(file)) => match Lines::of(file, 0, u64::MAX) {
                    Ok(lines) => self.open = Some((path, lines)),
                    Err(source) => {
                        self.files.clear();
                        self.open = None;
                        return Some(Err(ReadError::Io { path, source }));
                    }
                },
                Ok(None) => self.open = None,
                Err(err) => {
                    self.files.clear();
                    self.open = None;
                    return Some(Err(err));
                }
            }
        }
    }
}

/// The lines of one file of the log between two byte offsets, each with its offset:
/// `usage` reads a file in parts (`state::usage::digest` covers its start), and only up to
/// where it first looked (a line appended since is read next time, or never twice).
pub(crate) struct Lines {
    reader: BufReader<io::Take<File>>,
    at: u64,
    line: Vec<u8>,
}

impl Lines {
    /// The lines of `file` from byte `from` (a line's start) up to byte `to`.
    pub(crate) fn of(mut file: File, from: u64, to: u64) -> io::Result<Lines> {
        use std::io::{Read, Seek, SeekFrom};
        file.seek(SeekFrom::Start(from))?;
        Ok(Lines {
            reader: BufReader::new(file.take(to.saturating_sub(from))),
            at: from,
            line: Vec::new(),
        })
    }

    /// The next line (with its newline, where it has one) and its offset; `None` at the end.
    pub(crate) fn next_line(&mut self) -> io::Result<Option<(u64, &[u8])>> {
        self.line.clear();
        let read = self.reader.read_until(b'\n', &mut self.line)?;
        if read == 0 {
            return Ok(None);
        }
        let at = self.at;
        self.at += read as u64;
        Ok(Some((at, &self.line)))
    }
}

/// The file at `path` and its stat, or `None` where there is none.
pub(crate) fn open_log_with_stat(
    path: &std::path::Path,
) -> Result<Option<(File, rustix::fs::Stat)>, ReadError> {
    match safe_open::open_with_stat(path, Links::Refuse) {
        Ok(opened) => Ok(Some(opened)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // O_NOFOLLOW's answer to a symlink.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(ReadError::Link {
            path: path.to_path_buf(),
        }),
        Err(source) => Err(ReadError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The file at `path`, or `None` where there is none.
pub(super) fn open_log(path: &std::path::Path) -> Result<Option<File>, ReadError> {
    Ok(open_log_with_stat(path)?.map(|(file, _)| file))
}

/// What one raw line is to a reader that wants the lines `could_be` lets through.
// Returned and matched at once, never stored: boxing the entry would allocate per event.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Wanted {
    /// Blank, or ruled out by its bytes: neither parsed nor counted.
    Skipped,
    /// Parsed, and no event: counted as unreadable.
    Unreadable,
    Event(Entry),
}

/// The one test every reader of raw lines applies, in this order: blank lines skipped,
/// then `could_be`, then the parse.
pub(crate) fn wanted(line: &[u8], could_be: &dyn Fn(&[u8]) -> bool) -> Wanted {
    if line.trim_ascii().is_empty() || !could_be(line) {
        return Wanted::Skipped;
    }
    match parse_line(line) {
        Some(entry) => Wanted::Event(entry),
        None => Wanted::Unreadable,
    }
}

/// One line of the log as an event; `None` for a line that is none.
pub(super) fn parse_line(bytes: &[u8]) -> Option<Entry> {
    let line = std::str::from_utf8(bytes)
        .ok()?
        .trim_end_matches(['\n', '\r']);
    let event: Event = serde_json::from_str(line).ok()?;
    Some(Entry {
        at: event.at()?,
        event,
        line: line.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::audit::EventKind;
    use std::fs;
    use std::path::Path;

    fn line(holder: &str) -> String {
        format!(r#"{{"time":"2024-05-01T12:00:00Z","event":"release","holder":"{holder}"}}"#)
    }

    fn holders(log: &AuditLog) -> (Vec<String>, usize) {
        let mut events = log.events();
        let holders = events.by_ref().map(|e| e.unwrap().event.holder).collect();
        (holders, events.unreadable())
    }

    fn write(path: &Path, lines: &[String]) {
        fs::write(path, lines.join("\n") + "\n").unwrap();
    }

    #[test]
    fn rotated_files_come_first_oldest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        write(&tmp.path().join("audit.log.2"), &[line("a"), line("b")]);
        write(&tmp.path().join("audit.log.1"), &[line("c")]);
        write(&log.path, &[line("d"), line("e")]);
        let (holders, unreadable) = holders(&log);
        assert_eq!(holders, ["a", "b", "c", "d", "e"]);
        assert_eq!(unreadable, 0);
    }

    #[test]
    fn a_line_that_is_no_event_is_skipped_and_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        let bad_time = r#"{"time":"yesterday","event":"release","holder":"x"}"#;
        let unknown_kind = r#"{"time":"2024-05-01T12:00:00Z","event":"explode","holder":"x"}"#;
        let mut bytes = [
            line("a"),
            "not json".into(),
            bad_time.into(),
            unknown_kind.into(),
        ]
        .join("\n")
        .into_bytes();
        bytes.extend_from_slice(b"\n\xff\xfe\n\n");
        bytes.extend_from_slice(line("b").as_bytes());
        // A last line without its newline (a file someone saved in an editor) is read too.
        fs::write(&log.path, bytes).unwrap();
        let (holders, unreadable) = holders(&log);
        assert_eq!(holders, ["a", "b"]);
        assert_eq!(unreadable, 4);
    }

    #[test]
    fn the_line_is_kept_as_written_and_the_time_read() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        let written = r#"{"time":"2024-05-01T12:00:00Z","event":"hold","holder":"h","later":1}"#;
        write(&log.path, &[written.to_string()]);
        let entry = log.events().next().unwrap().unwrap();
        assert_eq!(entry.line, written);
        assert_eq!(entry.event.event, EventKind::Hold);
        let noon = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_714_564_800);
        assert_eq!(entry.at, noon);
    }

    #[test]
    fn refusals_are_merged_in_by_time() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        let at = |t: &str, holder: &str| {
            format!(r#"{{"time":"2024-05-01T12:00:{t}Z","event":"release","holder":"{holder}"}}"#)
        };
        write(&log.path, &[at("01", "a"), at("03", "c"), at("05", "e")]);
        write(
            &tmp.path().join("audit.refusals.log"),
            &[at("02", "b"), at("03", "d"), at("09", "f")],
        );
        let (holders, unreadable) = holders(&log);
        assert_eq!(holders, ["a", "b", "c", "d", "e", "f"]);
        assert_eq!(unreadable, 0);
    }

    #[test]
    fn a_missing_log_has_no_events() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("nothing/audit.log"));
        let (holders, unreadable) = holders(&log);
        assert!(holders.is_empty());
        assert_eq!(unreadable, 0);
    }

    #[test]
    fn a_symlinked_file_is_refused_rotated_or_live() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        write(&target, &[line("secret")]);
        for name in ["audit.log.1", "audit.log"] {
            let dir = tmp.path().join(name.replace('.', "-"));
            fs::create_dir(&dir).unwrap();
            let log = AuditLog::at(dir.join("audit.log"));
            write(&log.path, &[line("live")]);
            let link = dir.join(name);
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link).unwrap();
            let results: Vec<_> = log.events().collect();
            assert_eq!(results.len(), 1, "{name}: {results:?}");
            let err = results[0].as_ref().unwrap_err();
            assert!(matches!(err, ReadError::Link { .. }), "{name}: {err}");
            assert!(
                err.to_string().contains(&link.display().to_string()),
                "{err}"
            );
        }
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &log.path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let err = log.events().next().unwrap().unwrap_err();
        assert!(err.to_string().contains("reading audit log"), "{err}");
        assert!(
            crate::base::message::one_line(&err).contains("FIFO"),
            "{err}"
        );
    }
}
