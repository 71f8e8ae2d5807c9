//! A digest of one file of the audit trail for `usage`: what each of its release and
//! reap lines says of its holding, what the nested ones were nested in, and where its
//! unreadable lines are. A year of a busy box is five rotated files of 64 MiB of JSON
//! lines; their digests are a few dozen bytes a holding, read instead of the lines.
//!
//! A digest covers a file from its start up to `len` (whole lines). Rotated files never
//! change, so theirs covers them whole; the live one only grows, so a digest of its start
//! stays true and the lines after it are read raw. A digest is trusted only while the file
//! it names (device and inode) still has at least `len` bytes, the same first and last 4
//! KiB of them, and (where nothing was appended) the same mtime.
//!
//! The file, JSON lines:
//! 1. `Covers`: which file, how much of it;
//! 2. `{"withins": [...]}`: the ids the nested holdings were nested in;
//! 3. `{"unreadable": [[offset, length], ...]}`: the lines a reader would parse for
//!    `usage` (`escaped`, or with `release` or `reap` in them) that are no event;
//! 4. `{"names": [...], "gpus": [[uuid, key], ...]}`: the users and GPUs the holdings
//!    name by index;
//! 5. a line per holding: `[at_secs, at_nanos, start, holder, shown, who, [gpu, ...],
//!    within]`, in the file's order.

use super::tally::{Gpu, Span};
use crate::state::audit::{Lines, Needle, Wanted, escaped, wanted};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The digest format; another is rebuilt, never misread.
const VERSION: u32 = 1;
/// The bytes at each end of what a digest covers that it keeps a hash of.
const ENDS: u64 = 4096;

/// Which file a digest is of, and how much of it (its first line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Covers {
    pub digest: u32,
    pub dev: u64,
    pub ino: u64,
    /// Bytes from the file's start: whole lines.
    pub len: u64,
    /// The file's mtime (seconds, nanoseconds) when it was read.
    pub mtime: (i64, i64),
    /// SHA-256 of the first and of the last (up to) 4 KiB of the `len` bytes.
    pub head: [u8; 32],
    pub tail: [u8; 32],
}

#[derive(Serialize, Deserialize)]
struct Withins {
    withins: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Unreadable {
    unreadable: Vec<(u64, u64)>,
}

#[derive(Serialize, Deserialize)]
struct Names {
    names: Vec<String>,
    gpus: Vec<(String, String)>,
}

/// A holding's line: see the module's comment.
#[derive(Deserialize)]
struct Holding<'a>(
    u64,
    u32,
    u64,
    #[serde(borrow)] Cow<'a, str>,
    #[serde(borrow)] Cow<'a, str>,
    u32,
    Vec<u32>,
    #[serde(borrow)] Option<Cow<'a, str>>,
);

/// What a digest says before its holdings: enough to decide what else to read.
#[derive(Debug, Clone)]
pub(super) struct Head {
    /// The first line as read: the holdings are read later only under the same.
    pub first_line: Vec<u8>,
    pub covers: Covers,
    pub withins: Vec<String>,
    pub unreadable: Vec<(u64, u64)>,
}

/// Reads a file's lines from its start up to `size` bytes (its size when it was opened)
/// and returns its digest, as the bytes to write.
pub(super) fn build(file: &File, stat: &rustix::fs::Stat) -> io::Result<Vec<u8>> {
    let size = stat.st_size as u64;
    // What `usage::could_end_in` lets through from any period on: a digest serves them all.
    let [release, reap] = [b"release".as_slice(), b"reap"].map(Needle::new);
    let could_end = |line: &[u8]| escaped(line) || release.in_(line) || reap.in_(line);
    let mut lines = Lines::of(file.try_clone()?, 0, size)?;
    let mut len = 0;
    let mut withins = BTreeSet::new();
    let mut unreadable = Vec::new();
    let mut names: HashMap<String, u32> = HashMap::new();
    let mut gpus: HashMap<(String, String), u32> = HashMap::new();
    let mut body = Vec::new();
    while let Some((at, line)) = lines.next_line()? {
        if line.last() != Some(&b'\n') {
            // A line still being written, or a last one without its newline: read raw.
            break;
        }
        len = at + line.len() as u64;
        let entry = match wanted(line, &could_end) {
            Wanted::Skipped => continue,
            Wanted::Unreadable => {
                unreadable.push((at, line.len() as u64));
                continue;
            }
            Wanted::Event(entry) => entry,
        };
        let Some(span) = super::event_span(&entry.event) else {
            continue;
        };
        let since_epoch = entry.at.duration_since(UNIX_EPOCH).unwrap_or_default();
        let next = names.len() as u32;
        let who = *names.entry(span.who.to_string()).or_insert(next);
        let gpu_indices: Vec<u32> = span
            .gpus
            .iter()
            .map(|g| {
                let next = gpus.len() as u32;
                *gpus
                    .entry((g.uuid.to_string(), g.key.to_string()))
                    .or_insert(next)
            })
            .collect();
        if let Some(within) = span.within {
            withins.insert(within.to_string());
        }
        serde_json::to_writer(
            &mut body,
            &(
                since_epoch.as_secs(),
                since_epoch.subsec_nanos(),
                span.start,
                span.holder,
                span.shown,
                who,
                gpu_indices,
                span.within,
            ),
        )?;
        body.push(b'\n');
    }
    let (head, tail) = ends(file, len)?;
    let covers = Covers {
        digest: VERSION,
        dev: stat.st_dev,
        ino: stat.st_ino,
        len,
        mtime: mtime(stat),
        head,
        tail,
    };
    let mut out = Vec::with_capacity(body.len() + 4096);
    push_line(&mut out, &covers)?;
    let withins = withins.into_iter().collect();
    push_line(&mut out, &Withins { withins })?;
    push_line(&mut out, &Unreadable { unreadable })?;
    let (names, gpus) = (by_index(names), by_index(gpus));
    push_line(&mut out, &Names { names, gpus })?;
    out.extend_from_slice(&body);
    Ok(out)
}

