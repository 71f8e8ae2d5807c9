//! Idle holders: a holder whose GPUs all stay under `idle_utilization` for `idle_after`
//! is idle. `gpupin serve` looks at the live figures every little while (`look_every`)
//! and writes what it found to `idle.json` in the state dir, under the lock: per holder
//! since when its GPUs have been quiet, and whether that has lasted long enough. `gpupin
//! status` and the metrics read that file; nothing on a container's way to its GPUs does
//! (the hook neither samples nor reads it).
//!
//! One small file beside the records rather than a field in each record: a look rewrites
//! one file, not every record, so it never touches `holders/` (whose changes wake every
//! waiter of the queue) and a record stays what the allocation wrote. Its verdicts hold
//! only while the looks go on: the file says until when (`fresh_until`), and a holder
//! quiet before a gap in the looks (the daemon stopped) starts afresh.

use crate::base::safe_open::{self, Links};
use crate::input::config::IdleAction;
use crate::model::gpu::Inventory;
use crate::model::holder::HolderKind;
use crate::model::live::Live;
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::record::{Record, unix_now};
use crate::state::ledger::store;
use crate::state::ledger::{Ledger, LedgerError};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// The file of the looks, in the state dir.
pub(super) const IDLE_FILE: &str = "idle.json";
/// A look's verdicts outlive it by this many of its periods: a look late by a period or
/// two (a busy machine, a slow NVML) keeps the streaks; a daemon that stopped does not.
const FRESH_FOR: u64 = 3;

/// What makes a holder idle, and what then happens (the config's `idle_*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleRule {
    /// Utilization, in percent, that every GPU of the holder stays under.
    pub utilization: u32,
    /// For how long.
    pub after: Duration,
    pub action: IdleAction,
    /// How often the looks come (`look_every`).
    pub every: Duration,
}

impl IdleRule {
    /// The rule the config's keys give.
    pub fn of(config: &crate::input::config::Config) -> IdleRule {
        IdleRule {
            utilization: config.idle_utilization,
            after: config.idle_after,
            action: config.idle_action,
            every: look_every(config.idle_after),
        }
    }
}

