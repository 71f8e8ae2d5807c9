//! One holder's record: which GPUs it holds, for what, and how to tell whether it still runs.

use crate::procinfo;
use crate::request::GpuRequest;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// By default a holder that never got a pid is stale after this long (a claim whose
/// container never started, or a runtime that died between allocation and binding).
pub const UNBOUND_GRACE: Duration = crate::config::DEFAULT_CLAIM_GRACE;

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
    /// Seconds since the Unix epoch.
    pub created_at: u64,
}

/// What an allocation knows about the holder besides its id.
#[derive(Debug, Clone, Default)]
pub struct HolderMeta {
    pub source: String,
    pub pid: Option<i32>,
    pub bundle: Option<PathBuf>,
    /// See `Record::claim_digest`.
    pub claim_digest: Option<String>,
}

impl Record {
    /// Whether the holder is gone: its process ended, its pid now belongs to another
    /// process, or it never got a process within `grace` (of its creation, before or
    /// after: see below).
    pub fn is_stale(&self, now: SystemTime, grace: Duration) -> bool {
        if self.from_an_earlier_boot() {
            return true;
        }
        match (self.pid, self.start_time) {
            (Some(pid), Some(started)) => !procinfo::is_alive(pid, started),
            // A pid without a start time was gone when it was recorded (gpupin reads the
            // start time as it records the pid): whoever has the pid now is someone else.
            (Some(_), None) => true,
            (None, _) => {
                let created = UNIX_EPOCH + Duration::from_secs(self.created_at);
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

    /// Made before this boot: its process is gone, whatever its pid says now (a pid and
    /// start time can repeat across boots). This is why records need no fsync.
    pub fn from_an_earlier_boot(&self) -> bool {
        procinfo::boot_time().is_some_and(|boot| self.created_at < boot)
    }

    pub fn created(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.created_at)
    }
}

/// The records among `records` that hold the GPU `uuid`.
pub fn holders_of<'r>(uuid: &str, records: &'r [Record]) -> impl Iterator<Item = &'r Record> {
    records
        .iter()
        .filter(move |r| r.gpus.iter().any(|g| g == uuid))
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