fn push_line(out: &mut Vec<u8>, value: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.push(b'\n');
    Ok(())
}

/// The keys of `map` in the order of their values (0, 1, ...).
fn by_index<K>(map: HashMap<K, u32>) -> Vec<K> {
    let mut all: Vec<(u32, K)> = map.into_iter().map(|(k, i)| (i, k)).collect();
    all.sort_unstable_by_key(|(i, _)| *i);
    all.into_iter().map(|(_, k)| k).collect()
}

/// SHA-256 of the first and of the last (up to) `ENDS` bytes of `file`'s first `len`.
fn ends(file: &File, len: u64) -> io::Result<([u8; 32], [u8; 32])> {
    let hash = |from: u64| -> io::Result<[u8; 32]> {
        let mut bytes = vec![0; (len - from).min(ENDS) as usize];
        file.read_exact_at(&mut bytes, from)?;
        Ok(Sha256::digest(&bytes).into())
    };
    Ok((hash(0)?, hash(len.saturating_sub(ENDS))?))
}

/// Reads a digest's head from `reader` (the digest file, at its start); `None` where it is
/// no digest of this version.
pub(super) fn read_head(reader: &mut impl BufRead) -> Option<Head> {
    let mut first_line = Vec::new();
    reader.read_until(b'\n', &mut first_line).ok()?;
    let covers: Covers = serde_json::from_slice(&first_line).ok()?;
    if covers.digest != VERSION {
        return None;
    }
    let withins: Withins = serde_json::from_slice(&next_line(reader)?).ok()?;
    let unreadable: Unreadable = serde_json::from_slice(&next_line(reader)?).ok()?;
    Some(Head {
        first_line,
        covers,
        withins: withins.withins,
        unreadable: unreadable.unreadable,
    })
}

fn next_line(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).ok()?;
    Some(line)
}

/// A file's mtime as a digest keeps it.
pub(super) fn mtime(stat: &rustix::fs::Stat) -> (i64, i64) {
    (stat.st_mtime, stat.st_mtime_nsec as i64)
}

/// Whether `head` is a digest of `file` (`stat` its stat) as it is now.
pub(super) fn matches(covers: &Covers, file: &File, stat: &rustix::fs::Stat) -> bool {
    let size = stat.st_size as u64;
    let same_file = covers.dev == stat.st_dev && covers.ino == stat.st_ino && size >= covers.len;
    // Nothing appended: nothing may have changed either.
    let same_time = size > covers.len || covers.mtime == mtime(stat);
    same_file
        && same_time
        && ends(file, covers.len)
            .is_ok_and(|(head, tail)| head == covers.head && tail == covers.tail)
}

/// Why a digest's holdings could not be read.
#[derive(Debug)]
pub(super) enum Trouble {
    /// It is not the digest it was when its head was read (rewritten meanwhile).
    Changed,
    /// It does not parse.
    Unreadable,
}

/// Reads the holdings of the digest `reader` is open on (from its start), whose head was
/// `head`, and gives each to `each` with its event's time.
pub(super) fn holdings(
    reader: &mut impl BufRead,
    head: &Head,
    mut each: impl FnMut(SystemTime, &Span<'_>),
) -> Result<(), Trouble> {
    let first = next_line(reader).ok_or(Trouble::Unreadable)?;
    if first != head.first_line {
        return Err(Trouble::Changed);
    }
    // The withins and the unreadable lines, read with the head.
    for _ in 0..2 {
        next_line(reader).ok_or(Trouble::Unreadable)?;
    }
    let names: Names = next_line(reader)
        .and_then(|line| serde_json::from_slice(&line).ok())
        .ok_or(Trouble::Unreadable)?;
    let gpu = |i: &u32| {
        names.gpus.get(*i as usize).map(|(uuid, key)| Gpu {
            uuid,
            key: Cow::Borrowed(key),
        })
    };
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(_) => return Err(Trouble::Unreadable),
        }
        let Holding(secs, nanos, start, holder, shown, who, gpus, within) =
            serde_json::from_slice(&line).map_err(|_| Trouble::Unreadable)?;
        let span = Span {
            holder: &holder,
            shown: &shown,
            who: names.names.get(who as usize).ok_or(Trouble::Unreadable)?,
            gpus: gpus
                .iter()
                .map(gpu)
                .collect::<Option<_>>()
                .ok_or(Trouble::Unreadable)?,
            start,
            end: secs,
            within: within.as_deref(),
        };
        let at = UNIX_EPOCH
            .checked_add(Duration::new(secs, nanos))
            .ok_or(Trouble::Unreadable)?;
        each(at, &span);
    }
}

/// Opens a digest for reading.
pub(super) fn reader(file: File) -> BufReader<File> {
    BufReader::with_capacity(1 << 16, file)
}
