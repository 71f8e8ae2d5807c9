//! The daemon's looks for idle holders: every `look_every(idle_after)` the live figures
//! (NVML, or the `live_file`) and `Ledger::look_for_idle`. Here, and nowhere on a
//! container's way to its GPUs: the hook never samples, and `gpupin status` and the
//! metrics only read what the last look wrote.

use crate::base::message::one_line;
use crate::host::inventory;
use crate::input::config::Config;
use crate::state::ledger::IdleRule;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Looks until `stopping`, with the config `config` gives at each look (a reload changes
/// the rule from the next look on). Never fails: a look that cannot be made is logged
/// and the next one tried.
pub(super) fn looks(config: impl Fn() -> Arc<Config>, stopping: &AtomicBool) {
    loop {
        let now = config();
        let rule = IdleRule::of(&now);
        std::thread::sleep(rule.every);
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        // The config as it is after the sleep: a reload meanwhile counts now.
        let now = config();
        if let Err(error) = look(&now, &IdleRule::of(&now)) {
            tracing::warn!(error, "could not look for idle holders");
        }
    }
}

/// One look. Without live figures (a simulated machine with no `live_file`) there is
/// nothing to look at, and nothing is written.
fn look(config: &Config, rule: &IdleRule) -> Result<(), String> {
    let inventory = config.load_inventory().map_err(|e| one_line(&e))?;
    let live = inventory::read_live(config.live_file.as_deref(), &inventory, &config.nvml, None)
        .map_err(|e| one_line(&e))?;
    let Some(live) = live else {
        return Ok(());
    };
    let ledger = crate::state::open_ledger(config).map_err(|e| one_line(&e))?;
    let look = ledger
        .look_for_idle(&inventory, &live, rule)
        .map_err(|e| one_line(&e))?;
    for holder in &look.released {
        tracing::info!(
            holder,
            "released an idle hold (idle_action = \"release-holds\")"
        );
    }
    Ok(())
}
