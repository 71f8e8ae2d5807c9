//! One holder's record: which GPUs it holds, for what, and how to tell whether it still runs.

use crate::base::procinfo;
use crate::input::request::GpuRequest;
use crate::model::holder::{ContainerInfo, HolderKind, Owner};
use crate::state::audit::{Event, EventKind, GpuRef};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Exclusive,
    /// With other shared holders, each with its reservation (`request.reserve`).
    Shared,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub id: String,
    /// GPU UUIDs: indices change across reboots, UUIDs do not.
    pub gpus: Vec<String>,
    /// The index of each of `gpus` when they were allocated (records do not outlive a
    /// boot, so these stay true): the audit log names GPUs as people do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indices: Vec<u32>,
    #[serde(default)]
    pub kind: HolderKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerInfo>,
    /// A hold without a process: it lasts until `gpupin release` (or a reboot).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_release: bool,
    pub mode: Mode,
    pub request: GpuRequest,
    /// Who allocated: `hook:prestart`, `cli`, ...
    pub source: String,
    pub pid: Option<i32>,
    /// Start time of `pid` in clock ticks since boot, to tell pid reuse apart.
    pub start_time: Option<u64>,
    pub bundle: Option<PathBuf>,
    /// SHA-256 of the claim secret gpupin wrote into the holder's spec, for holders whose
    /// spec was edited before create: only that spec's container can bind the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_digest: Option<String>,
    /// Random hex of this record's own, in its key (`within`): a holder made again
    /// under the same name gets a new key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub salt: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// The job's own cgroups (`gpupin-<holder>`, one per hierarchy) of a confined job:
    /// the job lasts until they are empty, whoever watches it (a daemon restarted since
    /// finds them here, and removes them at the job's end). Empty in older records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<PathBuf>,
    /// Seconds since the Unix epoch at which a hold ends by itself (`gpupin hold --for`):
    /// from then on it is stale, and gc or the next allocation reaps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Why the GPUs are held, as `gpupin hold --reason` said (status and the audit log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a shared holder with a memory reservation on a machine NVML describes: whether
    /// the driver enforces it on the holder's cgroup (`host::inventory::nvml_limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<MemoryLimit>,
}

/// Whether a shared holder's memory reservation is a limit the driver enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryLimit {
    /// Set on the holder's cgroup: the driver refuses it more.
    Enforced,
    /// The driver has no per-cgroup memory limits: the reservation is bookkeeping.
    AccountingOnly,
}

/// What an allocation knows about the holder besides its id.
#[derive(Debug, Clone, Default)]
pub struct HolderMeta {
    pub source: String,
    pub pid: Option<i32>,
    pub bundle: Option<PathBuf>,
    /// See `Record::claim_digest`.
    pub claim_digest: Option<String>,
    pub kind: HolderKind,
    pub owner: Option<Owner>,
    pub container: Option<ContainerInfo>,
    /// See `Record::until_release`.
    pub until_release: bool,
    /// See `Record::expires_at`.
    pub expires_at: Option<u64>,
    /// See `Record::reason`.
    pub reason: Option<String>,
    /// Polled while the request waits in the queue: `false` once whoever asked has gone
    /// (`gpupin serve`: the caller closed its connection). The ticket itself lives as long
    /// as the process that waits (for `gpupin serve`, the daemon).
    pub still_wanted: Option<StillWanted>,
    /// Whether the limits (`[limits]`) apply: a request on behalf of a user who is not
    /// root. Root's own requests, and holds root makes for someone, are not limited.
    pub limited: bool,
    /// Read again before each look of a waiting request: the live figures and the
    /// processes on the GPUs now, so that a wait is decided on the machine as it is
    /// then, not as it was when it was queued. `None`: the machine given is used.
    pub figures_now: Option<FiguresNow>,
}

/// The live figures and the processes on each GPU, as read now.
#[derive(Debug, Default)]
pub struct Figures {
    pub live: Option<Vec<crate::model::live::Live>>,
    pub processes: Option<Vec<Vec<crate::host::whose::Seen>>>,
}

/// Reads `Figures` again (see `HolderMeta::figures_now`); called without the lock.
#[derive(Clone)]
pub struct FiguresNow(pub std::sync::Arc<dyn Fn() -> Figures + Send + Sync>);

impl std::fmt::Debug for FiguresNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FiguresNow")
    }
}

/// A check a waiting request polls (see `HolderMeta::still_wanted`); cheap, no lock.
#[derive(Clone)]
pub struct StillWanted(pub std::sync::Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for StillWanted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StillWanted")
    }
}

impl Record {
    /// Whether the holder is gone: its process ended (and, for a confined job, its
    /// cgroups are empty: a process it left behind still runs on its GPUs), its pid now
    /// belongs to another process, or it never got a process within `grace` (of its
    /// creation, before or after: see below). The cgroups are read only once the pid is
    /// gone, so the usual check stays one read of /proc.
    pub fn is_stale(&self, now: SystemTime, grace: Duration) -> bool {
        self.is_stale_in(now, grace, &mut procinfo::Liveness::default())
    }

