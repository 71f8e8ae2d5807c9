//! Spec edits beyond env and mounts: device nodes with their cgroup rules, annotations,
//! and hooks.
//! Each edit is idempotent, so a retried `create` leaves one entry, not two.

use super::{SpecError, type_name};
use crate::model::gpu::DeviceNode;
use serde_json::{Map, Value, json};

/// `spec.<path>` as a mutable array, creating the objects on the way and the array itself.
/// `field` is the dotted path, for errors.
pub(super) fn array_at<'a>(
    spec: &'a mut Value,
    path: &[&str],
    field: &'static str,
) -> Result<&'a mut Vec<Value>, SpecError> {
    let (last, parents) = path.split_last().expect("a non-empty path");
    let mut node = spec;
    for key in parents {
        node = object(node, field)?
            .entry(*key)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    match object(node, field)?
        .entry(*last)
        .or_insert_with(|| Value::Array(Vec::new()))
    {
        Value::Array(items) => Ok(items),
        other => Err(SpecError::WrongType {
            field,
            expected: "an array",
            found: type_name(other),
        }),
    }
}

fn object<'a>(
    value: &'a mut Value,
    field: &'static str,
) -> Result<&'a mut Map<String, Value>, SpecError> {
    // `null` is how Go's encoder writes an absent struct pointer: treat it as empty.
    if value.is_null() {
        *value = Value::Object(Map::new());
    }
    match value {
        Value::Object(map) => Ok(map),
        other => Err(SpecError::WrongType {
            field,
            expected: "an object",
            found: type_name(other),
        }),
    }
}

