//! NVIDIA GPUs that reach a container around gpupin: device nodes CDI or `--device` put
//! into the spec (podman `--device nvidia.com/gpu=0,1`, Docker's `--gpus N` resolved as
//! CDI devices 0..N-1, containerd's CRI), their device-cgroup rules, `cdi.k8s.io/*`
//! annotations that ask NVIDIA's runtime for `nvidia.com/gpu=...`, its volume-mount
//! requests (`/dev/null` on `/var/run/nvidia-container-devices/<dev>`), and every
//! `NVIDIA_VISIBLE_DEVICES` of the process env.
//!
//! Two jobs, both pure functions on the spec held as a `Value`:
//! - a container without a gpupin request: what NVIDIA's stack was asked for becomes
//!   gpupin's request (`request`), or is voided (`void`) or left (`Unrequested`);
//! - a container with GPUs from gpupin: every trace of the other GPUs is taken out of its
//!   spec after gpupin's own edits (`strip`), so that nothing sits beside gpupin's choice;
//!   at prestart, where runc has made the nodes already, one is refused (`strip_created`).
//!
//! `drop_runtime_hooks` is for the CDI path, where NVIDIA's legacy hook must not run.
//!
//! Control nodes (nvidiactl 195:255, nvidia-modeset 195:254, nvidia-uvm) stay: every CUDA
//! process needs them and they give no GPU. Non-NVIDIA devices are never touched.

use crate::input::config::Unrequested;
use crate::input::request::{ANNOTATION_PREFIX, ENV_PREFIX, GpuRequest, Origin, Selection};
use crate::model::gpu::{DeviceNode, Inventory};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

use crate::model::nvidia::{CDI_ANNOTATION_PREFIX, CDI_GPU_PREFIX};
use crate::model::nvidia::{CUDA_VERSION, VISIBLE_DEVICES};
/// NVIDIA's runtime reads a bind of `/dev/null` under this folder as a device request
/// (`accept-nvidia-visible-devices-as-volume-mounts`); the rest of the path names it.
const VOLUME_MOUNT_PREFIX: &str = "/var/run/nvidia-container-devices/";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForeignError {
    /// A rule such as Docker's `--privileged` (`a *:* rwm`) or `--device-cgroup-rule
    /// 'c 195:* rw'`: removing it could break the container, keeping it gives it every GPU.
    #[error(
        "linux.resources.devices[{index}] ({rule}) would give the container GPUs gpupin did not choose; gpupin cannot pin a container with such a rule (--privileged, --device-cgroup-rule): remove it"
    )]
    WildcardRule { index: usize, rule: String },
    /// The prestart path: runc has made the node already, and a hook cannot unmake it.
    #[error(
        "the container already has GPU node {path:?} ({major}:{minor}), which gpupin did not choose, and the prestart hook cannot take it out again; drop the --device or CDI device, or let gpupin edit the spec before create (gpupin-runtime, podman's precreate hook)"
    )]
    Created {
        path: String,
        major: u32,
        minor: u32,
    },
    #[error(
        "linux.resources.devices[{index}] ({rule}) gave the container a GPU gpupin did not choose, and the prestart hook cannot take it back; drop the rule, or let gpupin edit the spec before create (gpupin-runtime, podman's precreate hook)"
    )]
    CreatedRule { index: usize, rule: String },
}

/// Whether anything in `spec` has to do with GPUs, read without a config or an inventory:
/// a `gpupin.*` or `cdi.k8s.io/*` annotation, an env entry of NVIDIA's (`NVIDIA_*`,
/// `CUDA_VERSION`) or gpupin's (`GPUPIN_*`), a device node that could be an NVIDIA one
/// (`/dev/nvidia*`, `/dev/dri/*`, or the usual GPU major 195), a volume-mount request of
/// NVIDIA's runtime, or NVIDIA's prestart hook. Only a spec with none of them may start
/// when gpupin's config does not load (`gpupin-runtime`): whatever else could hand out
/// a GPU around the ledger.
pub(crate) fn mentions_gpus(spec: &Value) -> bool {
    /// The major NVIDIA's driver registers; the inventory's number is not known here.
    const USUAL_GPU_MAJOR: i64 = 195;
    let annotation = annotations(spec).is_some_and(|map| {
        map.keys()
            .any(|k| k.starts_with(ANNOTATION_PREFIX) || k.starts_with(CDI_ANNOTATION_PREFIX))
    });
    let env = crate::admission::spec::process_env(spec).iter().any(|e| {
        e.starts_with("NVIDIA_") || e.starts_with(ENV_PREFIX) || e.starts_with("CUDA_VERSION=")
    });
    let node = devices(spec).iter().any(|d| {
        let path = d.get("path").and_then(Value::as_str).unwrap_or_default();
        path.starts_with("/dev/nvidia")
            || path.starts_with("/dev/dri/")
            || (is_char_node(d) && number(d.get("major")) == Some(USUAL_GPU_MAJOR))
    });
    let rule = spec
        .pointer("/linux/resources/devices")
        .and_then(Value::as_array)
        .is_some_and(|rules| {
            rules
                .iter()
                .any(|r| allows(r) && number(r.get("major")) == Some(USUAL_GPU_MAJOR))
        });
    let volume = mounts(spec).iter().any(|m| volume_request(m).is_some());
    let hook = spec
        .pointer("/hooks/prestart")
        .and_then(Value::as_array)
        .is_some_and(|hooks| hooks.iter().any(is_runtime_hook));
    annotation || env || node || rule || volume || hook
}

/// Which device numbers are the machine's GPUs: the GPU major and each GPU's minor (never
/// the control nodes' 254 and 255).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuNumbers {
    pub major: u32,
    pub minors: BTreeSet<u32>,
}

