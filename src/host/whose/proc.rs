//! One process as /proc shows it: who runs it, what it runs, whose child it is, which
//! cgroups it is in. Every field other users may read (a `gpupin status` without root
//! sees what `ps` sees).

use std::io::Read;
use std::path::Path;

/// How many parents are followed at most: a process tree deeper than this on a GPU is
/// not a holder's (and the walk must end even if /proc changes under it).
const MAX_DEPTH: usize = 64;
/// The most of a command line kept: enough to tell `python train.py` apart.
const MAX_COMMAND: usize = 256;
/// The most of /proc/PID/cgroup read: one line per hierarchy.
const MAX_CGROUP: u64 = 16 << 10;

/// A process on a GPU, as /proc tells of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    /// Start time since boot, in clock ticks: with the pid, the process's identity.
    pub start_time: u64,
    /// Effective uid (as `ps` shows it).
    pub uid: Option<u32>,
    /// The uid's user name, where known.
    pub user: Option<String>,
    /// Its arguments, space-separated, control characters escaped, cut at 256 characters;
    /// `[comm]` for a process without arguments (a kernel thread, one that cleared them).
    pub command: String,
    /// Parent, grandparent, … up to init.
    pub ancestors: Vec<i32>,
    /// /proc/PID/cgroup as read.
    pub cgroup: String,
}

impl Process {
    /// `bob: python train.py`: who and what, for a line of text.
    pub fn describe(&self, max_command: usize) -> String {
        format!(
            "{}: {}",
            self.user_or_uid(),
            cut(&self.command, max_command)
        )
    }

    /// The user name, else the uid, else `?`.
    pub fn user_or_uid(&self) -> String {
        match (&self.user, self.uid) {
            (Some(name), _) => name.clone(),
            (None, Some(uid)) => uid.to_string(),
            (None, None) => "?".to_string(),
        }
    }
}

/// `text` in at most `max` characters, `…` where cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `pid` from the host's /proc; `None` when it is gone, a zombie, or hidden.
pub(crate) fn read(pid: i32, names: &dyn Fn(u32) -> Option<String>) -> Option<Process> {
    read_in(Path::new("/proc"), pid, names)
}

/// As `read`, under another /proc root (tests use a fake tree).
pub(crate) fn read_in(
    root: &Path,
    pid: i32,
    names: &dyn Fn(u32) -> Option<String>,
) -> Option<Process> {
    let start_time = crate::base::procinfo::start_time_in(root, pid)?;
    let dir = root.join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let uid = effective_uid(&status);
    let command = command(&small(&dir.join("cmdline"), MAX_COMMAND as u64 * 4))
        .or_else(|| status_field(&status, "Name").map(|n| format!("[{n}]")))
        .map(|c| crate::base::message::escape_controls(&c))
        .unwrap_or_default();
    let cgroup = String::from_utf8_lossy(&small(&dir.join("cgroup"), MAX_CGROUP)).into_owned();
    Some(Process {
        pid,
        start_time,
        user: uid.and_then(names),
        uid,
        command: cut(&command, MAX_COMMAND),
        ancestors: ancestors(root, &status),
        cgroup,
    })
}

/// At most `limit` bytes of a /proc file; empty when unreadable.
fn small(path: &Path, limit: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(limit).read_to_end(&mut bytes);
    }
    bytes
}

/// A `Key:\tvalue` line of /proc/PID/status.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// `Uid:` lists real, effective, saved and filesystem uids.
fn effective_uid(status: &str) -> Option<u32> {
    status_field(status, "Uid")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn parent(status: &str) -> Option<i32> {
    status_field(status, "PPid")?.parse().ok()
}

/// The NUL-separated arguments joined by spaces; `None` when there are none.
fn command(cmdline: &[u8]) -> Option<String> {
    let words: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// The parent chain of the process whose status is `status`, nearest first, up to init
/// (pid 1 included) or a parent that is gone.
fn ancestors(root: &Path, status: &str) -> Vec<i32> {
    let mut chain = Vec::new();
    let mut next = parent(status);
    while let Some(pid) = next.filter(|&p| p > 0) {
        if chain.len() == MAX_DEPTH || chain.contains(&pid) {
            break;
        }
        chain.push(pid);
        next = std::fs::read_to_string(root.join(pid.to_string()).join("status"))
            .ok()
            .and_then(|s| parent(&s));
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A fake /proc entry: `ppid`, effective `uid`, `cmdline` as NUL-separated bytes.
    fn fake(root: &Path, pid: i32, ppid: i32, uid: u32, cmdline: &[u8], cgroup: &str) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("stat"),
            format!(
                "{pid} (x) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 0 0",
                500 + pid
            ),
        )
        .unwrap();
        fs::write(
            dir.join("status"),
            format!("Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nPPid:\t{ppid}\nUid:\t0\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
        fs::write(dir.join("cmdline"), cmdline).unwrap();
        fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    fn bob(uid: u32) -> Option<String> {
        (uid == 1000).then(|| "bob".to_string())
    }

    #[test]
    fn reads_user_command_parents_and_cgroup() {
        let root = tempfile::tempdir().unwrap();
        fake(root.path(), 1, 0, 0, b"/sbin/init\0", "0::/\n");
        fake(root.path(), 40, 1, 0, b"sshd\0", "0::/\n");
        fake(
            root.path(),
            42,
            40,
            1000,
            b"python\0train.py\0--lr\x001e-3\0",
            "0::/user.slice\n",
        );
        let p = read_in(root.path(), 42, &bob).unwrap();
        assert_eq!(p.start_time, 542);
        assert_eq!((p.uid, p.user.as_deref()), (Some(1000), Some("bob")));
        assert_eq!(p.command, "python train.py --lr 1e-3");
        assert_eq!(p.ancestors, [40, 1]);
        assert_eq!(p.cgroup, "0::/user.slice\n");
        assert_eq!(p.describe(12), "bob: python trai…");
        assert!(read_in(root.path(), 43, &bob).is_none(), "no such process");
    }

    #[test]
    fn a_command_cannot_steer_a_terminal_or_break_a_line() {
        let root = tempfile::tempdir().unwrap();
        fake(root.path(), 7, 0, 5, b"evil\n\x1b[2Jname\0", "");
        let p = read_in(root.path(), 7, &bob).unwrap();
        assert_eq!(p.command, "evil\\n\\u{1b}[2Jname");
        assert_eq!(p.user_or_uid(), "5");
    }

    #[test]
    fn without_arguments_the_name_stands_in_and_long_ones_are_cut() {
        let root = tempfile::tempdir().unwrap();
        fake(root.path(), 8, 0, 0, b"", "");
        assert_eq!(read_in(root.path(), 8, &bob).unwrap().command, "[python3]");
        let long = "a".repeat(1000);
        fake(root.path(), 9, 0, 0, long.as_bytes(), "");
        let command = read_in(root.path(), 9, &bob).unwrap().command;
        assert_eq!(command.chars().count(), MAX_COMMAND);
        assert!(command.ends_with('…'));
    }

    #[test]
    fn a_parent_loop_ends() {
        let root = tempfile::tempdir().unwrap();
        fake(root.path(), 10, 11, 0, b"a\0", "");
        fake(root.path(), 11, 10, 0, b"b\0", "");
        assert_eq!(read_in(root.path(), 10, &bob).unwrap().ancestors, [11, 10]);
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id() as i32;
        let p = read(me, &|_| None).unwrap();
        assert_eq!(p.uid, Some(rustix::process::geteuid().as_raw()));
        assert!(p.ancestors.contains(&1) || !p.ancestors.is_empty());
        assert!(!p.command.is_empty());
    }
}