/// Adds `nodes` to `linux.devices` (the runtime creates them in the container) and an
/// allow rule for each to `linux.resources.devices` (the runtime grants them in the
/// device cgroup, v1 or v2, and keeps them across `systemctl daemon-reload`).
pub(crate) fn add_devices(spec: &mut Value, nodes: &[DeviceNode]) -> Result<(), SpecError> {
    let devices = array_at(spec, &["linux", "devices"], "linux.devices")?;
    for node in nodes {
        // A node the spec already has at this path is replaced: ours is the one chosen.
        devices.retain(|d| d.get("path").and_then(Value::as_str) != Some(node.path.as_str()));
        devices.push(json!({
            "path": node.path, "type": "c", "major": node.major, "minor": node.minor,
            "fileMode": 0o666, "uid": 0, "gid": 0,
        }));
    }
    let rules = array_at(
        spec,
        &["linux", "resources", "devices"],
        "linux.resources.devices",
    )?;
    for node in nodes {
        let rule = json!({
            "allow": true, "type": "c", "major": node.major, "minor": node.minor, "access": "rwm",
        });
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    Ok(())
}

/// Pins the container to `cpus` (and memory nodes `mems`) unless its spec already has a
/// cpuset: a user's own `--cpuset-cpus` wins. Returns whether it set one.
pub(crate) fn set_cpuset_unless_set(
    spec: &mut Value,
    cpus: &str,
    mems: Option<&str>,
) -> Result<bool, SpecError> {
    let already = spec
        .pointer("/linux/resources/cpu/cpus")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    if already {
        return Ok(false);
    }
    let mut node = spec;
    for key in ["linux", "resources", "cpu"] {
        node = object(node, "linux.resources.cpu")?
            .entry(key)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    let cpu = object(node, "linux.resources.cpu")?;
    cpu.insert("cpus".into(), Value::String(cpus.into()));
    if let Some(mems) = mems {
        cpu.insert("mems".into(), Value::String(mems.into()));
    }
    Ok(true)
}

/// Adds `gids` to `process.user.additionalGids`, each once; gid 0 is never added (as in
/// the CDI reference: a spec must not make a container's process root's group). No gids:
/// the spec is left as it was.
pub(crate) fn add_additional_gids(spec: &mut Value, gids: &[u32]) -> Result<(), SpecError> {
    if gids.iter().all(|g| *g == 0) {
        return Ok(());
    }
    let field = "process.user.additionalGids";
    let list = array_at(spec, &["process", "user", "additionalGids"], field)?;
    for gid in gids.iter().filter(|g| **g != 0) {
        let gid = json!(gid);
        if !list.contains(&gid) {
            list.push(gid);
        }
    }
    Ok(())
}

/// Sets one annotation, replacing an earlier value.
pub(crate) fn set_annotation(spec: &mut Value, key: &str, value: &str) -> Result<(), SpecError> {
    let root = object(spec, "spec")?;
    let annotations = root
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    object(annotations, "annotations")?.insert(key.to_string(), Value::String(value.to_string()));
    Ok(())
}

/// Appends a hook to `hooks.<stage>` unless one with the same path and args is there.
pub(crate) fn add_hook(
    spec: &mut Value,
    stage: &'static str,
    path: &str,
    args: &[String],
) -> Result<(), SpecError> {
    add_hook_entry(spec, stage, json!({"path": path, "args": args}))
}

/// Appends `entry` (an OCI hook: `path`, and `args`, `env`, `timeout` where given) to
/// `hooks.<stage>` unless a hook with the same path and args is there already: podman or
/// Docker may have applied a CDI spec's hooks before gpupin, and `update-ldcache` must
/// not run twice. An absent `args` counts as an empty one.
pub(crate) fn add_hook_entry(
    spec: &mut Value,
    stage: &'static str,
    entry: Value,
) -> Result<(), SpecError> {
    let field = match stage {
        "prestart" => "hooks.prestart",
        "createRuntime" => "hooks.createRuntime",
        "createContainer" => "hooks.createContainer",
        "startContainer" => "hooks.startContainer",
        "poststart" => "hooks.poststart",
        "poststop" => "hooks.poststop",
        _ => "hooks",
    };
    let hooks = array_at(spec, &["hooks", stage], field)?;
    let identity = |hook: &Value| {
        let args = hook
            .get("args")
            .cloned()
            .unwrap_or(Value::Array(Vec::new()));
        (hook.get("path").cloned(), args)
    };
    let new = identity(&entry);
    if !hooks.iter().any(|hook| identity(hook) == new) {
        hooks.push(entry);
    }
    Ok(())
}

/// Removes every `stage` hook that runs `path`; a missing list is left missing.
pub(crate) fn remove_hooks(spec: &mut Value, stage: &str, path: &str) {
    if let Some(hooks) = spec
        .pointer_mut(&format!("/hooks/{stage}"))
        .and_then(Value::as_array_mut)
    {
        hooks.retain(|hook| hook.get("path").and_then(Value::as_str) != Some(path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            major: 195,
            minor,
        }
    }

    #[test]
    fn devices_and_rules_are_added_once() {
        let mut spec =
            json!({"linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}});
        let nodes = [node("/dev/nvidia3", 3), node("/dev/nvidiactl", 255)];
        add_devices(&mut spec, &nodes).unwrap();
        add_devices(&mut spec, &nodes).unwrap();
        let devices = spec["linux"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0]["path"], "/dev/nvidia3");
        assert_eq!(devices[0]["minor"], 3);
        assert_eq!(devices[0]["fileMode"], 438);
        let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules.len(), 3, "the deny-all rule stays first: {rules:?}");
        assert_eq!(
            rules[1],
            json!({"allow": true, "type": "c", "major": 195, "minor": 3, "access": "rwm"})
        );
    }

    #[test]
    fn null_sections_are_filled_and_wrong_types_refused() {
        let mut spec = json!({"linux": null, "hooks": null});
        add_devices(&mut spec, &[node("/dev/nvidia0", 0)]).unwrap();
        add_hook(&mut spec, "poststop", "/usr/bin/gpupin", &["gpupin".into()]).unwrap();
        add_hook(&mut spec, "poststop", "/usr/bin/gpupin", &["gpupin".into()]).unwrap();
        assert_eq!(spec["hooks"]["poststop"].as_array().unwrap().len(), 1);
        let mut bad = json!({"linux": {"devices": {}}});
        let err = add_devices(&mut bad, &[node("/dev/nvidia0", 0)])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "spec field linux.devices is an object, expected an array"
        );
    }

    #[test]
    fn cpuset_is_set_unless_the_user_set_one() {
        let mut spec = json!({"linux": {"resources": {"memory": {"limit": 1}}}});
        assert!(set_cpuset_unless_set(&mut spec, "0-3", Some("0")).unwrap());
        assert_eq!(
            spec["linux"]["resources"]["cpu"],
            json!({"cpus": "0-3", "mems": "0"})
        );
        assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 1);
        let mut mine = json!({"linux": {"resources": {"cpu": {"cpus": "5"}}}});
        assert!(!set_cpuset_unless_set(&mut mine, "0-3", None).unwrap());
        assert_eq!(mine["linux"]["resources"]["cpu"]["cpus"], "5");
    }

    #[test]
    fn additional_gids_are_added_once_and_never_root() {
        let mut spec =
            json!({"process": {"user": {"uid": 1000, "gid": 1000, "additionalGids": [10]}}});
        add_additional_gids(&mut spec, &[44, 0, 10]).unwrap();
        add_additional_gids(&mut spec, &[44]).unwrap();
        assert_eq!(
            spec["process"]["user"],
            json!({"uid": 1000, "gid": 1000, "additionalGids": [10, 44]})
        );
        let mut plain = json!({"process": {}});
        add_additional_gids(&mut plain, &[0]).unwrap();
        assert_eq!(plain, json!({"process": {}}));
    }

    #[test]
    fn annotation_is_replaced() {
        let mut spec = json!({"annotations": {"gpupin.assigned": "old", "x": "y"}});
        set_annotation(&mut spec, "gpupin.assigned", "GPU-1").unwrap();
        assert_eq!(
            spec["annotations"],
            json!({"gpupin.assigned": "GPU-1", "x": "y"})
        );
    }

    #[test]
    fn a_hook_with_the_same_path_and_args_is_not_added_again() {
        let mut spec = json!({"hooks": {"createContainer": [
            {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"]},
        ]}});
        let same = json!({"path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", "update-ldcache"], "env": ["NVIDIA_CTK_DEBUG=false"]});
        add_hook_entry(&mut spec, "createContainer", same).unwrap();
        let other = json!({"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook"]});
        add_hook_entry(&mut spec, "createContainer", other.clone()).unwrap();
        add_hook_entry(&mut spec, "createContainer", other).unwrap();
        let hooks = spec["hooks"]["createContainer"].as_array().unwrap();
        assert_eq!(hooks.len(), 2, "{hooks:?}");
        assert!(
            hooks[0].get("env").is_none(),
            "the hook already there stays as it was"
        );
    }

    #[test]
    fn remove_hooks_drops_only_the_named_program() {
        let mut spec = json!({"hooks": {"prestart": [
            {"path": "/usr/bin/gpupin", "args": ["gpupin", "hook", "prestart"]},
            {"path": "/usr/bin/other"},
        ]}});
        remove_hooks(&mut spec, "prestart", "/usr/bin/gpupin");
        remove_hooks(&mut spec, "poststop", "/usr/bin/gpupin");
        assert_eq!(
            spec,
            json!({"hooks": {"prestart": [{"path": "/usr/bin/other"}]}})
        );
    }
}
