//! The chosen GPUs' entries of the CDI specs, and what they add to a container: the
//! spec-wide edits of each file that holds one, then each chosen entry's edits. The
//! `all` entry is never applied, and neither is any other GPU's.

use super::cdi::{self, ALL, Device, Found};
use crate::admission::edits::{self, ContainerEdits};
use crate::model::gpu::{DeviceNode, Gpu, Inventory};
use crate::model::mig::MigInstance;
use crate::model::nvidia::VISIBLE_DEVICES;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What the chosen GPUs' CDI entries give a container, ready to merge into gpupin's own
/// edits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct CdiEdits {
    pub nodes: Vec<DeviceNode>,
    pub env: Vec<(String, String)>,
    pub hooks: Vec<edits::Hook>,
    pub mounts: Vec<edits::Mount>,
    pub additional_gids: Vec<u32>,
    /// The spec files the edits came from.
    pub files: Vec<PathBuf>,
    /// The nodes other than `/dev/nvidia<N>` (the DRM nodes `/dev/dri/card<N>`,
    /// `renderD<N>`) of the GPUs not chosen, by their entries in the same specs: the
    /// spec writer takes them out of a spec that came with them (`--device
    /// nvidia.com/gpu=all`), as it does those GPUs' own nodes.
    pub withheld: Vec<DeviceNode>,
}