impl GpuNumbers {
    pub(crate) fn of(inventory: &Inventory) -> GpuNumbers {
        GpuNumbers {
            major: inventory.gpu_major,
            minors: inventory.gpus.iter().map(|g| g.minor).collect(),
        }
    }
}

/// Whether `spec` has any character device node: only then can it hold a GPU node, and
/// only then is the inventory worth loading to tell.
pub(crate) fn has_char_devices(spec: &Value) -> bool {
    devices(spec).iter().any(is_char_node)
}

/// The minors of the GPU nodes in `linux.devices`, whatever their path in the container.
pub(crate) fn gpu_minors(spec: &Value, gpus: &GpuNumbers) -> BTreeSet<u32> {
    devices(spec)
        .iter()
        .filter(|d| is_char_node(d))
        .filter_map(|d| Some((number(d.get("major"))?, number(d.get("minor"))?)))
        .filter(|(major, minor)| *major == i64::from(gpus.major) && is_gpu_minor(gpus, *minor))
        .map(|(_, minor)| minor as u32)
        .collect()
}

/// Whether a rule of `spec` lets the container open every GPU whatever its nodes: Docker's
/// `--privileged` (`a *:* rwm`, and every host node in `linux.devices`), or a wildcard
/// on the GPU major. Such a container sees every GPU; gpupin can neither record nor limit
/// that, so its GPU nodes make no request (and a request beside it is refused, `strip`).
pub(crate) fn admits_every_gpu(spec: &Value, gpus: &GpuNumbers) -> bool {
    let every: Vec<DeviceNode> = gpus
        .minors
        .iter()
        .map(|minor| DeviceNode {
            path: crate::model::nvidia::gpu_node(*minor),
            major: gpus.major,
            minor: *minor,
        })
        .collect();
    let admits = refuse_wildcards(spec, &every).is_err();
    if admits {
        tracing::warn!(
            "a device rule admits every GPU (--privileged?): gpupin neither records nor limits this container's GPUs"
        );
    }
    admits
}

/// The request of a container that asks gpupin for nothing. GPU nodes in the spec ask for
/// as many GPUs, whatever `unrequested` says, unless a rule admits every GPU anyway
/// (`admits_every_gpu`); failing those, NVIDIA's request in the
/// order its runtime reads it (annotations, volume mounts, the env's last
/// `NVIDIA_VISIBLE_DEVICES`) becomes a request under `Unrequested::Request`. `machine` is
/// called only when the spec has a character device node to look at.
pub(crate) fn request<E>(
    spec: &Value,
    unrequested: Unrequested,
    machine: impl FnOnce() -> Result<GpuNumbers, E>,
) -> Result<Option<GpuRequest>, E> {
    if has_char_devices(spec) {
        let gpus = machine()?;
        let count = match admits_every_gpu(spec, &gpus) {
            true => 0,
            false => gpu_minors(spec, &gpus).len(),
        };
        if count > 0 {
            let count = u32::try_from(count).expect("fewer GPUs than u32::MAX");
            tracing::info!(
                count,
                "GPU nodes came with the spec (CDI, --device): a request for as many GPUs, which gpupin picks"
            );
            return Ok(Some(GpuRequest::new(
                Selection::Count(count),
                Origin::Nvidia,
            )));
        }
    }
    if unrequested != Unrequested::Request {
        return Ok(None);
    }
    let asked = nvidia_request(spec).map(|names| wanted(&names));
    Ok(match asked {
        Some(Wanted::All) => Some(GpuRequest::new(Selection::All, Origin::Nvidia)),
        Some(Wanted::Count(n)) if n > 0 => {
            Some(GpuRequest::new(Selection::Count(n), Origin::Nvidia))
        }
        _ => None,
    })
}

/// `Unrequested::Strip` for a container that asks gpupin for nothing: NVIDIA's
/// annotations and volume-mount requests go, and `NVIDIA_VISIBLE_DEVICES` becomes one
/// `void` when any occurrence asked for a GPU (or, absent, when NVIDIA's runtime would
/// give a legacy CUDA image every GPU). Returns whether the spec changed; a spec
/// that asks NVIDIA's stack for nothing is left byte for byte.
pub(crate) fn void(spec: &mut Value) -> bool {
    let mut changed = drop_cdi_annotations(spec);
    changed |= drop_volume_requests(spec);
    let asks = legacy_all(spec)
        || env_values(spec)
            .iter()
            .any(|v| wanted(&names(v)) != Wanted::Count(0));
    if asks {
        set_single_env(spec, "void");
        changed = true;
    }
    changed
}

/// Takes every GPU of `withheld` (the machine's GPU nodes the container was not given)
/// out of `spec`: their nodes in `linux.devices` and their allow rules, whatever their
/// path; then NVIDIA's annotations and volume-mount requests, which would make NVIDIA's
/// runtime add GPUs again. A rule that would still admit a withheld GPU without naming
/// it (a type `a` rule, or the GPU major with any minor) is refused: nothing is changed
/// then. Idempotent.
pub(crate) fn strip(spec: &mut Value, withheld: &[DeviceNode]) -> Result<(), ForeignError> {
    refuse_wildcards(spec, withheld)?;
    let is_withheld = |major: i64, minor: i64| {
        withheld
            .iter()
            .any(|n| i64::from(n.major) == major && i64::from(n.minor) == minor)
    };
    if let Some(list) = spec
        .pointer_mut("/linux/devices")
        .and_then(Value::as_array_mut)
    {
        list.retain(|d| {
            !(is_char_node(d)
                && matches!(
                    (number(d.get("major")), number(d.get("minor"))),
                    (Some(major), Some(minor)) if is_withheld(major, minor)
                ))
        });
    }
    if let Some(rules) = spec
        .pointer_mut("/linux/resources/devices")
        .and_then(Value::as_array_mut)
    {
        rules.retain(|r| {
            !(allows(r)
                && r.get("type").and_then(Value::as_str) == Some("c")
                && matches!(
                    (number(r.get("major")), number(r.get("minor"))),
                    (Some(major), Some(minor)) if is_withheld(major, minor)
                ))
        });
    }
    drop_cdi_annotations(spec);
    drop_volume_requests(spec);
    Ok(())
}