    /// `is_stale`, as part of a look at many records: `look` asks /proc about each
    /// process once.
    pub(crate) fn is_stale_in(
        &self,
        now: SystemTime,
        grace: Duration,
        look: &mut procinfo::Liveness,
    ) -> bool {
        if self.from_an_earlier_boot() || self.expired(now) {
            return true;
        }
        match (self.pid, self.start_time) {
            (None, _) if self.until_release => false,
            (Some(pid), Some(started)) => {
                !look.is_alive(pid, started)
                    && !self
                        .cgroups
                        .iter()
                        .any(|d| crate::host::confine::populated(d))
            }
            // A pid without a start time was gone when it was recorded (gpupin reads the
            // start time as it records the pid): whoever has the pid now is someone else.
            (Some(_), None) => true,
            (None, _) => {
                let created = crate::base::clock::unix(self.created_at);
                // Created "in the future" means the clock was stepped back since: the
                // record's age is unknown, and waiting for the clock to catch up could
                // hold its GPUs for days. Off by more than the grace either way is stale.
                let age = match now.duration_since(created) {
                    Ok(age) => age,
                    Err(ahead) => ahead.duration(),
                };
                age > grace
            }
        }
    }

    /// A hold whose time (`gpupin hold --for`) is up.
    pub fn expired(&self, now: SystemTime) -> bool {
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.expires_at.is_some_and(|end| now >= end)
    }

    /// Made before this boot: its process is gone, whatever its pid says now (a pid and
    /// start time can repeat across boots). This is why records need no fsync.
    pub fn from_an_earlier_boot(&self) -> bool {
        procinfo::boot_time().is_some_and(|boot| self.created_at < boot)
    }

    pub fn created(&self) -> SystemTime {
        crate::base::clock::unix(self.created_at)
    }

    /// How tables and messages name the holder: a container's name where its engine told
    /// it, else its id, an engine's long hex id cut to 12 characters (`shown_id`).
    pub fn shown_name(&self) -> &str {
        match self.container.as_ref().and_then(|c| c.name.as_deref()) {
            Some(name) if self.kind == HolderKind::Container => name,
            _ => crate::model::holder::shown_id(&self.id),
        }
    }

    /// How people know the holder: a container's name where its engine told it (what
    /// `docker ps` shows), else its id.
    pub fn display_name(&self) -> &str {
        match (
            self.kind,
            self.container.as_ref().and_then(|c| c.name.as_deref()),
        ) {
            (HolderKind::Container, Some(name)) => name,
            _ => &self.id,
        }
    }

    /// Whether a container or a job still runs on the holder's GPUs, or is about to: its
    /// process lives, or its claim waits for its process within the grace. A hold
    /// (`gpupin hold`, until released or for a process's life) does not: it sets GPUs
    /// aside, and releasing it is how it ends.
    pub fn runs(&self, now: SystemTime, grace: Duration) -> bool {
        self.kind != HolderKind::Hold && !self.is_stale(now, grace)
    }
}

/// The records among `records` that hold the GPU `uuid`.
pub(crate) fn holders_of<'r>(
    uuid: &str,
    records: &'r [Record],
) -> impl Iterator<Item = &'r Record> {
    records
        .iter()
        .filter(move |r| r.gpus.iter().any(|g| g == uuid))
}

/// The holder among `records` that `process` belongs to (`whose::belongs_to`): by its
/// process tree first, then, for containers, by cgroup.
pub(crate) fn holder_of<'r>(
    process: &crate::host::whose::Process,
    records: &'r [Record],
) -> Option<&'r Record> {
    let container_id = |r: &'r Record| (r.kind == HolderKind::Container).then_some(r.id.as_str());
    records
        .iter()
        .find(|r| crate::host::whose::belongs_to(process, r.pid, None))
        .or_else(|| {
            records
                .iter()
                .find(|r| crate::host::whose::belongs_to(process, None, container_id(r)))
        })
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

// The audit trail knows events, not records: what an event says about a record is the
// ledger's to tell.
impl GpuRef {
    /// The GPUs of `record`, with the indices it was allocated under.
    pub fn of_record(record: &Record) -> Vec<GpuRef> {
        record
            .gpus
            .iter()
            .enumerate()
            .map(|(i, uuid)| GpuRef {
                index: record.indices.get(i).copied(),
                uuid: uuid.clone(),
            })
            .collect()
    }
}

impl Event {
    /// An event about the holder of `record`: who it is, its GPUs, its request.
    pub fn for_record(event: EventKind, record: &Record) -> Event {
        Event {
            gpus: GpuRef::of_record(record),
            request: Some(record.request.clone()),
            pid: record.pid,
            within: record.request.within.clone(),
            ..Event::for_holder(
                event,
                &record.id,
                record.kind,
                record.owner.as_ref(),
                record.container.as_ref(),
            )
        }
    }

    /// With how long `record` was held until now (release, reap).
    pub fn held_since(mut self, record: &Record) -> Event {
        self.held_s = Some(super::unix_now().saturating_sub(record.created_at));
        self
    }
}