#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error(
        "no entry for GPU {index} ({uuid}) in CDI spec {files}: neither its UUID nor {node} is there; regenerate the spec (nvidia-ctk cdi generate)",
        node = crate::model::nvidia::gpu_node(*minor)
    )]
    NoEntry {
        index: u32,
        uuid: String,
        minor: u32,
        files: String,
    },
    #[error(
        "CDI spec {path}: entry {name} has {node}, but GPU {index} ({uuid}) is {gpu_node} here; regenerate the spec (nvidia-ctk cdi generate)",
        gpu_node = crate::model::nvidia::gpu_node(*minor)
    )]
    Stale {
        path: PathBuf,
        name: String,
        node: String,
        index: u32,
        uuid: String,
        minor: u32,
    },
    #[error(
        "no entry for MIG instance {address} ({uuid}) in CDI spec {files}: neither its UUID nor {address} is there; regenerate the spec (nvidia-ctk cdi generate)"
    )]
    MigNoEntry {
        address: String,
        uuid: String,
        files: String,
    },
    #[error("CDI specs {first} and {second} both have entry {name} for GPU {uuid}; remove one")]
    Duplicate {
        name: String,
        uuid: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("CDI spec {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("CDI spec {path}: device node {node}: reading {host}")]
    Stat {
        path: PathBuf,
        node: String,
        host: String,
        #[source]
        source: std::io::Error,
    },
}

/// The edits for the GPUs `uuids` from the specs in `found` (none empty). A GPU the
/// inventory does not know is left out, as its node is.
pub(super) fn edits_for(
    found: &[Found],
    inventory: &Inventory,
    uuids: &[String],
) -> Result<CdiEdits, SelectError> {
    let mut chosen: Vec<(&Found, &Device)> = Vec::new();
    for uuid in uuids {
        let entry = match unit_entry(found, inventory, uuid) {
            Some(entry) => entry?,
            None => continue,
        };
        if !chosen
            .iter()
            .any(|(f, d)| f.path == entry.0.path && d.name == entry.1.name)
        {
            chosen.push(entry);
        }
    }
    let mut out = CdiEdits::default();
    // The spec-wide edits once per file that holds a chosen entry, before the entries.
    for (file, _) in &chosen {
        if !out.files.contains(&file.path) {
            out.files.push(file.path.clone());
            add(&mut out, &file.spec.container_edits, &file.path)?;
        }
    }
    for (file, device) in &chosen {
        add(&mut out, &device.container_edits, &file.path)?;
    }
    out.withheld = others_nodes(found, inventory, uuids, &out.nodes);
    Ok(out)
}

/// The fully qualified CDI names (`nvidia.com/gpu=GPU-...`) of the entries of the GPUs
/// `uuids`, found as `edits_for` finds them, in the order of `uuids`: what a kubelet
/// device plugin hands the runtime instead of the edits themselves.
pub(super) fn qualified_names(
    found: &[Found],
    inventory: &Inventory,
    uuids: &[String],
) -> Result<Vec<String>, SelectError> {
    let mut names: Vec<String> = Vec::new();
    for uuid in uuids {
        let (file, device) = match unit_entry(found, inventory, uuid) {
            Some(entry) => entry?,
            None => continue,
        };
        let name = format!("{}={}", file.spec.kind, device.name);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// The non-GPU nodes (DRM) of the entries of the inventory's GPUs not in `uuids`, minus
/// any node the chosen entries have. A GPU without a usable entry adds none: its own
/// `/dev/nvidia<N>` is withheld from the inventory anyway.
fn others_nodes(
    found: &[Found],
    inventory: &Inventory,
    uuids: &[String],
    chosen: &[DeviceNode],
) -> Vec<DeviceNode> {
    let mut withheld: Vec<DeviceNode> = Vec::new();
    for gpu in inventory.gpus.iter().filter(|g| !uuids.contains(&g.uuid)) {
        let Ok((file, device)) = entry_for(found, gpu) else {
            continue;
        };
        for node in &device.container_edits.device_nodes {
            let gpu_node = is_gpu_node(&node.path);
            let Ok(node) = device_node(node, &file.path) else {
                continue;
            };
            let shared = chosen
                .iter()
                .any(|c| c.major == node.major && c.minor == node.minor);
            if !gpu_node && !shared && !withheld.contains(&node) {
                withheld.push(node);
            }
        }
    }
    withheld
}

/// The entry of the GPU or MIG instance `uuid`; `None` when the inventory has neither.
fn unit_entry<'a>(
    found: &'a [Found],
    inventory: &Inventory,
    uuid: &str,
) -> Option<Result<(&'a Found, &'a Device), SelectError>> {
    if let Some(gpu) = inventory.gpus.iter().find(|g| g.uuid == uuid) {
        return Some(entry_for(found, gpu));
    }
    let instance = inventory.mig_instances().find(|m| m.uuid == uuid)?;
    Some(mig_entry_for(found, instance))
}

/// Every entry of the specs found but `all`, with the file it is in.
fn named_entries(found: &[Found]) -> impl Iterator<Item = (&Found, &Device)> {
    found.iter().flat_map(|f| {
        f.spec
            .devices
            .iter()
            .filter(|d| d.name != ALL)
            .map(move |d| (f, d))
    })
}

/// The entry of one MIG instance, as `nvidia-ctk cdi generate` names it: by its UUID,
/// else `<gpu index>:<mig index>`. An entry holding another GPU's node is stale.
fn mig_entry_for<'a>(
    found: &'a [Found],
    instance: &MigInstance,
) -> Result<(&'a Found, &'a Device), SelectError> {
    let address = instance.address();
    let entries = || named_entries(found);
    let by_uuid: Vec<_> = entries()
        .filter(|(_, d)| d.name.eq_ignore_ascii_case(&instance.uuid))
        .collect();
    let candidates = match by_uuid.is_empty() {
        true => entries().filter(|(_, d)| d.name == address).collect(),
        false => by_uuid,
    };
    let no_entry = || SelectError::MigNoEntry {
        address: address.clone(),
        uuid: instance.uuid.clone(),
        files: files(found),
    };
    let best = candidates
        .iter()
        .map(|(f, _)| f.rank)
        .max()
        .ok_or_else(no_entry)?;
    let (file, device) = *candidates
        .iter()
        .find(|(f, _)| f.rank == best)
        .ok_or_else(no_entry)?;
    let node = crate::model::nvidia::gpu_node(instance.parent_minor);
    if let Some(other) = gpu_nodes(device).find(|n| *n != node) {
        return Err(SelectError::Stale {
            path: file.path.clone(),
            name: device.name.clone(),
            node: other.to_string(),
            index: instance.parent_index,
            uuid: instance.uuid.clone(),
            minor: instance.parent_minor,
        });
    }
    Ok((file, device))
}

/// The entry of one GPU: named by its UUID, else the one holding `/dev/nvidia<minor>`
/// (nvidia-ctk's index names follow NVML's index, which need not be the inventory's:
/// the node's minor is what identifies the GPU). A later spec dir wins.
fn entry_for<'a>(found: &'a [Found], gpu: &Gpu) -> Result<(&'a Found, &'a Device), SelectError> {
    let node = crate::model::nvidia::gpu_node(gpu.minor);
    let entries = || named_entries(found);
    let by_uuid: Vec<_> = entries()
        .filter(|(_, d)| d.name.eq_ignore_ascii_case(&gpu.uuid))
        .collect();
    let candidates = if by_uuid.is_empty() {
        // Entries named by another UUID that hold this node say the spec is stale;
        // an index name (`0`) is taken for what its node says.
        entries()
            .filter(|(_, d)| gpu_nodes(d).any(|n| n == node))
            .collect()
    } else {
        by_uuid
    };
    let Some(best) = candidates.iter().map(|(f, _)| f.rank).max() else {
        return Err(SelectError::NoEntry {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            minor: gpu.minor,
            files: files(found),
        });
    };
    let top: Vec<_> = candidates
        .into_iter()
        .filter(|(f, _)| f.rank == best)
        .collect();
    let (file, device) = top[0];
    if let Some((other, _)) = top.iter().find(|(f, _)| f.path != file.path) {
        return Err(SelectError::Duplicate {
            name: device.name.clone(),
            uuid: gpu.uuid.clone(),
            first: file.path.clone(),
            second: other.path.clone(),
        });
    }
    let stale = |name: &str, node: String| SelectError::Stale {
        path: file.path.clone(),
        name: name.to_string(),
        node,
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        minor: gpu.minor,
    };
    if let Some(other) = gpu_nodes(device).find(|n| *n != node) {
        return Err(stale(&device.name, other.to_string()));
    }
    let other_uuid = |d: &Device| is_uuid_name(&d.name) && !d.name.eq_ignore_ascii_case(&gpu.uuid);
    if let Some((_, named)) = top.iter().find(|(_, d)| other_uuid(d)) {
        return Err(stale(&named.name, node));
    }
    Ok((file, device))
}

