//! `gpupin release NAME`: one holder's GPUs given back by an operator or by the holder's
//! owner, named as `gpupin status` shows it (`lookup`), or a queued request by the name
//! `gpupin queue` shows (cancelled, `cancel`); never a holder that still runs:
//! its GPUs would go to the next request while it can still use them (root's --force
//! stops it first, through `jobs::evict`; a user's is refused).

use super::lookup::{self, Match};
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::record::Record;
use crate::state::ledger::store::{self, entry};
use crate::state::ledger::{Ledger, LedgerError, Released};
use std::ffi::OsStr;
use std::time::SystemTime;

/// Who releases, for the checks and the audit line.
#[derive(Debug, Clone)]
pub struct Releaser {
    pub uid: u32,
    /// The user name the audit line gives.
    pub user: String,
    /// `--force` was given: refused for a user when the holder still runs; root's is
    /// served by stopping the holder first (`jobs::evict`), never here.
    pub force: bool,
    /// How the name may fit (scripts: `Match::Exact`).
    pub how: Match,
    /// The command, for the audit line: `release` or `evict`.
    pub command: &'static str,
}

impl Ledger {
    /// Releases the holder `given` names (its shown name, id or id prefix) among the
    /// holders `by` may release: root's are all, a user's are their own. For root, a
    /// name no holder has may be an entry of `holders/` an error named (a corrupt record,
    /// a directory, a link), which is removed as `release_entry` does.
    pub fn release_named(&self, given: &OsStr, by: &Releaser) -> Result<Released, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        // The records that read: a corrupt entry beside them is what root may be naming.
        let records = store::scan_holders(&self.dir)?.records;
        let text = given.to_str().unwrap_or_default();
        if by.uid != 0
            && let Some(theirs) = records
                .iter()
                .find(|r| r.id == text && !owned_by(r, by.uid))
        {
            return Err(crate::state::ledger::not_yours(theirs, by.uid));
        }
        let mine: Vec<Record> = records
            .into_iter()
            .filter(|r| by.uid == 0 || owned_by(r, by.uid))
            .collect();
        let record = match lookup::the_one(&mine, text, by.how) {
            Ok(record) => record,
            Err(LedgerError::NoSuchHolder { .. }) => {
                // A queued request by the name `gpupin queue` shows: cancelled.
                match self.cancel_locked(text, by) {
                    Ok(waiting) => return Ok(Released::Request(Box::new(waiting))),
                    Err(LedgerError::NoSuchHolder { .. }) => {}
                    Err(e) => return Err(e),
                }
                if by.uid == 0 {
                    for name in entry::release_names(given)? {
                        if let Some(released) = self.remove_entry(&name, None)? {
                            return Ok(released);
                        }
                    }
                }
                return Err(no_such(given));
            }
            Err(other) => return Err(other),
        };
        // A holder that still runs is never released here, not even by root: its GPUs
        // would go to the next request while it can still open them. Root's --force
        // stops it first (`jobs::evict`) and releases it once it is gone. The one thing
        // root's --force releases here is a claim no process has bound yet: nothing can
        // open its GPUs, and a bind that comes later finds no claim.
        let unbound_forced = by.force && by.uid == 0 && record.pid.is_none();
        if record.runs(SystemTime::now(), self.unbound_grace) && !unbound_forced {
            let (name, what) = (record.display_name().to_string(), running(record));
            return Err(match by.force && by.uid != 0 {
                true => LedgerError::ForceIsRoots { name, what },
                false => LedgerError::StillRunning { name, what },
            });
        }
        let reason = format!("gpupin {} by {}", by.command, by.user);
        let name = format!("{}.json", record.id);
        match self.remove_entry(name.as_bytes(), Some(&reason))? {
            Some(released) => Ok(released),
            None => Err(no_such(given)),
        }
    }
}

impl Ledger {
    /// Audits that an operator stops `record` (`gpupin evict`), before the stop: the log
    /// then says who ended it even when its engine releases it.
    pub fn audit_eviction(&self, record: &Record, reason: &str) {
        let event = Event::for_record(EventKind::Evict, record).because(reason);
        self.audit_done(&event);
    }
}

fn owned_by(record: &Record, uid: u32) -> bool {
    record.owner.as_ref().is_some_and(|o| o.uid == uid)
}

fn no_such(given: &OsStr) -> LedgerError {
    LedgerError::NoSuchHolder {
        given: given.to_string_lossy().into_owned(),
    }
}

