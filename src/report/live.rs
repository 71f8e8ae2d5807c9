//! What the GPUs do now, as `gpupin status` shows it below the holders: one row of
//! figures per GPU, then one row per process with whose it is (a holder, or "not
//! gpupin's": started without gpupin); and the same as JSON.

use super::table::Cell;
use crate::host::whose::Seen;
use crate::model::gpu::Gpu;
use crate::model::live::Live;
use crate::state::ledger::{Record, holder_of};
use serde_json::{Value, json};

/// What the HOLDER column says of a process no holder owns.
pub(super) const FOREIGN: &str = "not gpupin's";
/// What it says of a process /proc does not show (ended since, or hidden by `hidepid`).
pub(super) const UNKNOWN: &str = "?";

/// Whose a process on a GPU is.
pub(super) enum Whose<'r> {
    Holder(&'r Record),
    Foreign,
    /// /proc does not show it.
    Unknown,
}

/// `records`: the holders that still run (a gone holder's pid may be someone else's now).
pub(super) fn whose<'r>(seen: &Seen, records: &'r [Record]) -> Whose<'r> {
    match &seen.process {
        None => Whose::Unknown,
        Some(p) => holder_of(p, records).map_or(Whose::Foreign, Whose::Holder),
    }
}

/// GPU memory for people: `12.3GiB`, `512MiB`.
pub(super) fn size(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes >= 1 << 30 {
        format!("{:.1}GiB", bytes as f64 / GIB)
    } else {
        format!("{}MiB", bytes >> 20)
    }
}

/// Used of total, `61.2/80.0GiB`; with the total unknown (procfs), what is free.
pub(super) fn memory(gpu: &Gpu, live: &Live) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if gpu.memory_bytes == 0 {
        return format!("{} free", size(live.memory_free));
    }
    let used = gpu.memory_bytes.saturating_sub(live.memory_free);
    format!(
        "{:.1}/{:.1}GiB",
        used as f64 / GIB,
        gpu.memory_bytes as f64 / GIB
    )
}

pub(super) const FIGURES_HEADER: [&str; 5] = ["GPU", "UTIL", "MEMORY", "TEMP", "POWER"];

/// A GPU's row of figures after its index: UTIL, MEMORY, TEMP, POWER (`-` where the
/// source does not tell).
pub(super) fn figures(gpu: &Gpu, live: &Live) -> [Cell; 4] {
    let or_dash = |v: Option<u32>, unit: &str| v.map_or("-".to_string(), |v| format!("{v}{unit}"));
    [
        Cell::from(or_dash(live.utilization, "%")),
        Cell::from(memory(gpu, live)),
        Cell::from(or_dash(live.temperature, "C")),
        Cell::from(or_dash(live.power, "W")),
    ]
}

pub(super) const PROCESSES_HEADER: [&str; 6] =
    ["GPU", "PID", "USER", "MEMORY", "HOLDER", "COMMAND"];

/// A process's row after its GPU: PID, USER, MEMORY, HOLDER, COMMAND; `label` names a
/// holder as the holders table does.
pub(super) fn process(seen: &Seen, whose: &Whose, label: impl Fn(&Record) -> String) -> [Cell; 5] {
    let (user, command) = match &seen.process {
        Some(p) => (p.user_or_uid(), p.command.clone()),
        None => (UNKNOWN.to_string(), String::new()),
    };
    let holder = match whose {
        Whose::Holder(r) => label(r),
        Whose::Foreign => FOREIGN.to_string(),
        Whose::Unknown => UNKNOWN.to_string(),
    };
    [
        Cell::from(seen.pid.to_string()),
        Cell::from(user),
        Cell::from(seen.used_memory.map_or("-".to_string(), size)),
        Cell::from(holder),
        Cell::from(command),
    ]
}

/// A GPU's figures in `gpupin status --json`; null where the source does not tell.
pub(super) fn figures_json(gpu: &Gpu, live: &Live) -> Value {
    let total = (gpu.memory_bytes > 0).then_some(gpu.memory_bytes);
    json!({
        "utilization": live.utilization,
        "memory_free": live.memory_free,
        "memory_used": total.map(|t| t.saturating_sub(live.memory_free)),
        "memory_total": total,
        "temperature": live.temperature,
        "power": live.power,
    })
}

/// A process in `gpupin status --json`: `holder` is the holder's id, `foreign` whether no
/// holder owns it (null, with user and command, when /proc does not show it).
pub(super) fn process_json(seen: &Seen, whose: &Whose) -> Value {
    let p = seen.process.as_ref();
    json!({
        "pid": seen.pid,
        "used_memory": seen.used_memory,
        "uid": p.and_then(|p| p.uid),
        "user": p.and_then(|p| p.user.clone()),
        "command": p.map(|p| p.command.clone()),
        "holder": match whose { Whose::Holder(r) => Some(r.id.clone()), _ => None },
        "foreign": match whose {
            Whose::Holder(_) => Some(false),
            Whose::Foreign => Some(true),
            Whose::Unknown => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_gib_with_one_decimal_or_mib() {
        assert_eq!(size(512 << 20), "512MiB");
        assert_eq!(size(3 << 29), "1.5GiB");
        assert_eq!(size(80 << 30), "80.0GiB");
    }

    #[test]
    fn memory_is_used_of_total_or_free_where_the_total_is_unknown() {
        let mut gpu = crate::policy::testing::machine(1).gpus.remove(0);
        let live = Live {
            memory_free: 20 << 30,
            ..Live::default()
        };
        assert_eq!(memory(&gpu, &live), "60.0/80.0GiB");
        gpu.memory_bytes = 0;
        assert_eq!(memory(&gpu, &live), "20.0GiB free");
    }
}
