//! `node_access`: who may open the GPU nodes besides what gpupin gives. With "acl" a
//! node that others may still open by its mode makes the ACLs pointless; with "open" the
//! finding says what that means.

use super::{Finding, Setup};
use crate::input::config::NodeAccess;
use crate::model::gpu::Inventory;
use crate::state::node_access;
use std::os::unix::fs::MetadataExt;

const CHECK: &str = "node_access";

pub(super) fn check(setup: &Setup, inventory: &Inventory) -> Finding {
    let config = &setup.config;
    if config.node_access == NodeAccess::Open {
        return Finding::ok(
            CHECK,
            "node access: open: the nodes' modes decide who opens a GPU, and device cgroups keep jobs to theirs (no boundary between users)",
        );
    }
    let nodes = node_access::wanted(inventory, &[], |_| false, &config.node_dir);
    let open: Vec<String> = nodes
        .iter()
        .filter(|n| std::fs::symlink_metadata(&n.path).is_ok_and(|m| m.mode() & 0o006 != 0))
        .map(|n| n.path.display().to_string())
        .collect();
    if open.is_empty() {
        return Finding::ok(
            CHECK,
            format!(
                "node access: acl: {} GPU node{} under {} closed to others; gpupin owns their named-user ACL entries",
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" },
                config.node_dir.display()
            ),
        );
    }
    Finding::problem(
        CHECK,
        format!(
            "node access: acl, but every user may still open {} by its mode: the ACL entries gpupin writes keep no one out",
            open.join(", ")
        ),
    )
    .fix("make the nodes root-only: options nvidia NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=0 NVreg_DeviceFileMode=0600 in /etc/modprobe.d/nvidia-gpupin.conf, then reload the driver or reboot")
}