/// `strip` for a container the runtime has created already (the prestart path): its
/// nodes and cgroup are made, so a withheld GPU among them (or a rule that admits one) is
/// refused rather than taken out. NVIDIA's annotations and volume-mount requests still go
/// from the bundle's spec, which NVIDIA's hook reads after gpupin's.
pub(crate) fn strip_created(spec: &mut Value, withheld: &[DeviceNode]) -> Result<(), ForeignError> {
    refuse_wildcards(spec, withheld)?;
    let withheld_node = |major: Option<i64>, minor: Option<i64>| {
        withheld
            .iter()
            .find(|n| major == Some(i64::from(n.major)) && minor == Some(i64::from(n.minor)))
    };
    let nodes = devices(spec).iter().filter(|d| is_char_node(d));
    for device in nodes {
        if let Some(node) = withheld_node(number(device.get("major")), number(device.get("minor")))
        {
            let path = device.get("path").and_then(Value::as_str).unwrap_or("");
            return Err(ForeignError::Created {
                path: path.to_string(),
                major: node.major,
                minor: node.minor,
            });
        }
    }
    let rules = spec
        .pointer("/linux/resources/devices")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (index, rule) in rules.iter().enumerate() {
        let (major, minor) = (number(rule.get("major")), number(rule.get("minor")));
        let is_char = rule.get("type").and_then(Value::as_str) == Some("c");
        let opens = allows(rule) && grants_access(rule);
        if opens && is_char && withheld_node(major, minor).is_some() {
            return Err(ForeignError::CreatedRule {
                index,
                rule: describe("c", major, minor, rule),
            });
        }
    }
    drop_cdi_annotations(spec);
    drop_volume_requests(spec);
    Ok(())
}

/// Removes every prestart hook that runs NVIDIA's legacy hook (`nvidia-container-runtime-hook`,
/// by program name or first argument), as NVIDIA's runtime does in its cdi mode
/// (`nvidia-hook-remover`): for a spec whose GPUs are given through CDI, where the hook
/// would inject them a second time. Returns whether one was there.
pub(crate) fn drop_runtime_hooks(spec: &mut Value) -> bool {
    let Some(hooks) = spec
        .pointer_mut("/hooks/prestart")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let before = hooks.len();
    hooks.retain(|hook| !is_runtime_hook(hook));
    hooks.len() != before
}

fn is_runtime_hook(hook: &Value) -> bool {
    let named = |s: Option<&str>| {
        s.and_then(|s| s.rsplit('/').next()) == Some("nvidia-container-runtime-hook")
    };
    let first_arg = hook.pointer("/args/0").and_then(Value::as_str);
    named(hook.get("path").and_then(Value::as_str)) || named(first_arg)
}

/// Refuses a rule that admits a withheld GPU without naming it: `strip` can remove exact
/// rules, but not a wildcard without taking other devices away too.
fn refuse_wildcards(spec: &Value, withheld: &[DeviceNode]) -> Result<(), ForeignError> {
    let Some(rules) = spec
        .pointer("/linux/resources/devices")
        .and_then(Value::as_array)
    else {
        return Ok(());
    };
    for (index, rule) in rules.iter().enumerate() {
        if !allows(rule) || !grants_access(rule) {
            continue;
        }
        // runc reads a missing type as `a` (all), a missing or -1 number as `*`.
        let kind = rule.get("type").and_then(Value::as_str).unwrap_or("a");
        let major = number(rule.get("major")).filter(|n| *n >= 0);
        let minor = number(rule.get("minor")).filter(|n| *n >= 0);
        // The kernel's devices cgroup reads type `a` as every device, numbers or not.
        let covers = |node: &DeviceNode| match kind {
            "a" => true,
            "c" => major.is_none_or(|m| m == i64::from(node.major)) && minor.is_none(),
            _ => false,
        };
        if withheld.iter().any(covers) {
            return Err(ForeignError::WildcardRule {
                index,
                rule: describe(kind, major, minor, rule),
            });
        }
    }
    Ok(())
}

/// A rule as `docker --device-cgroup-rule` writes it: `c 195:* rwm`. The type comes from
/// the container's spec and is quoted unless it is one of the three the spec defines.
fn describe(kind: &str, major: Option<i64>, minor: Option<i64>, rule: &Value) -> String {
    let number = |n: Option<i64>| n.map_or("*".to_string(), |n| n.to_string());
    let kind = match kind {
        "a" | "b" | "c" => kind.to_string(),
        other => format!("{other:?}"),
    };
    let access = rule.get("access").and_then(Value::as_str).unwrap_or("rwm");
    let access = match access.bytes().all(|b| b"rwm".contains(&b)) {
        true => access.to_string(),
        false => format!("{access:?}"),
    };
    format!("{kind} {}:{} {access}", number(major), number(minor))
}

fn allows(rule: &Value) -> bool {
    rule.get("allow").and_then(Value::as_bool) == Some(true)
}

/// Whether a rule lets the container open a device: Docker's and runc's default `c *:* m`
/// only lets it mknod one, which gives nothing without `r` or `w`. An empty or missing
/// access is read as everything, as the kernel reads an empty one in devices.allow.
fn grants_access(rule: &Value) -> bool {
    match rule.get("access").and_then(Value::as_str) {
        None | Some("") => true,
        Some(access) => access.contains(['r', 'w']),
    }
}

