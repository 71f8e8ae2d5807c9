//! What a container sees of the GPUs: device nodes under its /dev and its device cgroup.

use crate::Container;
use std::collections::BTreeSet;
use std::path::Path;

pub use crate::driver::{CONTROL_NODES, GPU_MAJOR};

/// Whether a /dev entry is a GPU node, `nvidia<minor>` (not a control node).
pub fn is_gpu_node(name: &str) -> bool {
    name.strip_prefix("nvidia")
        .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
}

/// The GPU nodes among /dev entries (`ls /dev` words, a directory listing), sorted.
pub fn gpu_nodes<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut nodes: Vec<String> = names
        .into_iter()
        .filter(|n| is_gpu_node(n))
        .map(str::to_string)
        .collect();
    nodes.sort();
    nodes
}

/// Names under a runc container's /dev that start with `nvidia`.
pub fn nvidia_nodes(c: &Container) -> BTreeSet<String> {
    let ls = c.exec_stdout(&["ls", "/dev"]).unwrap();
    ls.split_whitespace()
        .filter(|n| n.starts_with("nvidia"))
        .map(str::to_string)
        .collect()
}

/// The GPU nodes (`nvidia<minor>`) under a runc container's /dev, without control nodes.
pub fn nvidia_gpu_nodes(c: &Container) -> Vec<String> {
    gpu_nodes(nvidia_nodes(c).iter().map(String::as_str))
}

/// `stat -c %F %t:%T` of a path in the container: type, then major:minor in hex (busybox).
pub fn stat_node(c: &Container, path: &str) -> String {
    c.exec_stdout(&["stat", "-c", "%F %t:%T", path])
        .unwrap()
        .trim()
        .to_string()
}

/// What `stat_node` prints for a character device major:minor.
pub fn char_node(major: u32, minor: u32) -> String {
    format!("character special file {major:x}:{minor:x}")
}

/// The device cgroup v1 allow list of a host pid, as the kernel reports it.
pub fn devices_list(pid: i32) -> BTreeSet<String> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cgroups
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .expect("a devices cgroup v1 line");
    let list = Path::new("/sys/fs/cgroup/devices")
        .join(path.trim_start_matches('/'))
        .join("devices.list");
    std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_nodes_leave_out_control_nodes() {
        let ls = "null nvidia1 nvidiactl nvidia-uvm nvidia0 nvidia nvidia-caps zero";
        assert_eq!(gpu_nodes(ls.split_whitespace()), vec!["nvidia0", "nvidia1"]);
    }
}
