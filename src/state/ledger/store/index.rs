//! `holders.index`: what the records of `holders/` hold (`Occupancy`) and all that says
//! whether any of them is stale (the processes they name, the claims waiting for one, the
//! holds' ends), kept beside them so that an allocation reads one small file instead of
//! every record. The records stay the truth; the index is a cache of them that is
//! trusted only while nothing but gpupin's own bookkeeping changed `holders/`.
//!
//! How an index is known to be the records' own: after each change it makes to
//! `holders/` (under the lock), gpupin sets the directory's mtime to a stamp of its own
//! (the clock to the nanosecond) and writes the stamp into the new index. Any other
//! change of the directory since (a writer killed between the record and the index, an
//! older gpupin mid-upgrade, a hand edit) gets the kernel's own mtime, which does not
//! match; nor does an index left over from before a stamp. A stamp the filesystem does
//! not keep to the nanosecond is no proof, and then there is no index. An index that does
//! not read (torn, zeroed, not ours, a link, a FIFO), is of another boot or another
//! version, or does not match is ignored: the records are read and the index built anew.

use crate::base::atomic::{self, Durability};
use crate::base::procinfo::{self, Liveness};
use crate::base::safe_open::{self, Links};
use crate::state::ledger::decide::occupancy::Occupancy;
use crate::state::ledger::record::Record;
use rustix::fs::{Mode, OFlags, Timespec, Timestamps};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// In the state dir, beside `holders/`.
pub(in crate::state::ledger) const INDEX_FILE: &str = "holders.index";

/// What the index's layout is; another is rebuilt, never read.
const VERSION: u32 = 1;

/// The records of `holders/`, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state::ledger) struct Index {
    version: u32,
    /// `holders/`'s mtime as the index's writer set it: seconds and nanoseconds.
    stamp: (i64, i64),
    /// The boot (its time) the index was written in: every record of an earlier boot is
    /// stale.
    boot: u64,
    /// What they hold.
    occupancy: Occupancy,
    /// Per pid, per start time: how many records name that process.
    processes: BTreeMap<i32, BTreeMap<u64, u32>>,
    /// Per creation time: how many records wait for a process (a claim not yet bound).
    unbound: BTreeMap<u64, u32>,
    /// Per end time: how many holds end then (`gpupin hold --for`).
    expiries: BTreeMap<u64, u32>,
    /// Records stale whenever looked at: a pid recorded without its start time (gone when
    /// it was recorded), or made before `boot`.
    doomed: u32,
}

/// `map[key] += 1`, or `-= 1` dropping a key at zero.
fn step<K: Ord>(map: &mut BTreeMap<K, u32>, key: K, adding: bool) {
    if adding {
        *map.entry(key).or_default() += 1;
    } else if let Some(n) = map.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            map.remove(&key);
        }
    }
}

impl Index {
    /// The index of `records` (every record of `holders/`), in this boot.
    pub(in crate::state::ledger) fn of(records: &[Record]) -> Option<Index> {
        let mut index = Index {
            version: VERSION,
            boot: procinfo::boot_time()?,
            ..Index::default()
        };
        for record in records {
            index.add(record);
        }
        Some(index)
    }

    /// The index as it would be of the same records under any stamp, for comparing.
    pub(in crate::state::ledger) fn unstamped(mut self) -> Index {
        self.stamp = (0, 0);
        self
    }

    /// Whether it was written in this boot (an index of another is never trusted).
    pub(in crate::state::ledger) fn of_this_boot(&self) -> bool {
        procinfo::boot_time() == Some(self.boot)
    }

    /// What the ledger's counts say: what an allocation is decided on.
    pub(in crate::state::ledger) fn occupancy(&self) -> &Occupancy {
        &self.occupancy
    }

    /// A record written.
    pub(in crate::state::ledger) fn add(&mut self, record: &Record) {
        self.apply(record, true);
    }

    /// A record removed, or about to be replaced.
    pub(in crate::state::ledger) fn remove(&mut self, record: &Record) {
        self.apply(record, false);
    }

    /// What `record` adds to (or takes from) each count: the same facts
    /// `Record::is_stale_in` reads, so that `none_stale` answers as it would for each.
    fn apply(&mut self, record: &Record, adding: bool) {
        match adding {
            true => self.occupancy.add(record),
            false => self.occupancy.remove(record),
        }
        let doomed = record.created_at < self.boot
            || match (record.pid, record.start_time) {
                (Some(pid), Some(started)) => {
                    let per_start = self.processes.entry(pid).or_default();
                    step(per_start, started, adding);
                    if per_start.is_empty() {
                        self.processes.remove(&pid);
                    }
                    false
                }
                (Some(_), None) => true,
                (None, _) if record.until_release => false,
                (None, _) => {
                    step(&mut self.unbound, record.created_at, adding);
                    false
                }
            };
        if doomed {
            match adding {
                true => self.doomed += 1,
                false => self.doomed = self.doomed.saturating_sub(1),
            }
        }
        if let Some(end) = record.expires_at {
            step(&mut self.expiries, end, adding);
        }
    }