/// The `/dev/nvidia<N>` GPU nodes of an entry (not its DRM or control nodes).
fn gpu_nodes(device: &Device) -> impl Iterator<Item = &str> {
    device
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .filter(|p| is_gpu_node(p))
}

/// `/dev/nvidia<N>`: a GPU's own node, not a control or DRM node.
fn is_gpu_node(path: &str) -> bool {
    path.strip_prefix("/dev/nvidia")
        .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
}

fn is_uuid_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("GPU-") || upper.starts_with("MIG-")
}

fn files(found: &[Found]) -> String {
    let names: Vec<String> = found.iter().map(|f| f.path.display().to_string()).collect();
    names.join(", ")
}

/// Adds one `containerEdits` to `out`, checked: paths absolute, nodes under /dev and
/// character devices, env entries `KEY=VALUE`, hooks at a stage OCI knows.
fn add(out: &mut CdiEdits, from: &cdi::Edits, path: &Path) -> Result<(), SelectError> {
    let invalid = |reason: String| SelectError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    for entry in &from.env {
        match entry.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                out.env.retain(|(k, _)| k != key);
                out.env.push((key.to_string(), value.to_string()));
            }
            _ => return Err(invalid(format!("env entry {entry:?} is not KEY=VALUE"))),
        }
    }
    for node in &from.device_nodes {
        let node = device_node(node, path)?;
        out.nodes.retain(|n| n.path != node.path);
        out.nodes.push(node);
    }
    for hook in &from.hooks {
        let hook = oci_hook(hook).map_err(invalid)?;
        let same =
            |h: &edits::Hook| h.stage == hook.stage && h.path == hook.path && h.args == hook.args;
        if !out.hooks.iter().any(same) {
            out.hooks.push(hook);
        }
    }
    for mount in &from.mounts {
        for p in [&mount.host_path, &mount.container_path] {
            if !p.starts_with('/') {
                return Err(invalid(format!("mount path {p:?} is not absolute")));
            }
        }
        out.mounts.retain(|m| m.destination != mount.container_path);
        out.mounts.push(edits::Mount {
            destination: mount.container_path.clone(),
            source: mount.host_path.clone(),
            kind: mount.kind.clone(),
            options: mount.options.clone(),
        });
    }
    for gid in &from.additional_gids {
        if !out.additional_gids.contains(gid) {
            out.additional_gids.push(*gid);
        }
    }
    Ok(())
}

