//! Processes left in a job's cgroup after its main process exited: found from the
//! records' cgroups and /proc, and named one line per job under `gpupin status`.

use super::holder;
use super::table;
use crate::state::ledger::Record;

/// A process left in a job's cgroup after the job's main process exited: the job keeps
/// its GPUs while it runs (`leftovers = "wait"`), so status names it, and its user knows
/// what to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub holder: String,
    /// The job's main process, which has exited.
    pub main_pid: i32,
    pub pid: i32,
    /// Its command line, as `ps` shows it.
    pub command: String,
}

/// The processes left in the cgroups of jobs whose main process has exited, read from
/// the cgroups the records name and /proc (what `ps` shows anyone).
pub(crate) fn leftovers(records: &[Record]) -> Vec<Leftover> {
    let mut found = Vec::new();
    for r in records
        .iter()
        .filter(|r| r.kind == crate::model::holder::HolderKind::Exec)
    {
        let (Some(main_pid), Some(cgroup)) =
            (r.pid, crate::host::confine::JobCgroup::recorded(&r.cgroups))
        else {
            continue;
        };
        if r.start_time
            .is_some_and(|s| crate::base::procinfo::is_alive(main_pid, s))
        {
            continue;
        }
        for pid in cgroup.members() {
            let command = crate::host::whose::read(pid, &|_| None)
                .map_or_else(|| "?".to_string(), |p| p.command);
            found.push(Leftover {
                holder: r.id.clone(),
                main_pid,
                pid,
                command,
            });
        }
    }
    found
}

/// The most leftovers one line names; the rest are counted.
const LEFTOVERS_NAMED: usize = 3;

/// `exec-4242: main process 4242 exited; leftover pid 4250 (python serve.py) keeps its
/// GPUs: end it, or gpupin evict exec-4242`: one line per job, holders in ledger order.
pub(super) fn leftover_lines(records: &[Record], leftovers: &[Leftover]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in records {
        let mine: Vec<&Leftover> = leftovers.iter().filter(|l| l.holder == r.id).collect();
        let Some(first) = mine.first() else {
            continue;
        };
        let mut named: Vec<String> = mine
            .iter()
            .take(LEFTOVERS_NAMED)
            .map(|l| format!("{} ({})", l.pid, table::cut(&l.command, 40, false)))
            .collect();
        if mine.len() > LEFTOVERS_NAMED {
            named.push(format!("{} more", mine.len() - LEFTOVERS_NAMED));
        }
        let (pids, keeps) = match mine.len() {
            1 => ("pid", "keeps"),
            _ => ("pids", "keep"),
        };
        let name = holder::label(r);
        lines.push(format!(
            "{name}: main process {} exited; leftover {pids} {} {keeps} its GPUs: end {}, or gpupin evict {name}",
            first.main_pid,
            named.join(", "),
            if mine.len() == 1 { "it" } else { "them" },
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::testing::record;

    #[test]
    fn leftovers_are_named_one_line_per_job() {
        let records = [record("exec-40", &[]), record("exec-50", &[])];
        let left = |holder: &str, pid: i32, command: &str| Leftover {
            holder: holder.into(),
            main_pid: 40,
            pid,
            command: command.into(),
        };
        let one = [left("exec-40", 41, "python serve.py")];
        assert_eq!(
            leftover_lines(&records, &one),
            [
                "exec-40: main process 40 exited; leftover pid 41 (python serve.py) keeps its GPUs: end it, or gpupin evict exec-40"
            ]
        );
        let many: Vec<Leftover> = (41..46).map(|p| left("exec-40", p, "sleep 9")).collect();
        assert_eq!(
            leftover_lines(&records, &many),
            [
                "exec-40: main process 40 exited; leftover pids 41 (sleep 9), 42 (sleep 9), 43 (sleep 9), 2 more keep its GPUs: end them, or gpupin evict exec-40"
            ]
        );
        assert!(leftover_lines(&records, &[]).is_empty());
    }
}