    /// Whether no record it counts is stale now, by `Record::is_stale_in`'s rules, each
    /// process asked about once. `false` sends the caller to the records (which reaps).
    /// A process that ended while its job's cgroup still runs something is not stale
    /// either, but that takes the records to tell.
    pub(in crate::state::ledger) fn none_stale(
        &self,
        now: SystemTime,
        grace: Duration,
        look: &mut Liveness,
    ) -> bool {
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        // A claim's age either way, to the nanosecond as the record's own look takes it:
        // a clock stepped back makes it "from the future".
        let within_grace = |created: u64| {
            let created = crate::base::clock::unix(created);
            let age = match now.duration_since(created) {
                Ok(age) => age,
                Err(ahead) => ahead.duration(),
            };
            age <= grace
        };
        self.doomed == 0
            && procinfo::boot_time() == Some(self.boot)
            && self.expiries.keys().next().is_none_or(|&end| secs < end)
            && self.unbound.keys().next().is_none_or(|&c| within_grace(c))
            && self
                .unbound
                .keys()
                .next_back()
                .is_none_or(|&c| within_grace(c))
            && self
                .processes
                .iter()
                .all(|(&pid, starts)| starts.keys().all(|&started| look.is_alive(pid, started)))
    }
}

/// The index of the ledger in `dir` when it is the records' own (see the module's
/// comment); `None` when there is none or it cannot be trusted. Without the lock too: an
/// index renamed in after the directory was stamped is checked against the stamp read
/// after it, so a reader sees a matching pair or a mismatch, never a torn one.
pub(in crate::state::ledger) fn load(dir: &Path) -> Option<Index> {
    let (file, stat) = safe_open::open_with_stat(&dir.join(INDEX_FILE), Links::Refuse).ok()?;
    safe_open::written_by_us(&stat).ok()?;
    let bytes = safe_open::read_file(file, stat.st_size as u64).ok()?;
    let index: Index = serde_json::from_slice(&bytes).ok()?;
    let holders = rustix::fs::lstat(super::holders_dir(dir)).ok()?;
    let matches = index.version == VERSION
        && rustix::fs::FileType::from_raw_mode(holders.st_mode) == rustix::fs::FileType::Directory
        && (holders.st_mtime, holders.st_mtime_nsec as i64) == index.stamp;
    matches.then_some(index)
}

/// `load`, when no record it counts is stale now: what an allocation may be decided on
/// without reading the records.
pub(in crate::state::ledger) fn load_fresh(dir: &Path, grace: Duration) -> Option<Index> {
    let index = load(dir)?;
    let mut look = Liveness::default();
    index
        .none_stale(SystemTime::now(), grace, &mut look)
        .then_some(index)
}

/// Stamps `holders/` and writes `index` with the stamp: from now on it is the records'
/// own. Caller holds the lock and has just changed `holders/` itself, with `index` up to
/// date with that change. Failing, it leaves no index that matches (the stamp is set
/// before the index is written, and an index that is not written keeps an older stamp):
/// the next allocation reads the records, as it did before there was an index.
pub(in crate::state::ledger) fn save(dir: &Path, mut index: Index) {
    let holders = super::holders_dir(dir);
    let Some(stamp) = stamp(&holders, index.stamp) else {
        // No stamp to prove the index is the records' own: none at all, rather than one
        // that a later change could happen to match.
        let _ = std::fs::remove_file(dir.join(INDEX_FILE));
        return;
    };
    index.stamp = stamp;
    let text = serde_json::to_vec(&index).expect("an index serializes");
    if let Err(err) = atomic::replace(
        &dir.join(INDEX_FILE),
        &text,
        super::FILE_MODE,
        Durability::Renamed,
    ) {
        tracing::debug!(error = %err.source, "the ledger's index not written: the records decide");
    }
}

/// The index of `records`, the whole of `holders/` as just read under the lock, written.
pub(in crate::state::ledger) fn rebuild(dir: &Path, records: &[Record]) {
    // The directory is what carries the stamp: made now where no holder made it yet.
    if super::ensure_subdir(dir, super::HOLDERS_DIR).is_err() {
        return;
    }
    if let Some(index) = Index::of(records) {
        save(dir, index);
    }
}

