//! The NVML snapshot cache: `<state_dir>/live-cache.json`, so that a burst of container
//! starts pays for one NVML query (a process start, for the static hook and shim) rather
//! than one each.
//!
//! ```json
//! {"taken_at_ms": 1764700000123, "gpus": [ … live file format, by UUID … ]}
//! ```
//!
//! A snapshot is used while it is younger than `live_cache` (the config key, 2 s by
//! default; `0s` turns the cache off) and names every GPU of the inventory; one from the
//! future (a clock stepped back), unreadable or invalid is asked over. Like the inventory
//! cache it is written only where the state dir exists, and a failed write is ignored:
//! the cache only saves time. A process that started on a GPU within that time is not
//! in the snapshot: the price of the saving, and why the default is short.

use super::InventoryError;
use super::live::{self, Entry};
use crate::base::atomic::{self, Durability};
use crate::base::safe_open::{self, Links};
use crate::model::gpu::Inventory;
use crate::model::live::Live;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const FILE_NAME: &str = "live-cache.json";
/// Readable by everyone, as the ledger is: nvidia-smi shows the same to every user.
const MODE: u32 = 0o644;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Cached {
    taken_at_ms: u64,
    gpus: Vec<Entry>,
}

/// The figures of a snapshot young enough, else those `ask` gets, which are stored.
pub(super) fn read_or_ask(
    cache: live::Cache,
    inventory: &Inventory,
    ask: impl FnOnce() -> Result<Vec<Live>, InventoryError>,
) -> Result<Vec<Live>, InventoryError> {
    read_or_ask_at(cache, inventory, now_ms(), ask)
}

fn read_or_ask_at(
    cache: live::Cache,
    inventory: &Inventory,
    now_ms: u64,
    ask: impl FnOnce() -> Result<Vec<Live>, InventoryError>,
) -> Result<Vec<Live>, InventoryError> {
    if cache.max_age.is_zero() {
        return ask();
    }
    let path = cache.state_dir.join(FILE_NAME);
    if let Some(figures) = fresh(&path, inventory, now_ms, cache.max_age) {
        tracing::debug!(path = ?path, "live figures from the snapshot cache");
        return Ok(figures);
    }
    let figures = ask()?;
    let stored = store(cache.state_dir, inventory, &figures, now_ms);
    tracing::debug!(path = ?path, cached = stored.is_ok(), "live figures asked");
    Ok(figures)
}

/// The snapshot at `path` when it is at most `max_age` old and covers `inventory`.
fn fresh(path: &Path, inventory: &Inventory, now_ms: u64, max_age: Duration) -> Option<Vec<Live>> {
    // In the state dir: never through a link, never a FIFO.
    let text = safe_open::read(path, Links::Refuse).ok()?;
    let cached: Cached = serde_json::from_slice(&text).ok()?;
    let age = now_ms.checked_sub(cached.taken_at_ms)?;
    if u128::from(age) > max_age.as_millis() {
        return None;
    }
    live::assign(&cached.gpus, path, inventory).ok()
}

fn store(
    state_dir: &Path,
    inventory: &Inventory,
    figures: &[Live],
    now_ms: u64,
) -> std::io::Result<()> {
    // The ledger creates the state dir; the cache does not.
    if !state_dir.is_dir() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let by_uuid: Vec<(String, Live)> = inventory
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .zip(figures.iter().cloned())
        .collect();
    let text = serde_json::json!({
        "taken_at_ms": now_ms,
        "gpus": live::entries_json(&by_uuid),
    })
    .to_string();
    // Lost in a crash, it is asked again: no fsync.
    atomic::replace(
        &state_dir.join(FILE_NAME),
        text.as_bytes(),
        MODE,
        Durability::Renamed,
    )
    .map_err(|e| e.source)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;
    use std::cell::Cell;

    fn figures(utilization: u32, n: usize) -> Vec<Live> {
        vec![
            Live {
                utilization: Some(utilization),
                memory_free: 1 << 30,
                ..Live::default()
            };
            n
        ]
    }

    fn cache(dir: &Path, secs: u64) -> live::Cache<'_> {
        live::Cache {
            state_dir: dir,
            max_age: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_burst_asks_once_and_a_later_request_asks_again() {
        let dir = tempfile::tempdir().unwrap();
        let inv = machine(2);
        let asked = Cell::new(0);
        let ask = |u| {
            asked.set(asked.get() + 1);
            Ok(figures(u, 2))
        };
        let t = 1_000_000;
        let first = read_or_ask_at(cache(dir.path(), 2), &inv, t, || ask(10)).unwrap();
        let second = read_or_ask_at(cache(dir.path(), 2), &inv, t + 1500, || ask(20)).unwrap();
        assert_eq!(
            (asked.get(), first[0].utilization, second[0].utilization),
            (1, Some(10), Some(10))
        );
        let later = read_or_ask_at(cache(dir.path(), 2), &inv, t + 2001, || ask(30)).unwrap();
        assert_eq!((asked.get(), later[0].utilization), (2, Some(30)));
    }

    #[test]
    fn zero_age_a_clock_stepped_back_and_other_gpus_ask_again() {
        let dir = tempfile::tempdir().unwrap();
        let t = 1_000_000;
        read_or_ask_at(cache(dir.path(), 2), &machine(2), t, || Ok(figures(10, 2))).unwrap();
        let again = |c, inv: &Inventory, at| {
            read_or_ask_at(c, inv, at, || Ok(figures(99, inv.gpus.len()))).unwrap()[0].utilization
        };
        assert_eq!(again(cache(dir.path(), 0), &machine(2), t), Some(99));
        assert_eq!(again(cache(dir.path(), 2), &machine(2), t - 1), Some(99));
        assert_eq!(again(cache(dir.path(), 2), &machine(3), t + 1), Some(99));
    }

    #[test]
    fn the_cache_file_is_never_a_link_and_gets_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        let t = 1_000_000;
        std::fs::write(
            &elsewhere,
            serde_json::json!({"taken_at_ms": t, "gpus": [{"index": 0, "utilization": 1, "memory_free": 1}]})
                .to_string(),
        )
        .unwrap();
        let path = dir.path().join(FILE_NAME);
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let got = read_or_ask_at(cache(dir.path(), 2), &machine(1), t, || Ok(figures(7, 1)));
        assert_eq!(
            got.unwrap()[0].utilization,
            Some(7),
            "the link was not read"
        );
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "the link was replaced by a file");
        assert_eq!(meta.permissions().mode() & 0o777, MODE);
    }

    #[test]
    fn no_state_dir_no_cache_and_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("state");
        let got = read_or_ask_at(cache(&missing, 2), &machine(1), 5, || Ok(figures(3, 1)));
        assert_eq!(got.unwrap()[0].utilization, Some(3));
        assert!(!missing.exists());
    }
}
