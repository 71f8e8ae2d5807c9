//! `gpupin metrics`: Prometheus exposition text about the GPUs and their holders, the
//! queue, and counters from the audit log; and with `metrics_file`, the same text
//! rewritten atomically on every ledger change, for node_exporter's textfile collector
//! (no daemon needed).

mod counters;
mod render;

pub(crate) use counters::{Counters, update_saved};
pub(crate) use render::{Holding, IdleHolder, Snapshot, render};

use crate::host::inventory;
use crate::input::config::{AuditLog, Config, InventorySettings};
use crate::model::gpu::Inventory;
use crate::model::live::Live;
use crate::state::ledger::{Ledger, Record};
use std::path::{Path, PathBuf};

/// Where the cursor of the counters is kept (`update_saved`), in the state dir.
pub(crate) const CURSOR_FILE: &str = "metrics-cursor.json";

/// The counters' cursor of `ledger`: in its state dir, kept by the state dir's owner (the
/// metrics file's writer, root's `gpupin metrics`), read by everyone's `gpupin metrics`
/// so that a scrape reads only the audit lines written since.
pub fn cursor_of(ledger: &Ledger) -> PathBuf {
    ledger.dir().join(CURSOR_FILE)
}
/// How many audit lines could not be written, in the state dir: the audit log cannot
/// count its own failures (`gpupin_audit_write_failures_total`).
/// The `metrics_file`, rewritten after each change of the ledger it observes, and what
/// it reads besides the ledger: the inventory, live figures, the audit log's counters.
#[derive(Debug, Clone)]
pub(crate) struct FileSink {
    pub file: PathBuf,
    pub inventory: InventorySettings,
    /// Live figures only from a file (`live_file`): NVML would cost every container
    /// start a query.
    pub live_file: Option<PathBuf>,
    /// The audit log the counters are read from.
    pub audit: AuditLog,
}

impl FileSink {
    /// The sink of `config`'s `metrics_file`, writing `file`.
    pub(crate) fn new(file: PathBuf, config: &Config) -> FileSink {
        FileSink {
            file,
            inventory: config.inventory_settings(),
            live_file: config.live_file.clone(),
            audit: config.audit(),
        }
    }
}

/// The holdings of `records`: one per GPU a record holds.
pub(crate) fn holdings(records: &[Record], stale: impl Fn(&Record) -> bool) -> Vec<Holding> {
    records
        .iter()
        .flat_map(|r| {
            let gone = stale(r);
            r.gpus.iter().map(move |uuid| Holding {
                uuid: uuid.clone(),
                // As people know it: a container's name, else its id (a container's
                // cut to 12 characters, as docker shows it).
                holder: r.shown_name().to_string(),
                kind: r.kind.as_str().to_string(),
                user: r.owner.as_ref().map(|o| o.user.clone()),
                engine: r.container.as_ref().and_then(|c| c.engine.clone()),
                shared: r.mode == crate::state::ledger::Mode::Shared,
                gone,
            })
        })
        .collect()
}

/// Everything `render` needs, read now: the ledger's records and queue, the counters of
/// `audit` and of the ledger's unwritten lines, and live figures where `live` is given.
pub fn snapshot_text(
    audit: &AuditLog,
    ledger: &Ledger,
    inventory: &Inventory,
    live: Option<&[Live]>,
    cursor: Option<&Path>,
) -> Result<String, crate::state::ledger::LedgerError> {
    let records = ledger.records()?;
    let waiting = ledger.waiting()?;
    let mut counters = update_saved(audit, cursor);
    counters.audit_write_failures = crate::state::ledger::audit_write_failures(ledger.dir());
    let now = crate::state::ledger::unix_now();
    let idle = ledger
        .idle(&records)
        .into_iter()
        .filter_map(|i| {
            let r = records.iter().find(|r| r.id == i.holder)?;
            Some(IdleHolder {
                holder: r.shown_name().to_string(),
                kind: r.kind.as_str().to_string(),
                user: r.owner.as_ref().map(|o| o.user.clone()),
                seconds: now.saturating_sub(i.since),
            })
        })
        .collect();
    let stale = ledger.stale_ids(&records);
    let fences = ledger.fences().ok();
    let snapshot = Snapshot {
        inventory,
        holdings: holdings(&records, |r| stale.contains(r.id.as_str())),
        holders: &records,
        queue_length: waiting.len(),
        oldest_wait_seconds: waiting
            .iter()
            .map(|w| now.saturating_sub(w.queued_at))
            .max(),
        counters: &counters,
        live,
        idle,
        fences: fences.as_ref(),
    };
    Ok(render(&snapshot))
}

impl crate::state::ledger::ChangeObserver for FileSink {
    fn changed(&self, ledger: &Ledger) {
        self.refresh(ledger);
    }
}

impl FileSink {
    /// Rewrites the metrics file. Best effort by design, as the audit log: a metrics file
    /// must never be the reason a container does not start. Live figures only from a
    /// `live_file` (NVML would cost every container start a query).
    pub(crate) fn refresh(&self, ledger: &Ledger) {
        let written = self
            .inventory
            .load()
            .map_err(|e| crate::base::message::one_line(&e))
            .and_then(|inventory| {
                let live = match &self.live_file {
                    Some(_) => inventory::read_live(
                        self.live_file.as_deref(),
                        &inventory,
                        &self.inventory.nvml,
                        None,
                    )
                    .ok()
                    .flatten(),
                    None => None,
                };
                // The counters' cursor is the ledger's, as is the state dir it is in.
                let cursor = cursor_of(ledger);
                snapshot_text(
                    &self.audit,
                    ledger,
                    &inventory,
                    live.as_deref(),
                    Some(&cursor),
                )
                .map_err(|e| crate::base::message::one_line(&e))
            })
            .and_then(|text| {
                crate::base::atomic::replace(
                    &self.file,
                    text.as_bytes(),
                    0o644,
                    crate::base::atomic::Durability::Renamed,
                )
                .map_err(|e| crate::base::message::one_line(&e))
            });
        if let Err(error) = written {
            tracing::warn!(file = ?self.file, error, "could not rewrite the metrics file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::holder::{ContainerInfo, HolderKind};

    /// The `holder` label names holders as `gpupin status` does, not by 64-digit ids.
    #[test]
    fn the_holder_label_is_the_name_people_know() {
        let id = "3f2a1b2c3d4e5f60718293a4b5c6d7e8091a2b3c4d5e6f708192a3b4c5d6e7f8";
        let mut named = crate::state::ledger::testing::record(id, &["GPU-0"]);
        named.kind = HolderKind::Container;
        named.container = Some(ContainerInfo {
            engine: Some("docker".into()),
            name: Some("web-1".into()),
            image: None,
        });
        let mut unnamed = named.clone();
        unnamed.container = None;
        let hold = crate::state::ledger::testing::record("maint-7", &["GPU-1"]);
        let labels: Vec<String> = holdings(&[named, unnamed, hold], |_| false)
            .into_iter()
            .map(|h| h.holder)
            .collect();
        assert_eq!(labels, ["web-1", "3f2a1b2c3d4e", "maint-7"]);
    }
}
