//! Process identity from /proc: a pid alone is not an identity (pids are reused), a pid
//! with its start time is.

use std::path::Path;

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or
/// `None` when no such process exists or it is a zombie (it has exited; only its parent
/// has not reaped it yet).
pub fn start_time(pid: i32) -> Option<u64> {
    start_time_in(Path::new("/proc"), pid)
}

/// As `start_time`, with a different /proc root (tests use a fake tree).
pub(crate) fn start_time_in(proc_root: &Path, pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_start_time(&stat)
}

/// The comm field may hold spaces and parentheses, so fields are counted after the last ')'.
fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After ')' come field 3 (state) onwards; starttime is field 22.
    let mut fields = after_comm.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(22 - 4)?.parse().ok()
}

/// When this boot began, in seconds since the Unix epoch (`btime` in /proc/stat), read
/// once per process. Nothing gpupin records outlives a reboot: a record made before it
/// belongs to a process that is gone.
pub(crate) fn boot_time() -> Option<u64> {
    static BOOT_TIME: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *BOOT_TIME.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        parse_boot_time(&stat)
    })
}

fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|n| n.trim().parse().ok())
}

/// Whether the process `pid` that started at `started` still runs (and is not a zombie
/// whose container is gone).
pub(crate) fn is_alive(pid: i32, started: u64) -> bool {
    start_time(pid) == Some(started)
}

/// Which processes live, each asked of /proc once: one look at the ledger asks about
/// every holder's process, and on a busy machine thousands of holders name a few
/// processes (the containers of one pod, an inference server's many shares). Kept for
/// one look only: a process that ends after it is seen by the next.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    seen: std::collections::HashMap<(i32, u64), bool>,
}

impl Liveness {
    /// `is_alive`, asked once per process for this look.
    pub(crate) fn is_alive(&mut self, pid: i32, started: u64) -> bool {
        *self
            .seen
            .entry((pid, started))
            .or_insert_with(|| is_alive(pid, started))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_asks_about_each_process_once_and_answers_as_proc_does() {
        let me = std::process::id() as i32;
        let started = start_time(me).unwrap();
        let mut look = Liveness::default();
        assert!(look.is_alive(me, started));
        assert!(look.is_alive(me, started));
        assert!(
            !look.is_alive(me, started + 1),
            "another process under the same pid"
        );
        assert_eq!(look.seen.len(), 2);
    }

    #[test]
    fn parses_start_time_despite_odd_comm() {
        let stat =
            "4242 (we ird) ) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
    }

    #[test]
    fn boot_time_is_btime_and_before_now() {
        let stat = "cpu  1 2 3\nintr 5\nbtime 1764700000\nprocesses 9\n";
        assert_eq!(parse_boot_time(stat), Some(1764700000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        let boot = boot_time().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(boot > 0 && boot <= now, "{boot}");
    }

    #[test]
    fn zombie_has_no_start_time() {
        let stat = "4242 (sleep) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 0 0";
        assert_eq!(parse_start_time(stat), None);
    }

    #[test]
    fn own_process_is_alive_and_bogus_pid_is_not() {
        let me = std::process::id() as i32;
        let started = start_time(me).unwrap();
        assert!(is_alive(me, started));
        assert!(!is_alive(me, started + 1));
        assert_eq!(start_time(-5), None);
        assert_eq!(start_time(i32::MAX), None);
    }
}