fn devices(spec: &Value) -> &[Value] {
    spec.pointer("/linux/devices")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// `c`, and `u` (unbuffered: the same character device to the kernel).
fn is_char_node(device: &Value) -> bool {
    matches!(
        device.get("type").and_then(Value::as_str),
        Some("c") | Some("u")
    )
}

fn is_gpu_minor(gpus: &GpuNumbers, minor: i64) -> bool {
    u32::try_from(minor).is_ok_and(|m| gpus.minors.contains(&m))
}

/// A JSON number as i64 (`null`, absent or anything else: `None`).
fn number(value: Option<&Value>) -> Option<i64> {
    value.and_then(Value::as_i64)
}

/// What NVIDIA's runtime would give the container, from the first of its sources that
/// names anything: device names from `cdi.k8s.io` annotations (keys in byte order, as
/// NVIDIA reads them), then volume-mount requests, then the env's last
/// `NVIDIA_VISIBLE_DEVICES` (the one NVIDIA's runtime reads).
fn nvidia_request(spec: &Value) -> Option<Vec<String>> {
    let mut keys: Vec<(&String, &str)> = annotations(spec)
        .map(|map| {
            map.iter()
                .filter(|(k, _)| k.starts_with(CDI_ANNOTATION_PREFIX))
                .filter_map(|(k, v)| Some((k, v.as_str()?)))
                .collect()
        })
        .unwrap_or_default();
    keys.sort_unstable();
    let cdi: Vec<String> = keys
        .iter()
        .flat_map(|(_, v)| v.split(','))
        .filter_map(|name| name.trim().strip_prefix(CDI_GPU_PREFIX))
        .map(str::to_string)
        .collect();
    if !cdi.is_empty() {
        return Some(cdi);
    }
    let mounted: Vec<String> = mounts(spec)
        .iter()
        .filter_map(volume_request)
        // IMEX channels are requested the same way, and are not GPUs.
        .filter(|name| !name.starts_with("imex/"))
        .map(str::to_string)
        .collect();
    if !mounted.is_empty() {
        return Some(mounted);
    }
    match env_values(spec).last() {
        Some(value) => Some(names(value)),
        None if legacy_all(spec) => Some(vec!["all".to_string()]),
        None => None,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    All,
    /// Distinct devices; 0 for `void`, `none` or nothing.
    Count(u32),
}

/// How many GPUs a list of NVIDIA device names asks for: none when `void` or `none` is
/// among them, else all when `all` is. An index and a UUID of the same GPU count twice:
/// the count only says how many GPUs gpupin picks, never which.
fn wanted(names: &[String]) -> Wanted {
    // NVIDIA's runtime ranks the special names void > none > all, wherever they stand
    // (internal/config/image/devices.go, NewVisibleDevices); void and none give no GPU.
    if names.iter().any(|n| n == "void" || n == "none") {
        return Wanted::Count(0);
    }
    let mut distinct = BTreeSet::new();
    for name in names {
        match name.as_str() {
            "all" => return Wanted::All,
            "" => {}
            other => {
                distinct.insert(other);
            }
        }
    }
    Wanted::Count(u32::try_from(distinct.len()).unwrap_or(u32::MAX))
}

/// A "legacy" CUDA image to NVIDIA's runtime (`CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA`
/// not) without `NVIDIA_VISIBLE_DEVICES`: its runtime gives such an image every GPU
/// (nvidia-container-toolkit internal/config/image/cuda_image.go, DevicesFromEnvvars).
fn legacy_all(spec: &Value) -> bool {
    let env = crate::admission::spec::process_env(spec);
    let last = |key: &str| {
        let prefix = format!("{key}=");
        env.iter()
            .rev()
            .find_map(|e| e.strip_prefix(&prefix).map(str::to_string))
    };
    last(VISIBLE_DEVICES).is_none()
        && last(CUDA_VERSION).is_some_and(|v| !v.is_empty())
        && last("NVIDIA_REQUIRE_CUDA").is_none_or(|v| v.is_empty())
}

fn names(value: &str) -> Vec<String> {
    value.split(',').map(|n| n.trim().to_string()).collect()
}

fn annotations(spec: &Value) -> Option<&Map<String, Value>> {
    spec.get("annotations").and_then(Value::as_object)
}

fn mounts(spec: &Value) -> &[Value] {
    spec.get("mounts")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The device a mount requests from NVIDIA's runtime, as its runtime reads one: source
/// `/dev/null`, destination under `VOLUME_MOUNT_PREFIX`.
fn volume_request(mount: &Value) -> Option<&str> {
    if mount.get("source").and_then(Value::as_str) != Some("/dev/null") {
        return None;
    }
    mount
        .get("destination")?
        .as_str()?
        .strip_prefix(VOLUME_MOUNT_PREFIX)
}

/// Every `NVIDIA_VISIBLE_DEVICES` value of `process.env`, in order.
fn env_values(spec: &Value) -> Vec<String> {
    let prefix = format!("{VISIBLE_DEVICES}=");
    crate::admission::spec::process_env(spec)
        .iter()
        .filter_map(|e| e.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

/// One `NVIDIA_VISIBLE_DEVICES=value` in place of them all: Docker appends its own after
/// the image's, and NVIDIA's runtime reads the last while glibc reads the first.
fn set_single_env(spec: &mut Value, value: &str) {
    // Only called when process.env holds an entry, so it is an array: cannot fail.
    let _ = crate::admission::spec::set_env(spec, VISIBLE_DEVICES, value);
}

/// Removes every `nvidia.com/gpu=` name from `cdi.k8s.io/*` annotations: an annotation
/// left without a name goes, one that also names another vendor's devices keeps those.
fn drop_cdi_annotations(spec: &mut Value) -> bool {
    let Some(map) = spec.get_mut("annotations").and_then(Value::as_object_mut) else {
        return false;
    };
    let mut changed = false;
    let keys: Vec<String> = map
        .keys()
        .filter(|k| k.starts_with(CDI_ANNOTATION_PREFIX))
        .cloned()
        .collect();
    for key in keys {
        let Some(value) = map.get(&key).and_then(Value::as_str) else {
            continue;
        };
        let names: Vec<&str> = value.split(',').map(str::trim).collect();
        let kept: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !n.starts_with(CDI_GPU_PREFIX))
            .collect();
        if kept.len() == names.len() {
            continue;
        }
        changed = true;
        if kept.iter().all(|n| n.is_empty()) {
            map.remove(&key);
        } else {
            let kept = kept.join(",");
            map.insert(key, Value::String(kept));
        }
    }
    changed
}

fn drop_volume_requests(spec: &mut Value) -> bool {
    let Some(list) = spec.get_mut("mounts").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = list.len();
    list.retain(|m| volume_request(m).is_none());
    list.len() != before
}

/// Specs as CDI leaves them, for the tests of the paths that read them (shim, precreate).
#[cfg(test)]
pub(crate) mod testing {
    use serde_json::{Value, json};

    /// `linux` with the nodes and allow rules CDI gives GPUs `minors` (`--device
    /// nvidia.com/gpu=...`), and nvidiactl's.
    pub(crate) fn cdi_linux(minors: &[u32]) -> Value {
        let mut nodes: Vec<Value> = minors
            .iter()
            .map(|m| json!({"path": format!("/dev/nvidia{m}"), "type": "c", "major": 195, "minor": m}))
            .collect();
        nodes.push(json!({"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}));
        let rules: Vec<Value> = nodes
            .iter()
            .map(|n| json!({"allow": true, "type": "c", "major": 195, "minor": n["minor"], "access": "rwm"}))
            .collect();
        json!({"devices": nodes, "resources": {"devices": rules}})
    }

    /// The GPU minors an edited spec gives the container, sorted; its nodes and its
    /// allow rules must agree.
    pub(crate) fn gpu_minors(spec: &Value) -> Vec<u64> {
        let minors = |list: &Value| -> Vec<u64> {
            let mut minors: Vec<u64> = list
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["major"] == 195 && d["minor"].as_u64().unwrap() < 254)
                .map(|d| d["minor"].as_u64().unwrap())
                .collect();
            minors.sort();
            minors
        };
        let nodes = minors(&spec["linux"]["devices"]);
        assert_eq!(nodes, minors(&spec["linux"]["resources"]["devices"]));
        nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mentions_gpus_sees_every_way_a_spec_can_reach_a_gpu_and_nothing_else() {
        let plain = json!({"process": {"env": ["PATH=/bin", "HOME=/root"]},
            "annotations": {"org.opencontainers.image.title": "web"},
            "linux": {"devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}],
                "resources": {"devices": [{"allow": false, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]}},
            "mounts": [{"source": "/data", "destination": "/data"}],
            "hooks": {"prestart": [{"path": "/usr/bin/true"}]}});
        assert!(!mentions_gpus(&plain));
        assert!(!mentions_gpus(&json!({})));
        let each = [
            ("/annotations/gpupin.count", json!("1")),
            ("/annotations/cdi.k8s.io~1gpu", json!("nvidia.com/gpu=0")),
            ("/process/env/0", json!("NVIDIA_VISIBLE_DEVICES=all")),
            ("/process/env/0", json!("CUDA_VERSION=12.4")),
            ("/process/env/0", json!("GPUPIN_COUNT=1")),
            ("/linux/devices/0/path", json!("/dev/nvidia3")),
            ("/linux/devices/0/path", json!("/dev/dri/renderD128")),
            ("/linux/devices/0/major", json!(195)),
            ("/linux/resources/devices/1/major", json!(195)),
            (
                "/mounts/0",
                json!({"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/all"}),
            ),
            (
                "/hooks/prestart/0/path",
                json!("/usr/bin/nvidia-container-runtime-hook"),
            ),
        ];
        for (pointer, value) in each {
            let mut spec = plain.clone();
            match spec.pointer_mut(pointer) {
                Some(slot) => *slot = value.clone(),
                None => {
                    let key = pointer.rsplit('/').next().unwrap().replace("~1", "/");
                    spec["annotations"][key] = value.clone();
                }
            }
            assert!(mentions_gpus(&spec), "{pointer} = {value}");
        }
    }

    /// Four GPUs (minors 0-3) on major 195, as the inventory gives them.
    fn machine() -> GpuNumbers {
        GpuNumbers {
            major: 195,
            minors: (0..4).collect(),
        }
    }

    fn gpu(minor: u32) -> DeviceNode {
        DeviceNode {
            path: crate::model::nvidia::gpu_node(minor),
            major: 195,
            minor,
        }
    }

    fn node(path: &str, major: u32, minor: u32) -> Value {
        json!({"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 438})
    }

    fn rule(major: u32, minor: u32) -> Value {
        json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"})
    }

    /// What podman gives `--device nvidia.com/gpu=0 --device nvidia.com/gpu=1` through
    /// CDI: the GPUs' nodes, the control nodes, a DRM node, an allow rule each, and the
    /// default rules (deny all, mknod of anything).
    fn cdi_spec(gpus: &[u32]) -> Value {
        let mut nodes: Vec<Value> = gpus
            .iter()
            .map(|m| node(&format!("/dev/nvidia{m}"), 195, *m))
            .collect();
        nodes.extend([
            node("/dev/nvidiactl", 195, 255),
            node("/dev/nvidia-modeset", 195, 254),
            node("/dev/nvidia-uvm", 508, 0),
            node("/dev/dri/card1", 226, 1),
            node("/dev/fuse", 10, 229),
        ]);
        let mut rules = vec![
            json!({"allow": false, "access": "rwm"}),
            json!({"allow": true, "type": "c", "access": "m"}),
            json!({"allow": true, "type": "b", "major": -1, "minor": -1, "access": "m"}),
        ];
        rules.extend(nodes.iter().map(|n| {
            rule(
                n["major"].as_u64().unwrap() as u32,
                n["minor"].as_u64().unwrap() as u32,
            )
        }));
        json!({
            "ociVersion": "1.0.2",
            "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]},
            "mounts": [{"destination": "/proc", "source": "proc", "type": "proc"}],
            "linux": {"devices": nodes, "resources": {"devices": rules}},
            "annotations": {"org.example": "x"},
        })
    }

    fn paths(spec: &Value) -> Vec<&str> {
        spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect()
    }

    fn rule_minors(spec: &Value, major: u64) -> Vec<u64> {
        spec["linux"]["resources"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["major"].as_u64() == Some(major))
            .map(|r| r["minor"].as_u64().unwrap())
            .collect()
    }

    fn no_machine() -> Result<GpuNumbers, String> {
        Err("the inventory is not needed here".into())
    }

    fn request_of(spec: &Value, unrequested: Unrequested) -> Option<GpuRequest> {
        request(spec, unrequested, || Ok::<_, String>(machine())).unwrap()
    }

    #[test]
    fn gpu_nodes_in_the_spec_ask_for_that_many_gpus_whatever_the_setting() {
        let spec = cdi_spec(&[0, 1]);
        for setting in [Unrequested::Strip, Unrequested::Request, Unrequested::Pass] {
            let r = request_of(&spec, setting).unwrap();
            assert_eq!(r.selection, Selection::Count(2));
            assert_eq!(r.origin, Origin::Nvidia);
        }
    }

    #[test]
    fn a_gpu_node_counts_by_its_numbers_not_its_path() {
        let mut spec = cdi_spec(&[]);
        spec["linux"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(node("/dev/gpu-a", 195, 3));
        assert_eq!(gpu_minors(&spec, &machine()), BTreeSet::from([3]));
        // Not a GPU of this machine, a block device, another major: no GPU.
        let devices = spec["linux"]["devices"].as_array_mut().unwrap();
        devices.pop();
        devices.push(node("/dev/nvidia9", 195, 9));
        devices.push(json!({"path": "/dev/nvidia2", "type": "b", "major": 195, "minor": 2}));
        devices.push(node("/dev/other", 196, 1));
        assert!(gpu_minors(&spec, &machine()).is_empty());
    }

    #[test]
    fn a_privileged_containers_nodes_make_no_request() {
        // Docker's --privileged: every host node, and a rule that allows them all.
        let mut spec = cdi_spec(&[0, 1, 2, 3]);
        spec["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]);
        assert!(admits_every_gpu(&spec, &machine()));
        assert_eq!(request_of(&spec, Unrequested::Strip), None);
        let mut wildcard = cdi_spec(&[0]);
        wildcard["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"allow": true, "type": "c", "major": 195, "access": "rw"}));
        assert_eq!(request_of(&wildcard, Unrequested::Strip), None);
        assert!(!admits_every_gpu(&cdi_spec(&[0]), &machine()));
    }

    #[test]
    fn control_and_other_nodes_alone_ask_for_nothing() {
        let spec = cdi_spec(&[]);
        assert_eq!(request_of(&spec, Unrequested::Request), None);
    }

    #[test]
    fn a_spec_without_char_devices_never_loads_the_machine() {
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
                          "linux": {"devices": [{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}]}});
        assert_eq!(request(&spec, Unrequested::Pass, no_machine).unwrap(), None);
        let r = request(&spec, Unrequested::Request, no_machine)
            .unwrap()
            .unwrap();
        assert_eq!(r.selection, Selection::All);
    }

    #[test]
    fn the_env_becomes_a_request_only_when_asked_to() {
        let env = |values: &[&str]| {
            let env: Vec<String> = values
                .iter()
                .map(|v| format!("NVIDIA_VISIBLE_DEVICES={v}"))
                .collect();
            json!({"process": {"env": env}})
        };
        let cases: [(&[&str], Option<Selection>); 9] = [
            (&["all"], Some(Selection::All)),
            (&["0,1"], Some(Selection::Count(2))),
            (&["GPU-a, GPU-b,GPU-a"], Some(Selection::Count(2))),
            (&["void"], None),
            (&["none"], None),
            (&[""], None),
            (&["0,void"], None),
            (&["all,none"], None),
            // Docker appends its own after the image's: NVIDIA's runtime reads the last.
            (&["all", "0,1,2"], Some(Selection::Count(3))),
        ];
        for (values, expected) in cases {
            let spec = env(values);
            let got = request(&spec, Unrequested::Request, no_machine).unwrap();
            assert_eq!(got.map(|r| r.selection), expected, "{values:?}");
            assert_eq!(
                request(&spec, Unrequested::Strip, no_machine).unwrap(),
                None
            );
            assert_eq!(request(&spec, Unrequested::Pass, no_machine).unwrap(), None);
        }
    }

    #[test]
    fn annotations_come_before_volume_mounts_before_the_env() {
        let mut spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
            "mounts": [
                {"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"},
                {"destination": "/var/run/nvidia-container-devices/1", "source": "/dev/null"},
                {"destination": "/var/run/nvidia-container-devices/2", "source": "/tmp/x"},
                {"destination": "/var/run/nvidia-container-devices/imex/0", "source": "/dev/null"},
            ],
            "annotations": {
                "cdi.k8s.io/b": "vendor.com/x=1",
                "cdi.k8s.io/a": "nvidia.com/gpu=0,nvidia.com/gpu=GPU-x,nvidia.com/gpu=2",
            },
        });
        let selection = |spec: &Value| request_of(spec, Unrequested::Request).unwrap().selection;
        assert_eq!(selection(&spec), Selection::Count(3));
        spec["annotations"] = json!({"cdi.k8s.io/b": "vendor.com/x=1"});
        assert_eq!(selection(&spec), Selection::Count(2));
        spec["mounts"] = json!([]);
        assert_eq!(selection(&spec), Selection::All);
        spec["annotations"] = json!({"cdi.k8s.io/a": "nvidia.com/gpu=all"});
        assert_eq!(selection(&spec), Selection::All);
    }

    #[test]
    fn void_takes_out_every_nvidia_request_and_keeps_the_rest() {
        let mut spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "A=1", "NVIDIA_VISIBLE_DEVICES=0,1"]},
            "mounts": [
                {"destination": "/proc", "source": "proc"},
                {"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"},
            ],
            "annotations": {
                "cdi.k8s.io/a": "nvidia.com/gpu=0",
                "cdi.k8s.io/b": "vendor.com/x=1,nvidia.com/gpu=1",
                "cdi.k8s.io/c": "vendor.com/y=2",
                "x": "nvidia.com/gpu=3",
            },
        });
        assert!(void(&mut spec));
        assert_eq!(
            spec,
            json!({
                "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void", "A=1"]},
                "mounts": [{"destination": "/proc", "source": "proc"}],
                "annotations": {
                    "cdi.k8s.io/b": "vendor.com/x=1",
                    "cdi.k8s.io/c": "vendor.com/y=2",
                    "x": "nvidia.com/gpu=3",
                },
            })
        );
        let once = spec.clone();
        assert!(!void(&mut spec), "a second void changes nothing");
        assert_eq!(spec, once);
    }

    #[test]
    fn a_legacy_cuda_image_without_visible_devices_asks_for_every_gpu() {
        let mut spec = json!({"process": {"env": ["PATH=/bin", "CUDA_VERSION=8.0.61"]}});
        let r = request(&spec, Unrequested::Request, no_machine)
            .unwrap()
            .unwrap();
        assert_eq!(r.selection, Selection::All);
        assert!(void(&mut spec));
        assert_eq!(
            spec["process"]["env"],
            json!([
                "PATH=/bin",
                "CUDA_VERSION=8.0.61",
                "NVIDIA_VISIBLE_DEVICES=void"
            ])
        );
        // Not legacy: it states its requirement (the images of today), or no CUDA_VERSION.
        for env in [
            json!(["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]),
            json!(["CUDA_VERSION="]),
        ] {
            let mut spec = json!({"process": {"env": env}});
            assert_eq!(
                request(&spec, Unrequested::Request, no_machine).unwrap(),
                None
            );
            assert!(!void(&mut spec));
        }
    }

    #[test]
    fn void_leaves_a_spec_that_asks_nvidia_for_nothing_alone() {
        for env in [
            "NVIDIA_VISIBLE_DEVICES=void",
            "NVIDIA_VISIBLE_DEVICES=none",
            "A=1",
        ] {
            let mut spec = json!({"process": {"env": [env, "NVIDIA_VISIBLE_DEVICES_X=all"]}});
            let before = spec.clone();
            assert!(!void(&mut spec), "{env}");
            assert_eq!(spec, before);
        }
    }

    #[test]
    fn strip_removes_other_gpus_nodes_and_rules_and_keeps_the_rest() {
        // podman --device nvidia.com/gpu=all; gpupin chose GPU 2 and added its node.
        let mut spec = cdi_spec(&[0, 1, 2, 3]);
        spec["annotations"]["cdi.k8s.io/devices"] = json!("nvidia.com/gpu=all");
        spec["mounts"].as_array_mut().unwrap().push(
            json!({"destination": "/var/run/nvidia-container-devices/all", "source": "/dev/null"}),
        );
        let before = spec.clone();
        strip(&mut spec, &[gpu(0), gpu(1), gpu(3)]).unwrap();
        assert_eq!(
            paths(&spec),
            [
                "/dev/nvidia2",
                "/dev/nvidiactl",
                "/dev/nvidia-modeset",
                "/dev/nvidia-uvm",
                "/dev/dri/card1",
                "/dev/fuse"
            ]
        );
        assert_eq!(rule_minors(&spec, 195), [2, 255, 254]);
        assert_eq!(rule_minors(&spec, 226), [1]);
        assert_eq!(rule_minors(&spec, 10), [229]);
        // The default rules stay: deny all, mknod of anything.
        let rules =
            |spec: &Value| spec["linux"]["resources"]["devices"].as_array().unwrap()[..3].to_vec();
        assert_eq!(rules(&spec), rules(&before));
        assert_eq!(spec["annotations"], json!({"org.example": "x"}));
        assert_eq!(spec["mounts"], json!([before["mounts"][0]]));
        assert_eq!(spec["process"], before["process"]);
        let once = spec.clone();
        strip(&mut spec, &[gpu(0), gpu(1), gpu(3)]).unwrap();
        assert_eq!(spec, once, "strip is idempotent");
    }

    #[test]
    fn strip_finds_a_withheld_gpu_under_any_path() {
        let mut spec = json!({"linux": {"devices": [node("/dev/renamed", 195, 1), node("/dev/nvidia1", 196, 1)]}});
        strip(&mut spec, &[gpu(1)]).unwrap();
        assert_eq!(paths(&spec), ["/dev/nvidia1"]);
    }

    #[test]
    fn strip_with_nothing_withheld_only_drops_nvidias_requests() {
        let mut spec = cdi_spec(&[0, 1]);
        spec["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"allow": true, "access": "rwm"}));
        spec["annotations"]["cdi.k8s.io/x"] = json!("nvidia.com/gpu=0");
        let mut stripped = spec.clone();
        strip(&mut stripped, &[]).unwrap();
        spec["annotations"] = json!({"org.example": "x"});
        assert_eq!(stripped, spec);
    }

    #[test]
    fn a_wildcard_that_would_readmit_a_withheld_gpu_is_refused_and_nothing_changes() {
        let wildcards = [
            json!({"allow": true, "access": "rwm"}),
            json!({"allow": true, "type": "a", "major": 195, "minor": 3, "access": "rw"}),
            json!({"allow": true, "type": "c", "major": 195, "access": "rw"}),
            json!({"allow": true, "type": "c", "major": 195, "minor": -1, "access": "r"}),
            json!({"allow": true, "type": "c", "major": null, "minor": null}),
            json!({"allow": true, "type": "c", "major": -1, "minor": null, "access": ""}),
        ];
        for wildcard in wildcards {
            let mut spec = cdi_spec(&[0, 1]);
            spec["linux"]["resources"]["devices"]
                .as_array_mut()
                .unwrap()
                .push(wildcard.clone());
            let before = spec.clone();
            let err = strip(&mut spec, &[gpu(1), gpu(2)]).unwrap_err().to_string();
            assert!(
                err.starts_with("linux.resources.devices[") && err.contains("gpupin cannot pin"),
                "{err}"
            );
            assert_eq!(spec, before, "{wildcard}");
        }
    }

    #[test]
    fn harmless_wide_rules_are_kept() {
        let harmless = [
            // mknod only (Docker's and runc's defaults)
            json!({"allow": true, "type": "c", "major": -1, "minor": -1, "access": "m"}),
            // denials, block devices, another major
            json!({"allow": false, "type": "c", "major": 195, "access": "rwm"}),
            json!({"allow": true, "type": "b", "access": "rwm"}),
            json!({"allow": true, "type": "c", "major": 10, "access": "rwm"}),
        ];
        for wide in harmless {
            let mut spec = cdi_spec(&[0]);
            spec["linux"]["resources"]["devices"]
                .as_array_mut()
                .unwrap()
                .push(wide.clone());
            strip(&mut spec, &[gpu(1)]).unwrap();
            let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
            assert_eq!(rules.last(), Some(&wide));
        }
    }

    #[test]
    fn a_wildcard_is_described_on_one_line_with_the_containers_text_quoted() {
        let mut spec = json!({"linux": {"resources": {"devices": [
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 195, "access": "rw\nfake: line"},
        ]}}});
        let err = strip(&mut spec, &[gpu(0)]).unwrap_err().to_string();
        assert!(
            err.starts_with(r#"linux.resources.devices[1] (c 195:* "rw\nfake: line")"#),
            "{err}"
        );
        assert!(!err.contains('\n'));
        let mut spec = json!({"linux": {"resources": {"devices": [{"allow": true}]}}});
        let err = strip(&mut spec, &[gpu(0)]).unwrap_err().to_string();
        assert!(
            err.starts_with("linux.resources.devices[0] (a *:* rwm)"),
            "{err}"
        );
    }

    #[test]
    fn a_created_container_with_a_withheld_gpu_is_refused_one_without_is_cleaned() {
        let mut spec = cdi_spec(&[1]);
        spec["linux"]["devices"][0]["path"] = json!("/dev/gpu\nx");
        let before = spec.clone();
        let err = strip_created(&mut spec, &[gpu(0), gpu(1)])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(r#"the container already has GPU node "/dev/gpu\nx" (195:1)"#),
            "{err}"
        );
        assert_eq!(spec, before);
        // An allow rule alone lets the container mknod the node itself.
        let mut rule_only = before.clone();
        rule_only["linux"]["devices"] = json!([]);
        let err = strip_created(&mut rule_only, &[gpu(1)])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("linux.resources.devices[3] (c 195:1 rwm) gave"),
            "{err}"
        );
        spec["annotations"]["cdi.k8s.io/a"] = json!("nvidia.com/gpu=1");
        strip_created(&mut spec, &[gpu(0), gpu(2)]).unwrap();
        assert_eq!(spec["annotations"], json!({"org.example": "x"}));
        assert_eq!(spec["linux"], before["linux"]);
    }

    #[test]
    fn nvidias_legacy_hook_is_dropped_and_other_hooks_stay() {
        let gpupin = json!({"path": "/usr/bin/gpupin-hook", "args": ["gpupin-hook", "prestart"]});
        let mut spec = json!({"hooks": {
            "prestart": [
                {"path": "/usr/bin/nvidia-container-runtime-hook",
                 "args": ["nvidia-container-runtime-hook", "prestart"]},
                gpupin,
                {"path": "/usr/local/bin/wrapper", "args": ["nvidia-container-runtime-hook", "prestart"]},
            ],
            "poststop": [gpupin],
        }});
        assert!(drop_runtime_hooks(&mut spec));
        assert_eq!(
            spec,
            json!({"hooks": {"prestart": [gpupin], "poststop": [gpupin]}})
        );
        assert!(!drop_runtime_hooks(&mut spec));
        assert!(!drop_runtime_hooks(&mut json!({})));
    }

    #[test]
    fn unrequested_parses_its_three_values() {
        assert_eq!("request".parse(), Ok(Unrequested::Request));
        assert_eq!("strip".parse(), Ok(Unrequested::Strip));
        assert_eq!("pass".parse(), Ok(Unrequested::Pass));
        assert_eq!("Strip".parse::<Unrequested>(), Err(()));
        assert_eq!(Unrequested::default(), Unrequested::Strip);
    }
}
