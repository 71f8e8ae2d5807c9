//! Device nodes: the majors /proc/devices gives the driver, and the host's /dev/nvidia*
//! nodes against them and the inventory. Containers get nodes with the inventory's
//! numbers, and CUDA inside opens them: a node the host lacks, or numbers that differ,
//! is a GPU that does not work or is another one than the ledger says.

use super::{Finding, Setup};
use crate::host::inventory::char_majors;
use crate::input::config::InventorySource;
use crate::model::gpu::{DeviceNode, Inventory};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

const CHECK: &str = "nodes";

pub(super) fn check(setup: &Setup, inventory: &Inventory) -> Vec<Finding> {
    if let InventorySource::Sim(name) = &setup.config.inventory {
        return vec![Finding::ok(
            CHECK,
            format!(
                "device nodes: sim:{name} is simulated: containers get nodes {}:N that gpupin makes; the host's /dev is not used",
                inventory.gpu_major
            ),
        )];
    }
    let devices = setup.proc.join("devices");
    let text = match std::fs::read_to_string(&devices) {
        Ok(text) => text,
        Err(err) => {
            return vec![Finding::problem(
                CHECK,
                format!("device nodes: reading {}: {err}", devices.display()),
            )];
        }
    };
    let majors = char_majors(&text);
    let Some(&gpu_major) = majors
        .get("nvidia")
        .or_else(|| majors.get("nvidia-frontend"))
    else {
        return vec![Finding::problem(
            CHECK,
            format!(
                "device nodes: {} has no nvidia character device: the nvidia kernel module is not loaded",
                devices.display()
            ),
        )
        .fix("load the driver (modprobe nvidia, or nvidia-smi as root)")];
    };
    let mut findings = Vec::new();
    if inventory.gpu_major != gpu_major {
        findings.push(
            Finding::problem(
                CHECK,
                format!(
                    "device nodes: the inventory gives GPUs major {}, {} says nvidia is {gpu_major}",
                    inventory.gpu_major,
                    devices.display()
                ),
            )
            .fix(match &setup.config.inventory {
                InventorySource::File(path) => format!("set gpu_major to {gpu_major} in {}", path.display()),
                _ => "gpupin inventory --refresh (the cache is from another driver)".to_string(),
            }),
        );
    }
    let uvm_loaded = majors.contains_key("nvidia-uvm");
    if !uvm_loaded {
        findings.push(
            Finding::warn(
                CHECK,
                "device nodes: nvidia-uvm is not loaded: CUDA loads it on first use, and until then containers get no /dev/nvidia-uvm",
            )
            .fix("load it at boot: nvidia-modprobe -u -c 0"),
        );
    }
    let gpu_nodes = inventory.gpus.iter().map(|g| inventory.gpu_node(g));
    let nodes: Vec<DeviceNode> = gpu_nodes
        .chain(inventory.control_nodes.iter().cloned())
        .collect();
    let before = findings.len();
    // Without the module its nodes cannot exist yet: the warning above says so.
    let expected = nodes
        .iter()
        .filter(|n| uvm_loaded || !n.path.starts_with(crate::host::inventory::UVM_NODE));
    for node in expected {
        if let Some(finding) = check_node(setup, node) {
            findings.push(finding);
        }
    }
    if findings.len() == before {
        findings.push(Finding::ok(
            CHECK,
            format!(
                "device nodes: {} GPU node{} and {} control node{} match the inventory; nvidia is major {gpu_major}{}",
                inventory.gpus.len(),
                if inventory.gpus.len() == 1 { "" } else { "s" },
                inventory.control_nodes.len(),
                if inventory.control_nodes.len() == 1 { "" } else { "s" },
                majors.get("nvidia-uvm").map_or(String::new(), |m| format!(", nvidia-uvm {m}"))
            ),
        ));
    }
    findings
}

/// The host's node for `node`, or what is wrong with it.
fn check_node(setup: &Setup, node: &DeviceNode) -> Option<Finding> {
    let host = host_path(setup, &node.path);
    let wanted = format!("char {}:{}", node.major, node.minor);
    let make = match node.path.strip_prefix("/dev/nvidia") {
        Some("-uvm" | "-uvm-tools") => "nvidia-modprobe -u -c 0".to_string(),
        Some("ctl") | Some("-modeset") => "nvidia-modprobe".to_string(),
        Some(minor) => format!("nvidia-modprobe -c {minor}"),
        None => "nvidia-modprobe".to_string(),
    };
    let meta = match std::fs::symlink_metadata(&host) {
        Ok(meta) => meta,
        Err(_) => {
            return Some(
                Finding::problem(
                    CHECK,
                    format!(
                        "device nodes: {} is missing ({wanted} expected)",
                        host.display()
                    ),
                )
                .fix(format!("{make} (or nvidia-smi as root) creates it")),
            );
        }
    };
    let rdev = meta.rdev();
    let found = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    if !meta.file_type().is_char_device() || found != (node.major, node.minor) {
        let is = match meta.file_type().is_char_device() {
            true => format!("char {}:{}", found.0, found.1),
            false => "not a character device".to_string(),
        };
        return Some(
            Finding::problem(
                CHECK,
                format!(
                    "device nodes: {} is {is}, the inventory says {wanted}",
                    host.display()
                ),
            )
            .fix(format!(
                "remove it and run {make}; or, if the inventory is wrong, correct it"
            )),
        );
    }
    None
}

/// `/dev/nvidia0` under the configured /dev root.
fn host_path(setup: &Setup, path: &str) -> PathBuf {
    let relative = path
        .strip_prefix("/dev/")
        .unwrap_or(path.trim_start_matches('/'));
    setup.dev.join(relative)
}
