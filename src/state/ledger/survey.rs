//! The ledger as it stands, read without the lock and without changing anything: what
//! `gpupin gc` would clear and what no allocation can get past, for `gpupin doctor`.
//! Every read goes through the same no-follow, non-blocking paths as the writers' reads.

use super::queue::{QUEUE_DIR, Ticket};
use super::store::{self, HOLDERS_DIR};
use super::{Ledger, LedgerError, Record};
use crate::base::atomic;
use crate::base::procinfo;
use crate::base::safe_open::{self, Links};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What the lock directory holds, sorted by what it means.
#[derive(Debug, Default)]
pub struct Survey {
    /// Records whose holder is alive (or not yet due to start).
    pub live: Vec<Record>,
    /// Records whose holder is gone: the next allocation or `gpupin gc` reaps them.
    pub stale: Vec<Record>,
    /// Entries of holders/ that can be nobody's record, with why: every allocation fails
    /// on them until `gpupin gc` clears them.
    pub stray: Vec<(PathBuf, &'static str)>,
    /// Records that do not read (`LedgerError::CorruptRecord`): every allocation fails on
    /// them, and only an operator may remove them.
    pub corrupt: Vec<LedgerError>,
    /// Unreadable records from an earlier boot: nothing is blocked, `gpupin gc` clears them.
    pub leftovers: Vec<PathBuf>,
    /// Temp files whose writer is gone (killed between create and rename).
    pub dead_temps: Vec<PathBuf>,
    /// Queue tickets of live waiters.
    pub waiting: usize,
    /// Queue tickets nobody can be served through (waiter gone, unreadable).
    pub stale_tickets: Vec<PathBuf>,
    /// How the index (`holders.index`) stands against the records.
    pub index: IndexState,
}

/// How the ledger's index stands against the records it counts, as `survey` read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IndexState {
    /// None that matches `holders/` (none yet, a change it did not see, or `holders/`
    /// changed while it was read): allocations read the records, and the next grant
    /// writes one.
    #[default]
    Unmatched,
    /// It matches `holders/`, and its counts are the records'.
    Agrees,
    /// It matches `holders/` but its counts are not the records': a record was changed
    /// in place (by hand: gpupin replaces records whole), and allocations are decided on
    /// counts the records do not say. `gpupin gc` writes it anew.
    Disagrees,
}

impl Ledger {
    /// The ledger's state, read only: nothing is reaped, cleared or locked.
    pub fn survey(&self) -> Result<Survey, LedgerError> {
        let index_before = store::index::load(&self.dir);
        let scan = store::scan_holders(&self.dir)?;
        // The same index, stamp and all, before and after the records were read: nothing
        // changed `holders/` in between, so the two are of one moment.
        let index = match (index_before, store::index::load(&self.dir)) {
            (Some(before), Some(after)) if before == after && before.of_this_boot() => {
                let counted = store::index::Index::of(&scan.records).map(|i| i.unstamped());
                match counted == Some(before.unstamped()) && scan.corrupt.is_empty() {
                    true => IndexState::Agrees,
                    false => IndexState::Disagrees,
                }
            }
            _ => IndexState::Unmatched,
        };
        let now = SystemTime::now();
        let (stale, live) = scan
            .records
            .into_iter()
            .partition(|r| r.is_stale(now, self.unbound_grace));
        let (waiting, stale_tickets) = tickets(&self.dir)?;
        let mut dead_temps = dead_temps(&self.dir)?;
        for sub in [HOLDERS_DIR, QUEUE_DIR] {
            if let Some(sub) = store::existing_subdir(&self.dir, sub)? {
                dead_temps.extend(self::dead_temps(&sub)?);
            }
        }
        Ok(Survey {
            live,
            stale,
            stray: scan.stray,
            corrupt: scan.corrupt,
            leftovers: scan.leftovers,
            dead_temps,
            waiting,
            stale_tickets,
            index,
        })
    }
}