/// `docker container of alice, pid 4242`: what still runs, for the refusal.
fn running(record: &Record) -> String {
    let kind = match record.container.as_ref().and_then(|c| c.engine.as_deref()) {
        Some(engine) => format!("{engine} container"),
        None => record.kind.as_str().to_string(),
    };
    let owner = record
        .owner
        .as_ref()
        .map(|o| format!(" of {}", o.user))
        .unwrap_or_default();
    match record.pid {
        Some(pid) => format!("{kind}{owner}, pid {pid}"),
        None => format!("{kind}{owner}, starting"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::holder::{ContainerInfo, HolderKind, Owner};
    use crate::state::ledger::testing;
    use crate::state::ledger::tests::ledger;

    const ALICE: u32 = 1001;

    fn root(force: bool) -> Releaser {
        Releaser {
            uid: 0,
            user: "root".into(),
            force,
            how: Match::Shown,
            command: "release",
        }
    }

    fn alice(force: bool) -> Releaser {
        Releaser {
            uid: ALICE,
            user: "alice".into(),
            force,
            how: Match::Shown,
            command: "release",
        }
    }

    /// A docker container `name` (id `id`) of alice's on `gpu`; `running`: bound to this
    /// test's process, else to a pid that is gone.
    fn container(l: &Ledger, id: &str, name: &str, gpu: &str, running: bool) {
        let mut r = testing::record(id, &[gpu]);
        r.kind = HolderKind::Container;
        r.container = Some(ContainerInfo {
            engine: Some("docker".into()),
            name: Some(name.into()),
            image: None,
        });
        r.owner = Some(Owner {
            uid: ALICE,
            user: "alice".into(),
            groups: vec![],
        });
        if !running {
            r.start_time = None;
        }
        std::fs::create_dir_all(l.dir().join("holders")).unwrap();
        store::write_record(l.dir(), &format!("{id}.json"), &r).unwrap();
    }

    fn ids(l: &Ledger) -> Vec<String> {
        let mut ids: Vec<String> = l.records().unwrap().into_iter().map(|r| r.id).collect();
        ids.sort();
        ids
    }

    fn release(l: &Ledger, given: &str, by: &Releaser) -> Result<Released, String> {
        l.release_named(OsStr::new(given), by)
            .map_err(|e| e.to_string())
    }

    /// The main log and alice's (`audit.users/`), as one text.
    fn audit(l: &Ledger) -> String {
        ["audit.log", "audit.users/1001.log"]
            .iter()
            .map(|f| std::fs::read_to_string(l.dir().join(f)).unwrap_or_default())
            .collect()
    }

    /// Issue 31, finding 1: a forced release of a holder that still runs freed its GPUs
    /// for the next request. The ledger keeps it, whoever forces; a user's refusal says
    /// only root may and points to evict, which works for them.
    #[test]
    fn a_running_holder_is_never_released_even_forced_and_the_advice_is_evict() {
        let (_t, l) = ledger();
        let id = "3f2a1b2c3d4e5f60718293a4b5c6d7e8";
        container(&l, id, "web", "GPU-0", true);
        let pid = std::process::id();
        assert_eq!(
            release(&l, "web", &root(false)).unwrap_err(),
            format!(
                "web still runs (docker container of alice, pid {pid}): releasing it would give its GPUs to the next request while it uses them; end it with gpupin evict web, which releases them once it is gone"
            )
        );
        assert_eq!(
            release(&l, "web", &alice(true)).unwrap_err(),
            format!(
                "only root may release a holder that still runs (web: docker container of alice, pid {pid}); end it with gpupin evict web, which releases its GPUs once it is gone"
            )
        );
        // Her own release without --force is told what runs, not that forcing is root's.
        assert!(
            release(&l, "web", &alice(false))
                .unwrap_err()
                .starts_with("web still runs (docker container of alice"),
        );
        assert!(release(&l, "3f2a1b2c3d4e", &root(true)).is_err());
        assert_eq!(ids(&l), [id], "nothing released after the refusals");
        assert!(!audit(&l).contains("release"), "{}", audit(&l));
    }

    /// A claim no process has bound yet (a container being created) is "starting": only
    /// root's --force releases it, since nothing can open its GPUs yet.
    #[test]
    fn only_roots_force_releases_a_claim_no_process_has_bound() {
        let (_t, l) = ledger();
        container(&l, "cccc1111", "new", "GPU-0", true);
        let mut claim = l.records().unwrap().remove(0);
        claim.pid = None;
        claim.start_time = None;
        claim.created_at = crate::state::ledger::record::unix_now();
        store::write_record(l.dir(), "cccc1111.json", &claim).unwrap();
        let err = release(&l, "new", &root(false)).unwrap_err();
        assert!(
            err.contains("(docker container of alice, starting)"),
            "{err}"
        );
        assert!(
            release(&l, "new", &alice(true))
                .unwrap_err()
                .starts_with("only root may")
        );
        assert!(matches!(
            release(&l, "new", &root(true)),
            Ok(Released::Holder(_))
        ));
        assert!(ids(&l).is_empty());
    }

    #[test]
    fn a_holder_that_is_gone_is_released_by_name_without_force() {
        let (_t, l) = ledger();
        container(&l, "aaaa1111", "web", "GPU-0", false);
        container(&l, "bbbb2222", "db", "GPU-1", true);
        let Released::Holder(record) = release(&l, "web", &root(false)).unwrap() else {
            panic!("a holder's record")
        };
        assert_eq!(record.id, "aaaa1111");
        assert_eq!(ids(&l), ["bbbb2222"]);
        assert!(
            audit(&l).contains("gpupin release by root\""),
            "{}",
            audit(&l)
        );
    }

    #[test]
    fn a_hold_ends_by_release_without_force() {
        let (_t, l) = ledger();
        let mut until_release = testing::record("res", &["GPU-0"]);
        until_release.kind = HolderKind::Hold;
        until_release.until_release = true;
        until_release.pid = None;
        until_release.start_time = None;
        // A hold for this test's process's life: still a hold, not a job.
        let mut for_a_process = testing::record("pair", &["GPU-1"]);
        for_a_process.kind = HolderKind::Hold;
        std::fs::create_dir_all(l.dir().join("holders")).unwrap();
        store::write_record(l.dir(), "res.json", &until_release).unwrap();
        store::write_record(l.dir(), "pair.json", &for_a_process).unwrap();
        for name in ["res", "pair"] {
            assert!(matches!(
                release(&l, name, &root(false)),
                Ok(Released::Holder(_))
            ));
        }
    }

    #[test]
    fn unknown_and_ambiguous_names_release_nothing() {
        let (_t, l) = ledger();
        container(&l, "aaaa1111", "web", "GPU-0", false);
        container(&l, "aaaa2222", "web", "GPU-1", false);
        assert_eq!(
            release(&l, "web", &root(false)).unwrap_err(),
            "\"web\" could be any of web (aaaa1111), web (aaaa2222): give the id"
        );
        assert_eq!(
            release(&l, "aaaa", &root(false)).unwrap_err(),
            "\"aaaa\" could be any of web (aaaa1111), web (aaaa2222): give the id"
        );
        assert_eq!(
            release(&l, "pinned", &root(false)).unwrap_err(),
            "no holder \"pinned\": give a name or id as gpupin status shows it (an id may be cut to its first 12 characters)"
        );
        assert_eq!(ids(&l), ["aaaa1111", "aaaa2222"]);
    }

    #[test]
    fn a_user_names_only_their_own_holders() {
        let (_t, l) = ledger();
        container(&l, "aaaa1111", "web", "GPU-0", false);
        let mut bobs = testing::record("bbbb1111", &["GPU-1"]);
        bobs.owner = Some(Owner {
            uid: 1002,
            user: "bob".into(),
            groups: vec![],
        });
        bobs.start_time = None;
        store::write_record(l.dir(), "bbbb1111.json", &bobs).unwrap();
        let err = release(&l, "bbbb1111", &alice(false)).unwrap_err();
        assert!(
            err.starts_with("holder bbbb1111 is bob's, not ")
                && err.ends_with("'s: only bob or root may release it"),
            "{err}"
        );
        let err = release(&l, "bbbb", &alice(false)).unwrap_err();
        assert!(err.starts_with("no holder \"bbbb\""), "{err}");
        // An id prefix that fits both holders fits only alice's among hers.
        let both = release(&l, "aaaa1111", &alice(false));
        assert!(matches!(both, Ok(Released::Holder(_))));
        assert_eq!(ids(&l), ["bbbb1111"]);
    }

    #[test]
    fn root_may_still_remove_an_entry_that_is_no_record() {
        let (_t, l) = ledger();
        let holders = l.dir().join("holders");
        std::fs::create_dir_all(&holders).unwrap();
        std::fs::write(holders.join("c1.json"), "{not json").unwrap();
        assert!(matches!(
            release(&l, "c1", &root(false)),
            Ok(Released::Entry(_))
        ));
        std::fs::write(holders.join("c2.json"), "{not json").unwrap();
        assert!(release(&l, "c2", &alice(false)).is_err());
    }

    /// An eviction is audited before the stop, naming who and why (cargo mutants found
    /// `audit_eviction` untested here).
    #[test]
    fn an_eviction_is_audited_with_its_reason() {
        let (_t, l) = ledger();
        container(&l, "dddd1111", "web", "GPU-0", true);
        let record = l.records().unwrap().remove(0);
        l.audit_eviction(&record, "gpupin evict by root: docker stop -t 10 dddd1111");
        let line = audit(&l);
        assert!(
            line.contains("\"event\":\"evict\"")
                && line.contains("gpupin evict by root: docker stop -t 10 dddd1111"),
            "{line}"
        );
    }
}