/// How often `gpupin serve` looks: a tenth of `idle_after`, so that a holder is called idle
/// at most a tenth late, between once a second and once a minute (an NVML query a minute
/// costs nothing; `idle_after` is an hour by default).
pub(super) fn look_every(after: Duration) -> Duration {
    (after / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct IdleFile {
    /// Seconds since the Unix epoch of the last look.
    sampled_at: u64,
    /// Until when its verdicts hold.
    fresh_until: u64,
    /// Holders whose GPUs were all quiet at the last look, by id.
    holders: BTreeMap<String, Quiet>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Quiet {
    /// The record's `created_at`: a holder held anew under the same id starts afresh.
    created_at: u64,
    /// Since when (seconds since the Unix epoch) its GPUs have all been quiet.
    quiet_since: u64,
    /// Quiet for `idle_after`: idle, and audited as such once.
    idle: bool,
}

/// A holder found idle, for `gpupin status` and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idle {
    pub holder: String,
    /// Since when its GPUs have been quiet, in seconds since the Unix epoch.
    pub since: u64,
}

/// What one look did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IdleLook {
    /// Holders found idle at this look (audited `idle`).
    pub became_idle: Vec<String>,
    /// Idle holds released (`idle_action = "release-holds"`).
    pub released: Vec<String>,
}

/// Whether every GPU of `record` is known to be under `utilization` percent: a GPU
/// whose utilization the source does not give (NVML for a GPU in MIG mode) is not.
fn quiet(record: &Record, inventory: &Inventory, live: &[Live], utilization: u32) -> bool {
    !record.gpus.is_empty()
        && record.gpus.iter().all(|uuid| {
            inventory
                .gpus
                .iter()
                .position(|g| &g.uuid == uuid)
                .and_then(|position| live.get(position))
                .and_then(|l| l.utilization)
                .is_some_and(|u| u < utilization)
        })
}

/// Whether `idle_action = "release-holds"` may release `record`: a hold set aside by
/// `gpupin hold` with no process of its own and nothing running inside it. Not one bound
/// to a process (the Python client's, `hold --pid`: that process runs on the GPUs), not
/// the Kubernetes plugin's (a pod's, which names its engine), and not one a container
/// or job took its GPUs from (`within`): a running container or job never loses its
/// GPUs to this.
fn releasable(record: &Record, live: &[Record]) -> bool {
    record.kind == HolderKind::Hold
        && record.pid.is_none()
        && record.container.is_none()
        && !live
            .iter()
            .any(|r| r.request.within.as_deref() == Some(record.id.as_str()))
}

fn read_file(dir: &std::path::Path) -> IdleFile {
    safe_open::read(&dir.join(IDLE_FILE), Links::Refuse)
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_default()
}

/// "GPUs under 5% utilization for 1h": why a holder is idle, for the audit lines.
fn why(rule: &IdleRule) -> String {
    format!(
        "GPUs under {}% utilization for {}",
        rule.utilization,
        humantime::format_duration(rule.after)
    )
}

impl Ledger {
    /// One look (`gpupin serve`'s, every `rule.every`): for each live holder whether its
    /// GPUs are all quiet in `live` (figures per inventory position), since when, and
    /// whether that makes it idle; `idle.json` rewritten; each holder that becomes idle
    /// audited once (`idle`); under `release-holds` each idle hold that `releasable` lets
    /// go released, audited as a release that says why.
    pub fn look_for_idle(
        &self,
        inventory: &Inventory,
        live: &[Live],
        rule: &IdleRule,
    ) -> Result<IdleLook, LedgerError> {
        self.look_at(inventory, live, rule, unix_now())
    }

    /// `look_for_idle` as if it were `at` (seconds since the Unix epoch).
    fn look_at(
        &self,
        inventory: &Inventory,
        live: &[Live],
        rule: &IdleRule,
        at: u64,
    ) -> Result<IdleLook, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let now = SystemTime::now();
        let records = store::read_records(&self.dir)?;
        let running: Vec<Record> = records
            .into_iter()
            .filter(|r| !r.is_stale(now, self.unbound_grace))
            .collect();
        let before = read_file(&self.dir);
        // A look after a gap: the streaks it kept may have been broken unseen.
        let carried = at <= before.fresh_until;
        let mut after = IdleFile {
            sampled_at: at,
            fresh_until: at + FRESH_FOR * rule.every.as_secs().max(1),
            holders: BTreeMap::new(),
        };
        let mut look = IdleLook::default();
        for record in &running {
            if !quiet(record, inventory, live, rule.utilization) {
                continue;
            }
            let earlier = before
                .holders
                .get(&record.id)
                .filter(|q| carried && q.created_at == record.created_at);
            let quiet_since = earlier.map_or(at, |q| q.quiet_since);
            let idle = at.saturating_sub(quiet_since) >= rule.after.as_secs();
            if idle && !earlier.is_some_and(|q| q.idle) {
                let event = Event::for_record(EventKind::Idle, record).because(why(rule));
                self.audit_done(&event);
                tracing::info!(holder = %record.id, "holder idle");
                look.became_idle.push(record.id.clone());
            }
            if idle
                && rule.action == IdleAction::ReleaseHolds
                && releasable(record, &running)
                && self.release_idle(record, rule)?
            {
                look.released.push(record.id.clone());
                continue;
            }
            after.holders.insert(
                record.id.clone(),
                Quiet {
                    created_at: record.created_at,
                    quiet_since,
                    idle,
                },
            );
        }
        let text = serde_json::to_vec(&after).expect("the idle file serializes");
        store::write_atomic(&self.dir, IDLE_FILE, &text)?;
        // The metrics file shows how long each has been idle: it moves on each look.
        self.changed();
        Ok(look)
    }

    /// Releases the idle hold `record` (caller holds the lock); `false`: it was gone.
    fn release_idle(&self, record: &Record, rule: &IdleRule) -> Result<bool, LedgerError> {
        let reason = format!("idle: {} (idle_action = \"release-holds\")", why(rule));
        let name = format!("{}.json", record.id);
        Ok(self.remove_entry(name.as_bytes(), Some(&reason))?.is_some())
    }

    /// The holders the last look found idle, with their records as they are now (a
    /// holder since released, or held anew under its id, is not). Read without the lock:
    /// the file is renamed into place. Empty when no look came lately (no `gpupin serve`,
    /// no live figures), since then nothing is known.
    pub fn idle(&self, records: &[Record]) -> Vec<Idle> {
        self.idle_at(records, unix_now())
    }

    /// `idle` as if it were `at`.
    fn idle_at(&self, records: &[Record], at: u64) -> Vec<Idle> {
        let file = read_file(&self.dir);
        if at > file.fresh_until {
            return Vec::new();
        }
        file.holders
            .into_iter()
            .filter(|(id, q)| {
                q.idle
                    && records
                        .iter()
                        .any(|r| &r.id == id && r.created_at == q.created_at)
            })
            .map(|(holder, q)| Idle {
                holder,
                since: q.quiet_since,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::model::holder::ContainerInfo;
    use crate::policy::testing::machine;
    use crate::state::ledger::tests::{id, ledger};
    use crate::state::ledger::tests_jobs::{container, job};
    use crate::state::ledger::{HolderMeta, Machine};

    const T: u64 = 1_800_000_000;
    const HOUR: u64 = 3600;

    fn rule(action: IdleAction) -> IdleRule {
        IdleRule {
            utilization: 5,
            after: Duration::from_secs(HOUR),
            action,
            every: look_every(Duration::from_secs(HOUR)),
        }
    }

    fn on(gpu: &str) -> GpuRequest {
        GpuRequest::new(Selection::Devices(vec![gpu.into()]), Origin::Cli)
    }

    /// A hold made by `gpupin hold` without a process (`pid`: with one).
    fn hold(pid: Option<i32>) -> HolderMeta {
        HolderMeta {
            source: "test".into(),
            kind: HolderKind::Hold,
            until_release: true,
            pid,
            ..HolderMeta::default()
        }
    }

    /// Live figures with these utilizations, by position.
    fn live(utilization: &[u32]) -> Vec<Live> {
        utilization
            .iter()
            .map(|&u| Live {
                utilization: Some(u),
                ..Live::default()
            })
            .collect()
    }

    /// The audit lines of `event`, as (holder, reason).
    fn audited(l: &Ledger, event: &str) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(l.dir().join("audit.log")).unwrap_or_default();
        text.lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|e| e["event"] == event)
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (s("holder"), s("reason"))
            })
            .collect()
    }

    fn idle_ids(l: &Ledger, at: u64) -> Vec<(String, u64)> {
        let records = l.records().unwrap();
        l.idle_at(&records, at)
            .into_iter()
            .map(|i| (i.holder, i.since))
            .collect()
    }

    #[test]
    fn a_holder_quiet_for_idle_after_is_idle_once_and_busy_again_is_not() {
        let (_t, l) = ledger();
        let inv = machine(4);
        let m = Machine::new(&inv, PolicyName::Pack);
        l.allocate(&id("quiet"), &on("0"), &m, container()).unwrap();
        l.allocate(&id("busy"), &on("1"), &m, job("alice", 1001, &[]))
            .unwrap();
        let r = rule(IdleAction::Report);
        let figures = live(&[0, 50, 0, 0]);
        let every = r.every.as_secs();
        let mut at = T;
        let look = l.look_at(&inv, &figures, &r, at).unwrap();
        assert_eq!(look, IdleLook::default());
        assert_eq!(idle_ids(&l, at), []);
        // Looks every minute: quiet for 59 minutes is not yet idle.
        while at < T + HOUR - every {
            at += every;
            assert_eq!(
                l.look_at(&inv, &figures, &r, at).unwrap().became_idle,
                Vec::<String>::new()
            );
        }
        assert_eq!(idle_ids(&l, at), []);
        at += every;
        let look = l.look_at(&inv, &figures, &r, at).unwrap();
        assert_eq!(look.became_idle, ["quiet"]);
        assert_eq!(look.released, Vec::<String>::new());
        assert_eq!(idle_ids(&l, at), [("quiet".to_string(), T)]);
        // Later looks say so again, but the audit log once.
        at += every;
        assert_eq!(
            l.look_at(&inv, &figures, &r, at).unwrap(),
            IdleLook::default()
        );
        assert_eq!(idle_ids(&l, at), [("quiet".to_string(), T)]);
        assert_eq!(
            audited(&l, "idle"),
            [(
                "quiet".to_string(),
                "GPUs under 5% utilization for 1h".to_string()
            )]
        );
        // Nothing was released: a report is a report.
        assert_eq!(l.records().unwrap().len(), 2);
        // Its GPU works again: no longer idle, and a new streak starts from there.
        at += every;
        l.look_at(&inv, &live(&[40, 50, 0, 0]), &r, at).unwrap();
        assert_eq!(idle_ids(&l, at), []);
        at += every;
        l.look_at(&inv, &figures, &r, at).unwrap();
        assert_eq!(
            idle_ids(&l, at + HOUR),
            [],
            "no look came for an hour: nothing known"
        );
    }

    #[test]
    fn a_gap_in_the_looks_restarts_the_streak_and_an_old_file_says_nothing() {
        let (_t, l) = ledger();
        let inv = machine(4);
        let m = Machine::new(&inv, PolicyName::Pack);
        l.allocate(&id("quiet"), &on("0"), &m, container()).unwrap();
        let r = rule(IdleAction::Report);
        let figures = live(&[0, 0, 0, 0]);
        l.look_at(&inv, &figures, &r, T).unwrap();
        // The daemon was down for an hour and a half: what happened meanwhile is unknown.
        let at = T + HOUR + HOUR / 2;
        assert_eq!(idle_ids(&l, at), []);
        let look = l.look_at(&inv, &figures, &r, at).unwrap();
        assert_eq!(look.became_idle, Vec::<String>::new());
        assert_eq!(audited(&l, "idle"), []);
    }

    #[test]
    fn a_gpu_whose_utilization_is_unknown_is_not_quiet() {
        let (_t, l) = ledger();
        let inv = machine(4);
        let m = Machine::new(&inv, PolicyName::Pack);
        l.allocate(&id("mig"), &on("0"), &m, container()).unwrap();
        let r = rule(IdleAction::Report);
        let mut figures = live(&[0, 0, 0, 0]);
        figures[0].utilization = None;
        let every = r.every.as_secs();
        let mut at = T;
        while at <= T + 2 * HOUR {
            assert_eq!(
                l.look_at(&inv, &figures, &r, at).unwrap(),
                IdleLook::default()
            );
            at += every;
        }
    }

    /// `release-holds` releases an idle hold made without a process, audited as a
    /// release that says why, and nothing else: not a container, a job, a hold bound to
    /// a process, the Kubernetes plugin's hold of a pod, nor a hold a container runs in.
    #[test]
    fn release_holds_releases_idle_holds_only() {
        let (_t, l) = ledger();
        let inv = machine(8);
        let m = Machine::new(&inv, PolicyName::Pack);
        l.allocate(&id("notebook"), &on("0"), &m, container())
            .unwrap();
        l.allocate(&id("train"), &on("1"), &m, job("alice", 1001, &[]))
            .unwrap();
        l.allocate(&id("forgotten"), &on("2"), &m, hold(None))
            .unwrap();
        let me = Some(std::process::id() as i32);
        l.allocate(&id("python"), &on("3"), &m, hold(me)).unwrap();
        let pod = HolderMeta {
            container: Some(ContainerInfo {
                engine: Some("kubernetes".into()),
                ..ContainerInfo::default()
            }),
            ..hold(None)
        };
        l.allocate(&id("gpupin-k8s-x"), &on("4"), &m, pod).unwrap();
        l.allocate(&id("slurm-42"), &on("5"), &m, hold(None))
            .unwrap();
        let inside = GpuRequest {
            within: Some("slurm-42".into()),
            ..GpuRequest::new(Selection::Count(1), Origin::Cli)
        };
        // A container started inside the hold (as with its key; the scope is not what
        // this test is about, so the request is made as root makes it).
        let within_key = l.key(&id("slurm-42")).unwrap().map(|(_, k)| k);
        let inside = GpuRequest {
            within_key,
            ..inside
        };
        l.allocate(&id("inner"), &inside, &m, container()).unwrap();
        let r = rule(IdleAction::ReleaseHolds);
        let figures = live(&[0; 8]);
        l.look_at(&inv, &figures, &r, T).unwrap();
        let mut at = T;
        let mut look = IdleLook::default();
        while at < T + HOUR {
            at += r.every.as_secs();
            let this = l.look_at(&inv, &figures, &r, at).unwrap();
            look.became_idle.extend(this.became_idle);
            look.released.extend(this.released);
        }
        assert_eq!(look.released, ["forgotten"]);
        let mut became = look.became_idle.clone();
        became.sort();
        assert_eq!(
            became,
            [
                "forgotten",
                "gpupin-k8s-x",
                "inner",
                "notebook",
                "python",
                "slurm-42",
                "train"
            ]
        );
        let mut left: Vec<String> = l.records().unwrap().into_iter().map(|r| r.id).collect();
        left.sort();
        assert_eq!(
            left,
            [
                "gpupin-k8s-x",
                "inner",
                "notebook",
                "python",
                "slurm-42",
                "train"
            ]
        );
        let released = audited(&l, "release");
        assert_eq!(released.len(), 1, "{released:?}");
        assert_eq!(released[0].0, "forgotten");
        assert_eq!(
            released[0].1,
            "idle: GPUs under 5% utilization for 1h (idle_action = \"release-holds\")"
        );
        // The idle ones left are still shown idle; the released one is not.
        let shown: Vec<String> = idle_ids(&l, at).into_iter().map(|(h, _)| h).collect();
        assert!(!shown.contains(&"forgotten".to_string()), "{shown:?}");
        assert_eq!(shown.len(), 6, "{shown:?}");
    }

    /// A FIFO or a symlink where idle.json goes (anyone who could write the state dir
    /// could put one there) blocks neither a look under the lock nor `gpupin status`, and
    /// a symlink is not followed: the look replaces it with a file of its own.
    #[test]
    fn a_fifo_or_symlink_as_the_idle_file_blocks_nothing_and_is_replaced() {
        for kind in ["fifo", "symlink"] {
            let (t, l) = ledger();
            let inv = machine(4);
            let m = Machine::new(&inv, PolicyName::Pack);
            l.allocate(&id("quiet"), &on("0"), &m, container()).unwrap();
            let path = l.dir().join(IDLE_FILE);
            let elsewhere = t.path().join("elsewhere");
            std::fs::write(&elsewhere, "kept").unwrap();
            match kind {
                "fifo" => crate::state::ledger::tests::mkfifo(&path),
                _ => std::os::unix::fs::symlink(&elsewhere, &path).unwrap(),
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let dir = l.dir().to_path_buf();
            std::thread::spawn(move || {
                let l = Ledger::open(&crate::input::config::LedgerSettings::at(&dir)).unwrap();
                let records = l.records().unwrap();
                let shown = l.idle(&records);
                let inv = machine(4);
                let looked = l.look_at(&inv, &live(&[0, 0, 0, 0]), &rule(IdleAction::Report), T);
                let _ = tx.send((shown, looked.map_err(|e| e.to_string())));
            });
            let (shown, looked) = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("{kind} as {IDLE_FILE} blocked"));
            assert_eq!(shown, [], "{kind}");
            assert_eq!(looked, Ok(IdleLook::default()), "{kind}");
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert!(meta.file_type().is_file(), "{kind}: {meta:?}");
            assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "kept");
        }
    }
}
