//! `gpupin log`: the audit trail's events as a table for people, and one row at a time
//! as `--follow` prints them. The binary prints them; `--json` is the log's own lines.

use super::table::aligned;
use crate::state::audit::{Entry, Event, unit_name};

/// `gpupin log`: one row per event, oldest first.
pub fn log_table(entries: &[Entry]) -> String {
    let mut rows = vec![["TIME", "EVENT", "HOLDER", "USER", "GPUS", "DETAIL"].map(String::from)];
    rows.extend(entries.iter().map(|e| cells(&e.event)));
    render(&rows)
}

/// One event as a line of `log_table` without the header or the column widths of the
/// others: what `gpupin log --follow` prints as each event comes.
pub fn log_row(entry: &Entry) -> String {
    render(&[cells(&entry.event)])
}

/// TIME, EVENT, HOLDER (a container's name where its engine told it, as people know it;
/// else the id, a container's cut to 12 characters as docker shows it), USER, GPUS, DETAIL.
fn cells(event: &Event) -> [String; 6] {
    [
        event.time.clone(),
        event.event.as_str().to_string(),
        event.shown_holder().to_string(),
        event.who().to_string(),
        gpus(event),
        detail(event),
    ]
}

fn render(rows: &[[String; 6]]) -> String {
    // Names and reasons come from containers and engines: none may start a line of its own.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::base::message::escape_controls(c))
                .collect()
        })
        .collect();
    aligned(&rows, &[])
}

/// Indices where known, else UUIDs.
fn gpus(event: &Event) -> String {
    let names: Vec<String> = event
        .gpus
        .iter()
        .map(|g| unit_name(g.index, &g.uuid))
        .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    }
}

/// What else a person wants to know about the event: how long, why, which container.
fn detail(event: &Event) -> String {
    let mut parts = Vec::new();
    if let Some(held) = event.held_s {
        parts.push(format!("held for {}", held_for(held)));
    }
    if let Some(reason) = &event.reason {
        parts.push(reason.clone());
    }
    // The name is in HOLDER; the image says what ran.
    parts.extend(event.container.image.clone());
    if let Some(within) = &event.within {
        parts.push(format!("within {within}"));
    }
    parts.join("; ")
}

/// `45s`, `5m03s`, `1h02m`, `2d03h`: two units, the larger first.
pub(super) fn held_for(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::audit::{EventKind, GpuRef};

    #[test]
    fn held_for_reads_in_two_units() {
        assert_eq!(held_for(45), "45s");
        assert_eq!(held_for(303), "5m03s");
        assert_eq!(held_for(3720), "1h02m");
        assert_eq!(held_for(2 * 86400 + 3 * 3600 + 59), "2d03h");
    }

    fn entry(event: Event) -> Entry {
        Entry {
            at: event.at().unwrap(),
            line: serde_json::to_string(&event).unwrap(),
            event,
        }
    }

    #[test]
    fn a_log_row_says_who_which_gpus_and_why_on_one_line() {
        let mut allocate = Event::new(EventKind::Allocate, "c1");
        allocate.time = "2024-05-01T12:00:00Z".into();
        allocate.container.engine = Some("docker".into());
        allocate.container.name = Some("train".into());
        allocate.container.image = Some("pytorch:24".into());
        allocate.gpus = vec![
            GpuRef {
                index: Some(0),
                uuid: "GPU-0".into(),
            },
            GpuRef {
                index: None,
                uuid: "GPU-x".into(),
            },
        ];
        let release = Event {
            held_s: Some(3720),
            reason: Some("a\nb".into()),
            ..allocate.clone()
        };
        let release = Event {
            event: EventKind::Release,
            ..release
        };
        let text = log_table(&[entry(allocate.clone()), entry(release)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // The container's name is the HOLDER people know; its image says what ran.
        assert_eq!(
            lines[1],
            "2024-05-01T12:00:00Z  allocate  train   docker  0,GPU-x  pytorch:24"
        );
        assert_eq!(
            lines[2],
            "2024-05-01T12:00:00Z  release   train   docker  0,GPU-x  held for 1h02m; a\\nb; pytorch:24"
        );
        // --follow's rows: the same cells, one event at a time.
        // An unnamed container by its engine's id cut as docker cuts it; any other id,
        // however long, whole.
        let mut unnamed = entry(allocate);
        unnamed.event.container.name = None;
        unnamed.event.holder = "0123456789abcdef".repeat(4);
        assert_eq!(
            log_row(&unnamed),
            "2024-05-01T12:00:00Z  allocate  0123456789ab  docker  0,GPU-x  pytorch:24\n"
        );
        unnamed.event.holder = "maintenance-gpu7".into();
        assert!(
            log_row(&unnamed).contains("  maintenance-gpu7  "),
            "{}",
            log_row(&unnamed)
        );
    }
}
