//! `gpupin queue`, and the queue under `gpupin status`: the waiting requests as a table
//! and as JSON.

use super::table::{self, Cell, Style};
use super::{STATUS_WIDTH, paint_if};
use crate::state::ledger::Waiting;
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// `gpupin queue` (and the queue in `gpupin status`): one row per waiting request, in
/// the order they will be served: position, the name people know it by, whose it is,
/// what it asked for, how long it has waited, and why it waits (`WaitReason`, as its
/// waiter's last look found; `-` before its first). A request held back only by a limit
/// is `parked` (nobody waits behind it) and says which limit.
pub fn queue_table(waiting: &[Waiting], now: SystemTime, colour: bool) -> String {
    let header = [
        "WAITING", "HOLDER", "USER", "PID", "REQUEST", "WAITED", "WHY",
    ];
    let mut rows: Vec<Vec<Cell>> = vec![header.map(Cell::from).to_vec()];
    for (position, w) in waiting.iter().enumerate() {
        let place = match w.parked {
            true => format!("{} parked", position + 1),
            false => (position + 1).to_string(),
        };
        rows.push(vec![
            Cell::from(place),
            Cell::from(w.name.clone().unwrap_or_else(|| w.holder.clone())),
            Cell::from(w.user.clone().unwrap_or_else(|| "-".into())),
            Cell::from(w.pid.map_or("-".into(), |p| p.to_string())),
            Cell::from(w.request.clone()),
            Cell::from(waited(w, now)),
            Cell::from(why(w)),
        ]);
    }
    // WHY is never cut: it is what the reader came for.
    let text = table::fitted(&rows, STATUS_WIDTH, &[(1, 12), (2, 8), (4, 12)]);
    paint_if(colour, text, &[Style::Header])
}

/// Why `w` waits, for people; `-` before its waiter's first look.
fn why(w: &Waiting) -> String {
    w.reason
        .as_ref()
        .map_or_else(|| "-".into(), ToString::to_string)
}

/// The queue as JSON: the fields of `queue_table`, the wait in seconds.
pub fn queue_json(waiting: &[Waiting], now: SystemTime) -> Value {
    let list: Vec<Value> = waiting
        .iter()
        .enumerate()
        .map(|(position, w)| {
            json!({
                "position": position + 1,
                "holder": w.holder,
                "name": w.name,
                "user": w.user,
                "pid": w.pid,
                "request": w.request,
                "waited_s": waited_secs(w, now),
                "parked": w.parked,
                "reason": w.reason.as_ref().map(ToString::to_string),
            })
        })
        .collect();
    Value::Array(list)
}

fn waited_secs(w: &Waiting, now: SystemTime) -> u64 {
    let since = crate::base::clock::unix(w.queued_at);
    now.duration_since(since).map_or(0, |d| d.as_secs())
}

/// `1m 20s`: how long a request has waited, to the second.
fn waited(w: &Waiting, now: SystemTime) -> String {
    humantime::format_duration(Duration::from_secs(waited_secs(w, now))).to_string()
}
