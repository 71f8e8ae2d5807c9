//! Whose are the processes on a GPU: what /proc tells about each pid NVML (or the live
//! file) lists, and the pure rule that ties a process to a holder: its pid or an
//! ancestor's is the holder's (an exec'd job and its children, a container's init and
//! everything it started), or its cgroup is named after the holder's container id
//! (what `docker exec` starts is a child of the shim, not of the container's init).
//! The ledger applies the rule to its records (`ledger::holder_of`).

mod cgroup;
mod passwd;
mod proc;

pub(crate) use cgroup::names_container;
pub(crate) use passwd::{files_owner, passwd_name};
pub(crate) use proc::{Process, read};

use crate::model::live::Live;

/// A process on a GPU: NVML's figure, and what /proc tells of it (`None`: gone since, or
/// hidden from this user by `hidepid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pid: i32,
    pub used_memory: Option<u64>,
    pub process: Option<Process>,
}

/// The processes on each GPU, by position as in `live`, each read from /proc once (a pid
/// on two GPUs is read twice: rare, and cheap). `names` turns a uid into a user name.
pub(crate) fn observe(live: &[Live], names: &dyn Fn(u32) -> Option<String>) -> Vec<Vec<Seen>> {
    live.iter()
        .map(|gpu| {
            gpu.processes
                .iter()
                .flatten()
                .map(|p| Seen {
                    pid: p.pid,
                    used_memory: p.used_memory,
                    process: read(p.pid, names),
                })
                .collect()
        })
        .collect()
}

/// `processes` without the ones that have ended since they were observed (their pid is
/// gone, or belongs to a later process now).
pub(crate) fn still_running(processes: &[Vec<Seen>]) -> Vec<Vec<Seen>> {
    processes
        .iter()
        .map(|gpu| {
            gpu.iter()
                .filter(|s| {
                    s.process
                        .as_ref()
                        .is_some_and(|p| crate::base::procinfo::is_alive(p.pid, p.start_time))
                })
                .cloned()
                .collect()
        })
        .collect()
}

/// Whether `process` belongs to the holder whose process is `pid` (it, or a descendant),
/// or, for a container, whose id is `container_id` (its cgroup is named after it).
pub(crate) fn belongs_to(process: &Process, pid: Option<i32>, container_id: Option<&str>) -> bool {
    // Pid 1 is everyone's ancestor; no holder's process is init.
    let by_pid =
        pid.is_some_and(|pid| pid > 1 && (process.pid == pid || process.ancestors.contains(&pid)));
    by_pid || container_id.is_some_and(|id| names_container(&process.cgroup, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: i32, ancestors: &[i32], cgroup: &str) -> Process {
        Process {
            pid,
            start_time: 1,
            uid: Some(1000),
            user: Some("bob".into()),
            command: "python train.py".into(),
            ancestors: ancestors.to_vec(),
            cgroup: cgroup.into(),
        }
    }

    #[test]
    fn a_process_is_its_holders_by_pid_tree() {
        let p = process(300, &[200, 100, 1], "0::/user.slice\n");
        assert!(belongs_to(&p, Some(300), None), "the holder's own pid");
        assert!(belongs_to(&p, Some(100), None), "a descendant");
        assert!(!belongs_to(&p, Some(400), None));
        assert!(!belongs_to(&p, Some(1), None), "init is no holder");
        assert!(!belongs_to(&p, None, None));
    }

    #[test]
    fn a_process_is_a_containers_by_its_cgroup() {
        let p = process(300, &[1], "12:devices:/docker/abc123\n0::/\n");
        assert!(belongs_to(&p, Some(999), Some("abc123")));
        assert!(!belongs_to(&p, Some(999), Some("abc12")));
        assert!(!belongs_to(&p, Some(999), None));
    }

    #[test]
    fn observing_keeps_the_gpus_order_and_reads_this_process() {
        let me = std::process::id() as i32;
        let live = [
            Live {
                processes: Some(vec![crate::model::live::GpuProcess {
                    pid: me,
                    used_memory: Some(7),
                }]),
                ..Live::default()
            },
            Live::default(),
        ];
        let seen = observe(&live, &|_| None);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0][0].used_memory, Some(7));
        let p = seen[0][0]
            .process
            .as_ref()
            .expect("this process is in /proc");
        assert_eq!(p.pid, me);
        assert!(seen[1].is_empty());
        assert_eq!(still_running(&seen), seen);
        let gone = vec![vec![Seen {
            process: Some(Process {
                start_time: p.start_time + 1,
                ..p.clone()
            }),
            ..seen[0][0].clone()
        }]];
        assert!(
            still_running(&gone)[0].is_empty(),
            "a later process under the pid"
        );
    }
}