/// A hook at its OCI stage; the CDI spec allows the six OCI names.
fn oci_hook(hook: &cdi::Hook) -> Result<edits::Hook, String> {
    const STAGES: [&str; 6] = [
        "prestart",
        "createRuntime",
        "createContainer",
        "startContainer",
        "poststart",
        "poststop",
    ];
    let stage = STAGES
        .into_iter()
        .find(|s| *s == hook.hook_name)
        .ok_or_else(|| {
            format!(
                "hook {:?}: unknown hookName {:?}",
                hook.path, hook.hook_name
            )
        })?;
    if !hook.path.starts_with('/') {
        return Err(format!("hook path {:?} is not absolute", hook.path));
    }
    let timeout = match hook.timeout {
        None => None,
        Some(t) => Some(u32::try_from(t).ok().filter(|t| *t > 0).ok_or_else(|| {
            format!(
                "hook {:?}: timeout {t} is not a positive number of seconds",
                hook.path
            )
        })?),
    };
    Ok(edits::Hook {
        stage,
        path: hook.path.clone(),
        args: hook.args.clone(),
        env: hook.env.clone(),
        timeout,
    })
}

/// A node with its numbers: the entry's, else the host node's (`hostPath`, else `path`),
/// which must be a character device.
fn device_node(node: &cdi::Node, path: &Path) -> Result<DeviceNode, SelectError> {
    let invalid = |reason: String| SelectError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if !node.path.starts_with("/dev/") {
        return Err(invalid(format!(
            "device node {:?} is not under /dev",
            node.path
        )));
    }
    if node.kind.as_deref().is_some_and(|k| k != "c") {
        return Err(invalid(format!(
            "device node {}: type {:?}, expected \"c\" (a character device)",
            node.path,
            node.kind.as_deref().unwrap_or_default()
        )));
    }
    let number = |n: Option<i64>, what: &str| -> Result<Option<u32>, SelectError> {
        n.map(|v| {
            u32::try_from(v).map_err(|_| {
                invalid(format!(
                    "device node {}: {what} {v} is out of range",
                    node.path
                ))
            })
        })
        .transpose()
    };
    let (major, minor) = (number(node.major, "major")?, number(node.minor, "minor")?);
    // nvidia-ctk leaves out a minor of 0 (Go's omitempty): with a major given, an absent
    // minor is 0, as the CDI reference reads it.
    let (major, minor) = match (major, minor) {
        (Some(major), minor) => (major, minor.unwrap_or(0)),
        (None, minor) => {
            let (m, n) = stat_char_device(node, path)?;
            (m, minor.unwrap_or(n))
        }
    };
    Ok(DeviceNode {
        path: node.path.clone(),
        major,
        minor,
    })
}

fn stat_char_device(node: &cdi::Node, path: &Path) -> Result<(u32, u32), SelectError> {
    let host = node.host_path.clone().unwrap_or_else(|| node.path.clone());
    let stat_err = |source| SelectError::Stat {
        path: path.to_path_buf(),
        node: node.path.clone(),
        host: host.clone(),
        source,
    };
    let meta = std::fs::metadata(&host).map_err(stat_err)?;
    if !meta.file_type().is_char_device() {
        return Err(stat_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a character device",
        )));
    }
    let rdev = meta.rdev();
    Ok((rustix::fs::major(rdev), rustix::fs::minor(rdev)))
}