/// How many tickets wait, and the stale ones: `queue::scan_tickets`' judgement, with
/// nothing removed.
fn tickets(dir: &Path) -> Result<(usize, Vec<PathBuf>), LedgerError> {
    let Some(qdir) = store::existing_subdir(dir, QUEUE_DIR)? else {
        return Ok((0, Vec::new()));
    };
    let mut waiting = 0;
    let mut stale = Vec::new();
    for (path, _) in store::list(&qdir)? {
        let hidden = path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        if hidden {
            continue;
        }
        let ticket = safe_open::read(&path, Links::Refuse)
            .ok()
            .and_then(|t| serde_json::from_slice::<Ticket>(&t).ok());
        match ticket {
            Some(t) if t.start_time.is_some_and(|s| procinfo::is_alive(t.pid, s)) => waiting += 1,
            _ => stale.push(path),
        }
    }
    Ok((waiting, stale))
}

/// Temp files in `dir` whose writer is gone (`store::remove_dead_temps` without removing).
fn dead_temps(dir: &Path) -> Result<Vec<PathBuf>, LedgerError> {
    let mut dead = Vec::new();
    for (path, _) in store::list(dir)? {
        let name = path.file_name().unwrap_or_default();
        if let Some(pid) = name.to_str().and_then(atomic::temp_writer)
            && procinfo::start_time(pid).is_none()
        {
            dead.push(path);
        }
    }
    Ok(dead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::model::holder::HolderId;
    use crate::policy::testing::machine;
    use crate::state::ledger::{HolderMeta, Machine};
    use std::collections::BTreeMap;

    fn allocate(ledger: &Ledger, id: &str, pid: i32) {
        let inventory = machine(4);
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let meta = HolderMeta {
            source: "test".into(),
            pid: Some(pid),
            ..HolderMeta::default()
        };
        let machine = Machine::new(&inventory, PolicyName::Pack);
        ledger
            .allocate(&HolderId::new(id).unwrap(), &request, &machine, meta)
            .unwrap();
    }

    fn a_dead_pid() -> i32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        pid
    }

    /// Every path under `dir` with its bytes (directories as empty).
    fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut found = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.insert(path.clone(), Vec::new());
                found.extend(tree(&path));
            } else {
                found.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
        found
    }

    #[test]
    fn sorts_out_every_kind_of_entry_and_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&crate::input::config::LedgerSettings::at(
            &tmp.path().join("state"),
        ))
        .unwrap();
        let dead = a_dead_pid();
        allocate(&ledger, "live", std::process::id() as i32);
        allocate(&ledger, "gone", dead);
        let dir = ledger.dir().to_path_buf();
        std::fs::create_dir(dir.join("holders/x.json")).unwrap();
        std::fs::write(dir.join("holders/c1.json"), "{not json").unwrap();
        std::fs::write(dir.join(format!(".cursor.gpupin-{dead}-0.tmp")), "1").unwrap();
        std::fs::create_dir(dir.join("queue")).unwrap();
        let ticket = format!(r#"{{"seq":1,"id":"w","pid":{dead},"start_time":1}}"#);
        std::fs::write(dir.join("queue/00000000000000000001-w.json"), ticket).unwrap();
        let before = tree(&dir);

        let survey = ledger.survey().unwrap();
        let ids = |records: &[Record]| records.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&survey.live), ["live"]);
        assert_eq!(ids(&survey.stale), ["gone"]);
        assert_eq!(survey.stray.len(), 1);
        assert_eq!(survey.stray[0].0, dir.join("holders/x.json"));
        assert_eq!(survey.corrupt.len(), 1);
        assert!(survey.leftovers.is_empty(), "written in this boot");
        assert_eq!(
            survey.dead_temps,
            [dir.join(format!(".cursor.gpupin-{dead}-0.tmp"))]
        );
        assert_eq!(survey.waiting, 0);
        assert_eq!(
            survey.stale_tickets,
            [dir.join("queue/00000000000000000001-w.json")]
        );
        assert_eq!(tree(&dir), before, "a survey changes nothing");
    }
}