/// Sets the mtime of the directory `holders` to now, to the nanosecond (another value
/// than `before`), and returns it as the filesystem keeps it; `None` when it cannot, or
/// keeps it less precisely than it was given.
fn stamp(holders: &Path, before: (i64, i64)) -> Option<(i64, i64)> {
    let fd = rustix::fs::open(
        holders,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    let mut wanted = (now.as_secs() as i64, i64::from(now.subsec_nanos()));
    if wanted == before {
        wanted.1 = (wanted.1 + 1) % 1_000_000_000;
    }
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: wanted.0,
            tv_nsec: wanted.1 as _,
        },
    };
    rustix::fs::futimens(&fd, &times).ok()?;
    let kept = rustix::fs::fstat(&fd).ok()?;
    let kept = (kept.st_mtime, kept.st_mtime_nsec as i64);
    (kept == wanted).then_some(kept)
}

/// Before a change of `holders/` under the lock: the index as it stands, when it is the
/// records' own, and the record `file_name` holds now (what the change replaces).
/// `None`: no index to keep up to date (the change leaves it unmatched, and the next
/// allocation rebuilds it).
pub(in crate::state::ledger) fn before_change(
    dir: &Path,
    file_name: &str,
) -> Option<(Index, Option<Record>)> {
    let index = load(dir)?;
    let before = super::read_listed(&super::holders_dir(dir).join(file_name)).ok()?;
    Some((index, before))
}

/// After the change `before_change` was asked about: `record` now stands under that name
/// (`None`: nothing does).
pub(in crate::state::ledger) fn after_change(
    dir: &Path,
    before: Option<(Index, Option<Record>)>,
    record: Option<&Record>,
) {
    let Some((mut index, replaced)) = before else {
        return;
    };
    if let Some(old) = &replaced {
        index.remove(old);
    }
    if let Some(new) = record {
        index.add(new);
    }
    save(dir, index);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::testing::record;

    const GRACE: Duration = Duration::from_secs(60);

    fn boot() -> u64 {
        procinfo::boot_time().unwrap()
    }

    /// Whether an index of `records` says none is stale at `now` (seconds).
    fn fresh(records: &[Record], now: u64) -> bool {
        let index = Index::of(records).unwrap();
        index.none_stale(
            crate::base::clock::unix(now),
            GRACE,
            &mut Liveness::default(),
        )
    }

    fn made_at(created_at: u64) -> Record {
        Record {
            created_at,
            ..record("r", &["GPU-0"])
        }
    }

    fn claim(created_at: u64) -> Record {
        Record {
            pid: None,
            start_time: None,
            ..made_at(created_at)
        }
    }

    #[test]
    fn a_record_of_an_earlier_boot_is_stale_and_one_of_its_first_second_is_not() {
        let now = boot() + 3600;
        assert!(!fresh(&[made_at(boot() - 1)], now));
        assert!(fresh(&[made_at(boot())], now));
    }

    #[test]
    fn a_claim_is_stale_past_its_grace_either_way_and_a_hold_until_release_never() {
        let now = boot() + 3600;
        assert!(fresh(&[claim(now - 60)], now));
        assert!(!fresh(&[claim(now - 61)], now));
        // Created "in the future": the clock was stepped back.
        assert!(fresh(&[claim(now + 60)], now));
        assert!(!fresh(&[claim(now + 61)], now));
        let hold = Record {
            until_release: true,
            ..claim(now - 3000)
        };
        assert!(fresh(&[hold], now));
    }

    #[test]
    fn a_hold_is_stale_from_its_end_on() {
        let now = boot() + 3600;
        let ending = |end| Record {
            expires_at: Some(end),
            until_release: true,
            ..claim(now - 10)
        };
        assert!(fresh(&[ending(now + 1)], now));
        assert!(!fresh(&[ending(now)], now));
    }

    #[test]
    fn a_pid_without_its_start_time_or_a_process_that_ended_is_stale() {
        let now = boot() + 3600;
        let live = made_at(now - 10);
        assert!(fresh(std::slice::from_ref(&live), now));
        let without_start = Record {
            start_time: None,
            ..live.clone()
        };
        assert!(!fresh(&[live.clone(), without_start], now));
        let restarted = Record {
            start_time: live.start_time.map(|t| t + 1),
            ..live.clone()
        };
        assert!(!fresh(&[live, restarted], now));
    }

    #[test]
    fn removing_a_record_undoes_adding_it() {
        let now = boot() + 3600;
        let records = [
            made_at(now - 10),
            claim(now - 20),
            Record {
                expires_at: Some(now + 5),
                ..claim(now - 5)
            },
            made_at(boot() - 5),
        ];
        let mut index = Index::of(&records).unwrap();
        for r in &records {
            index.remove(r);
        }
        assert_eq!(index, Index::of(&[]).unwrap());
    }
}