impl CdiEdits {
    /// Merges into gpupin's own edits: a CDI node replaces gpupin's at its path (its
    /// numbers are the driver's), env and mounts are added, and NVIDIA_VISIBLE_DEVICES
    /// becomes the spec's value (`void`: the devices are in the spec already; a list
    /// there would make NVIDIA's runtime add them again). `void` when the spec sets none.
    pub(super) fn merge_into(self, edits: &mut ContainerEdits) {
        for node in self.nodes {
            edits.nodes.retain(|n| n.path != node.path);
            edits.nodes.push(node);
        }
        edits.env.retain(|(k, _)| k != VISIBLE_DEVICES);
        for (key, value) in self.env {
            edits.env.retain(|(k, _)| *k != key);
            edits.env.push((key, value));
        }
        if !edits.env.iter().any(|(k, _)| k == VISIBLE_DEVICES) {
            edits
                .env
                .push((VISIBLE_DEVICES.to_string(), "void".to_string()));
        }
        edits.hooks.extend(self.hooks);
        for mount in self.mounts {
            edits.mounts.retain(|m| m.destination != mount.destination);
            edits.mounts.push(mount);
        }
        for gid in self.additional_gids {
            if !edits.additional_gids.contains(&gid) {
                edits.additional_gids.push(gid);
            }
        }
        for node in self.withheld {
            if !edits.withheld.contains(&node) {
                edits.withheld.push(node);
            }
        }
        edits.driver_from_cdi = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;
    use serde_json::json;

    /// A spec as nvidia-ctk writes it for `gpus` (index, uuid, minor): entries by index
    /// and by UUID, an `all` entry, and common edits.
    fn spec_text(gpus: &[(u32, &str, u32)]) -> String {
        let mut text = String::from("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n");
        let entry = |name: &str, minor: u32| {
            format!(
                "  - name: \"{name}\"\n    containerEdits:\n      deviceNodes:\n        - {{path: /dev/nvidia{minor}, major: 195, minor: {minor}}}\n      hooks:\n        - {{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, create-symlinks, --link, \"card{minor}\"]}}\n"
            )
        };
        for (index, uuid, minor) in gpus {
            text += &entry(&index.to_string(), *minor);
            text += &entry(uuid, *minor);
        }
        text += "  - name: all\n    containerEdits:\n      deviceNodes:\n";
        for (_, _, minor) in gpus {
            text +=
                &format!("        - {{path: /dev/nvidia{minor}, major: 195, minor: {minor}}}\n");
        }
        text += "containerEdits:\n  additionalGids: [44]\n  env: [NVIDIA_VISIBLE_DEVICES=void, NVIDIA_CTK_LIBCUDA_DIR=/usr/lib]\n  deviceNodes:\n    - {path: /dev/nvidiactl, major: 195, minor: 255}\n    - {path: /dev/nvidia-uvm, major: 508}\n  hooks:\n    - {hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib]}\n  mounts:\n    - {hostPath: /drv/usr/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1, options: [ro, nosuid, nodev, rbind, rprivate]}\n";
        text
    }

    fn found(path: &str, rank: usize, text: &str) -> Found {
        Found {
            path: PathBuf::from(path),
            rank,
            spec: serde_norway::from_str(text).unwrap(),
        }
    }

    fn four() -> Vec<(u32, &'static str, u32)> {
        vec![
            (0, "GPU-test-0", 0),
            (1, "GPU-test-1", 1),
            (2, "GPU-test-2", 2),
            (3, "GPU-test-3", 3),
        ]
    }

    fn uuids(list: &[&str]) -> Vec<String> {
        list.iter().map(|u| u.to_string()).collect()
    }

    fn node_paths(e: &CdiEdits) -> Vec<&str> {
        e.nodes.iter().map(|n| n.path.as_str()).collect()
    }

    #[test]
    fn the_chosen_gpus_entries_and_the_common_edits_only() {
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &spec_text(&four()))];
        let e = edits_for(&specs, &machine(4), &uuids(&["GPU-test-2"])).unwrap();
        assert_eq!(
            node_paths(&e),
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia2"]
        );
        assert_eq!(
            (e.nodes[1].major, e.nodes[1].minor),
            (508, 0),
            "minor 0 left out"
        );
        let hooks: Vec<&str> = e.hooks.iter().map(|h| h.args[1].as_str()).collect();
        assert_eq!(hooks, ["update-ldcache", "create-symlinks"]);
        assert_eq!(e.hooks[1].args[3], "card2");
        assert!(e.hooks.iter().all(|h| h.stage == "createContainer"));
        assert_eq!(e.mounts[0].destination, "/usr/lib/libcuda.so.1");
        assert_eq!(e.mounts[0].source, "/drv/usr/lib/libcuda.so.1");
        assert_eq!(e.files, [PathBuf::from("/etc/cdi/nvidia.yaml")]);
    }

    #[test]
    fn the_other_gpus_drm_nodes_are_withheld_and_taken_out_of_a_spec_that_has_them() {
        // Each entry with its DRM card node, as nvidia-ctk writes them (226:<minor+1>).
        let mut text = spec_text(&four());
        for minor in 0..4 {
            let gpu_node = format!(
                "        - {{path: /dev/nvidia{minor}, major: 195, minor: {minor}}}\n      hooks:"
            );
            let with_card = format!(
                "        - {{path: /dev/nvidia{minor}, major: 195, minor: {minor}}}\n        - {{path: /dev/dri/card{c}, major: 226, minor: {c}}}\n      hooks:",
                c = minor + 1
            );
            text = text.replace(&gpu_node, &with_card);
        }
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &text)];
        let e = edits_for(&specs, &machine(4), &uuids(&["GPU-test-2"])).unwrap();
        assert!(node_paths(&e).contains(&"/dev/dri/card3"), "{e:?}");
        let withheld: Vec<&str> = e.withheld.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            withheld,
            ["/dev/dri/card1", "/dev/dri/card2", "/dev/dri/card4"]
        );
        // A spec that came with every GPU (`--device nvidia.com/gpu=all`): the other
        // GPUs' card nodes and their rules go, the chosen one's stays.
        let node = |minor: u32| json!({"path": format!("/dev/dri/card{minor}"), "type": "c", "major": 226, "minor": minor});
        let rule = |minor: u32| json!({"allow": true, "type": "c", "major": 226, "minor": minor, "access": "rwm"});
        let mut spec = json!({"linux": {
            "devices": (1..5).map(node).collect::<Vec<_>>(),
            "resources": {"devices": (1..5).map(rule).collect::<Vec<_>>()},
        }});
        let mut edits = ContainerEdits::default();
        e.merge_into(&mut edits);
        crate::admission::edits::spec::apply(&edits, &mut spec).unwrap();
        let paths: Vec<&str> = spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["path"].as_str())
            .filter(|p| p.starts_with("/dev/dri/"))
            .collect();
        assert_eq!(paths, ["/dev/dri/card3"]);
        let minors: Vec<i64> = spec["linux"]["resources"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["major"] == 226)
            .filter_map(|r| r["minor"].as_i64())
            .collect();
        assert_eq!(minors, [3]);
    }

    #[test]
    fn by_node_when_no_entry_has_the_uuid_whatever_the_index_names_say() {
        // nvidia-ctk's index is NVML's: here entry "0" is the GPU at minor 3.
        let text = spec_text(&[(0, "GPU-elsewhere-3", 3), (3, "GPU-elsewhere-0", 0)])
            .replace("GPU-elsewhere-3", "x3")
            .replace("GPU-elsewhere-0", "x0");
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &text)];
        let e = edits_for(&specs, &machine(4), &uuids(&["GPU-test-3"])).unwrap();
        assert!(node_paths(&e).contains(&"/dev/nvidia3"), "{e:?}");
        assert!(!node_paths(&e).contains(&"/dev/nvidia0"), "{e:?}");
    }

    /// nvidia-ctk's MIG entries: `<gpu>:<mig>` and the MIG UUID, each with the GPU's node
    /// and the instance's two capability nodes.
    #[test]
    fn a_mig_instance_gets_its_entry_by_uuid_or_address() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let instance = inv.find_mig("0:2").unwrap();
        let gpus: Vec<(u32, String, u32)> = inv
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.clone(), g.minor))
            .collect();
        let refs: Vec<(u32, &str, u32)> =
            gpus.iter().map(|(i, u, m)| (*i, u.as_str(), *m)).collect();
        let mig_entry = |name: &str| {
            format!(
                "  - name: \"{name}\"\n    containerEdits:\n      deviceNodes:\n        - {{path: /dev/nvidia0, major: 195, minor: 0}}\n        - {{path: /dev/nvidia-caps/nvidia-cap84, major: 237, minor: 84}}\n        - {{path: /dev/nvidia-caps/nvidia-cap85, major: 237, minor: 85}}\n"
            )
        };
        let base = spec_text(&refs);
        let (head, tail) = base.split_at(base.find("  - name: all").unwrap());
        for name in ["0:2", instance.uuid.as_str()] {
            let text = format!("{head}{}{tail}", mig_entry(name));
            let specs = [found("/etc/cdi/nvidia.yaml", 0, &text)];
            let e = edits_for(&specs, &inv, &uuids(&[instance.uuid.as_str()])).unwrap();
            assert_eq!(
                node_paths(&e),
                [
                    "/dev/nvidiactl",
                    "/dev/nvidia-uvm",
                    "/dev/nvidia0",
                    "/dev/nvidia-caps/nvidia-cap84",
                    "/dev/nvidia-caps/nvidia-cap85"
                ],
                "{name}"
            );
            let names = qualified_names(&specs, &inv, &uuids(&[instance.uuid.as_str()])).unwrap();
            assert_eq!(names, [format!("nvidia.com/gpu={name}")]);
        }
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &base)];
        let err = edits_for(&specs, &inv, &uuids(&[instance.uuid.as_str()]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("no entry for MIG instance 0:2 (MIG-")
                && err.ends_with("regenerate the spec (nvidia-ctk cdi generate)"),
            "{err}"
        );
    }

    #[test]
    fn all_is_never_applied() {
        // Entries for GPUs 0 and 2; only `all` holds GPU 1.
        let all = "  - name: all\n    containerEdits:\n      deviceNodes:\n";
        let text = spec_text(&[(0, "GPU-test-0", 0), (2, "GPU-test-2", 2)]).replace(
            all,
            &format!("{all}        - {{path: /dev/nvidia1, major: 195, minor: 1}}\n"),
        );
        assert!(text.contains("/dev/nvidia1"));
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &text)];
        let err = edits_for(&specs, &machine(4), &uuids(&["GPU-test-1"])).unwrap_err();
        assert_eq!(
            crate::base::message::one_line(&err),
            "no entry for GPU 1 (GPU-test-1) in CDI spec /etc/cdi/nvidia.yaml: neither its UUID nor /dev/nvidia1 is there; regenerate the spec (nvidia-ctk cdi generate)"
        );
    }

    #[test]
    fn a_later_dir_wins_and_equal_ranks_conflict() {
        let old = spec_text(&four()).replace("card2", "old-card2");
        let specs = [
            found("/etc/cdi/nvidia.yaml", 0, &old),
            found("/var/run/cdi/nvidia.yaml", 1, &spec_text(&four())),
        ];
        let e = edits_for(&specs, &machine(4), &uuids(&["GPU-test-2"])).unwrap();
        assert_eq!(e.hooks[1].args[3], "card2");
        assert_eq!(e.files, [PathBuf::from("/var/run/cdi/nvidia.yaml")]);
        let same_rank = [
            found("/etc/cdi/a.yaml", 0, &old),
            found("/etc/cdi/b.yaml", 0, &spec_text(&four())),
        ];
        let err = edits_for(&same_rank, &machine(4), &uuids(&["GPU-test-2"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CDI specs /etc/cdi/a.yaml and /etc/cdi/b.yaml both have entry GPU-test-2 for GPU GPU-test-2; remove one"
        );
    }

    #[test]
    fn a_uuid_entry_at_another_node_is_stale() {
        let text = spec_text(&[(0, "GPU-test-0", 5)]);
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &text)];
        let err = edits_for(&specs, &machine(4), &uuids(&["GPU-test-0"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CDI spec /etc/cdi/nvidia.yaml: entry GPU-test-0 has /dev/nvidia5, but GPU 0 (GPU-test-0) is /dev/nvidia0 here; regenerate the spec (nvidia-ctk cdi generate)"
        );
        // Another GPU's UUID at this GPU's node: the spec is of another boot or machine.
        let moved = spec_text(&[(0, "GPU-other", 0)]);
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &moved)];
        let err = edits_for(&specs, &machine(4), &uuids(&["GPU-test-0"])).unwrap_err();
        assert!(
            err.to_string().contains("entry GPU-other has /dev/nvidia0"),
            "{err}"
        );
    }

    #[test]
    fn bad_entries_are_one_line_refusals_naming_the_file() {
        let base = spec_text(&four());
        for (from, to, expected) in [
            (
                "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib",
                "JUSTAKEY",
                "env entry \"JUSTAKEY\" is not KEY=VALUE",
            ),
            (
                "path: /dev/nvidiactl",
                "path: /etc/passwd",
                "device node \"/etc/passwd\" is not under /dev",
            ),
            (
                "hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update",
                "hookName: beforeAll, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update",
                "unknown hookName \"beforeAll\"",
            ),
            (
                "containerPath: /usr/lib/libcuda.so.1",
                "containerPath: usr/lib/libcuda.so.1",
                "mount path \"usr/lib/libcuda.so.1\" is not absolute",
            ),
            (
                "{path: /dev/nvidiactl, major: 195",
                "{path: /dev/nvidiactl, type: b, major: 195",
                "type \"b\", expected \"c\"",
            ),
        ] {
            let specs = [found(
                "/etc/cdi/nvidia.yaml",
                0,
                &base.replacen(from, to, 1),
            )];
            let err = edits_for(&specs, &machine(4), &uuids(&["GPU-test-0"])).unwrap_err();
            let line = crate::base::message::one_line(&err);
            assert!(
                line.starts_with("CDI spec /etc/cdi/nvidia.yaml: ") && line.contains(expected),
                "{line}"
            );
        }
    }

    #[test]
    fn missing_numbers_come_from_the_host_node() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("nvidia-uvm");
        let made = rustix::fs::mknodat(
            rustix::fs::CWD,
            &node,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            rustix::fs::makedev(511, 7),
        );
        if made.is_err() {
            // mknod of a character device needs root (CAP_MKNOD).
            return;
        }
        let file = dir.path().join("not-a-node");
        std::fs::write(&file, "").unwrap();
        let text = |host: &Path| {
            spec_text(&four()).replace(
                "{path: /dev/nvidia-uvm, major: 508}",
                &format!("{{path: /dev/nvidia-uvm, hostPath: {}}}", host.display()),
            )
        };
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &text(&node))];
        let e = edits_for(&specs, &machine(4), &uuids(&["GPU-test-0"])).unwrap();
        let uvm = e
            .nodes
            .iter()
            .find(|n| n.path == "/dev/nvidia-uvm")
            .unwrap();
        assert_eq!((uvm.major, uvm.minor), (511, 7));
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &text(&file))];
        let err = edits_for(&specs, &machine(4), &uuids(&["GPU-test-0"])).unwrap_err();
        let line = crate::base::message::one_line(&err);
        assert!(
            line.contains("device node /dev/nvidia-uvm: reading ")
                && line.ends_with("not a character device"),
            "{line}"
        );
    }

    #[test]
    fn merged_edits_say_void_and_apply_once() {
        let inv = machine(4);
        let specs = [found("/etc/cdi/nvidia.yaml", 0, &spec_text(&four()))];
        let gpus = uuids(&["GPU-test-1", "GPU-test-3"]);
        let mut edits = ContainerEdits {
            nodes: inv.nodes_for(&gpus),
            env: vec![(VISIBLE_DEVICES.into(), "GPU-test-1,GPU-test-3".into())],
            ..ContainerEdits::default()
        };
        edits_for(&specs, &inv, &gpus)
            .unwrap()
            .merge_into(&mut edits);
        let mut spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "A=1", "NVIDIA_VISIBLE_DEVICES=0"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]});
        crate::admission::edits::spec::apply(&edits, &mut spec).unwrap();
        let once = spec.clone();
        crate::admission::edits::spec::apply(&edits, &mut spec).unwrap();
        assert_eq!(spec, once, "applying twice changes nothing");
        assert_eq!(
            spec["process"]["env"],
            json!([
                "NVIDIA_VISIBLE_DEVICES=void",
                "A=1",
                "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib"
            ])
        );
        let paths: Vec<&str> = spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia1",
                "/dev/nvidia3"
            ]
        );
        let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules.len(), 4, "{rules:?}");
        assert_eq!(
            spec["hooks"]["createContainer"].as_array().unwrap().len(),
            3
        );
        assert_eq!(spec["mounts"][1]["destination"], "/usr/lib/libcuda.so.1");
        assert_eq!(spec["process"]["user"]["additionalGids"], json!([44]));
    }
}
