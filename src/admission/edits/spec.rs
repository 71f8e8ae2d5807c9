//! The spec writer: applies edits to a runtime spec before create (the Docker shim,
//! podman's precreate). The runtime then creates the nodes and grants them in the device
//! cgroup itself, on cgroup v1 or v2, and access survives `systemctl daemon-reload`.

use super::{ApplyError, ContainerEdits, Hook, Mount};
use crate::admission::foreign;
use crate::admission::spec;
use serde_json::{Value, json};

/// Writes every edit into `spec`, then takes the GPUs the container was not given out of
/// it (a CDI device or `--device` that came with it). Idempotent: applied twice, the spec
/// is the same. On an error the spec may be half edited: callers write it only on `Ok`.
pub(crate) fn apply(edits: &ContainerEdits, spec: &mut Value) -> Result<(), ApplyError> {
    spec::add_devices(spec, &edits.nodes)?;
    for (key, value) in &edits.env {
        spec::set_env(spec, key, value)?;
    }
    for (key, value) in &edits.annotations {
        spec::set_annotation(spec, key, value)?;
    }
    for hook in &edits.hooks {
        spec::add_hook_entry(spec, hook.stage, hook_entry(hook))?;
    }
    let mounts: Vec<Value> = edits.mounts.iter().map(mount_entry).collect();
    spec::add_mounts(spec, &mounts)?;
    spec::add_additional_gids(spec, &edits.additional_gids)?;
    if let Some(set) = &edits.cpuset {
        spec::set_cpuset_unless_set(spec, &set.cpus, set.mems.as_deref())?;
    }
    foreign::strip(spec, &edits.withheld)?;
    if edits.driver_from_cdi {
        foreign::drop_runtime_hooks(spec);
    }
    Ok(())
}

/// An OCI hook object: `env` and `timeout` only where given.
fn hook_entry(hook: &Hook) -> Value {
    let mut entry = json!({"path": hook.path, "args": hook.args});
    if !hook.env.is_empty() {
        entry["env"] = json!(hook.env);
    }
    if let Some(timeout) = hook.timeout {
        entry["timeout"] = json!(timeout);
    }
    entry
}

/// An OCI mount object, keys in the order Docker writes them.
fn mount_entry(mount: &Mount) -> Value {
    let mut entry = serde_json::Map::new();
    entry.insert("destination".into(), json!(mount.destination));
    if let Some(kind) = &mount.kind {
        entry.insert("type".into(), json!(kind));
    }
    entry.insert("source".into(), json!(mount.source));
    entry.insert("options".into(), json!(mount.options));
    Value::Object(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::edits::Cpuset;
    use crate::model::gpu::DeviceNode;

    fn edits() -> ContainerEdits {
        ContainerEdits {
            nodes: vec![DeviceNode {
                path: "/dev/nvidia3".into(),
                major: 195,
                minor: 3,
            }],
            env: vec![("NVIDIA_VISIBLE_DEVICES".into(), "GPU-3".into())],
            annotations: vec![("gpupin.assigned".into(), "GPU-3".into())],
            hooks: vec![Hook {
                stage: "poststop",
                path: "/usr/bin/gpupin".into(),
                args: vec!["gpupin".into(), "hook".into(), "poststop".into()],
                env: Vec::new(),
                timeout: None,
            }],
            cpuset: Some(Cpuset {
                cpus: "0-3".into(),
                mems: None,
            }),
            mounts: Vec::new(),
            additional_gids: Vec::new(),
            withheld: vec![DeviceNode {
                path: "/dev/nvidia2".into(),
                major: 195,
                minor: 2,
            }],
            driver_from_cdi: false,
            cdi_devices: Vec::new(),
        }
    }

    #[test]
    fn a_cdi_driver_takes_nvidias_legacy_hook_out_and_leaves_others() {
        let legacy = json!({"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]});
        let other = json!({"path": "/usr/bin/other"});
        let mut spec = json!({"hooks": {"prestart": [legacy, other]}});
        apply(&edits(), &mut spec).unwrap();
        assert_eq!(spec["hooks"]["prestart"][0], legacy, "kept without CDI");
        let cdi = ContainerEdits {
            driver_from_cdi: true,
            cdi_devices: Vec::new(),
            ..edits()
        };
        apply(&cdi, &mut spec).unwrap();
        assert_eq!(spec["hooks"]["prestart"], json!([other]));
    }

    #[test]
    fn every_edit_lands_once_and_other_keys_stay() {
        let mut spec = json!({"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "A=1"]}, "x-keep": true});
        apply(&edits(), &mut spec).unwrap();
        let once = spec.clone();
        apply(&edits(), &mut spec).unwrap();
        assert_eq!(spec, once);
        assert_eq!(spec["x-keep"], true);
        assert_eq!(
            spec["process"]["env"],
            json!(["NVIDIA_VISIBLE_DEVICES=GPU-3", "A=1"])
        );
        assert_eq!(spec["linux"]["devices"][0]["path"], "/dev/nvidia3");
        assert_eq!(spec["annotations"]["gpupin.assigned"], "GPU-3");
        assert_eq!(spec["hooks"]["poststop"][0]["path"], "/usr/bin/gpupin");
        assert_eq!(spec["linux"]["resources"]["cpu"]["cpus"], "0-3");
        assert!(
            spec.get("mounts").is_none(),
            "no mounts asked for, none written"
        );
    }

    #[test]
    fn driver_mounts_and_hooks_land_once_with_their_env() {
        let mut edits = edits();
        edits.hooks.push(Hook {
            stage: "createContainer",
            path: "/usr/bin/nvidia-cdi-hook".into(),
            args: vec!["nvidia-cdi-hook".into(), "update-ldcache".into()],
            env: vec!["NVIDIA_CTK_DEBUG=false".into()],
            timeout: Some(5),
        });
        edits.mounts.push(Mount {
            destination: "/usr/bin/nvidia-smi".into(),
            source: "/driver/usr/bin/nvidia-smi".into(),
            kind: None,
            options: vec!["ro".into(), "rbind".into()],
        });
        edits.additional_gids = vec![44, 110];
        let mut spec =
            json!({"mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]});
        apply(&edits, &mut spec).unwrap();
        let once = spec.clone();
        apply(&edits, &mut spec).unwrap();
        assert_eq!(spec, once);
        assert_eq!(spec["process"]["user"]["additionalGids"], json!([44, 110]));
        assert_eq!(
            spec["hooks"]["createContainer"],
            json!([{"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache"],
                    "env": ["NVIDIA_CTK_DEBUG=false"], "timeout": 5}])
        );
        assert_eq!(
            spec["mounts"][1],
            json!({"destination": "/usr/bin/nvidia-smi", "source": "/driver/usr/bin/nvidia-smi",
                   "options": ["ro", "rbind"]})
        );
    }

    #[test]
    fn gpus_that_came_with_the_spec_give_way_to_the_chosen_one() {
        // Docker's --gpus 2 resolved as CDI (GPUs 2 and 3), the image's env and Docker's.
        let gpu = |minor: u32| json!({"path": format!("/dev/nvidia{minor}"), "type": "c", "major": 195, "minor": minor});
        let rule = |minor: u32| json!({"allow": true, "type": "c", "major": 195, "minor": minor, "access": "rwm"});
        let mut spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"]},
            "linux": {"devices": [gpu(2), gpu(3)], "resources": {"devices": [rule(2), rule(3)]}},
        });
        let mut edits = edits();
        edits.withheld = vec![2, 0, 1, 4]
            .into_iter()
            .map(|minor| DeviceNode {
                path: crate::model::nvidia::gpu_node(minor),
                major: 195,
                minor,
            })
            .collect();
        apply(&edits, &mut spec).unwrap();
        let devices = spec["linux"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0]["path"], "/dev/nvidia3");
        assert_eq!(spec["linux"]["resources"]["devices"], json!([rule(3)]));
        assert_eq!(
            spec["process"]["env"],
            json!(["NVIDIA_VISIBLE_DEVICES=GPU-3"])
        );
    }

    /// A container given MIG instance 0:2 that brought another instance's capability
    /// nodes itself (`--device /dev/nvidia-caps/nvidia-cap21`, a rule for them) loses
    /// them: with GPU 0's node, which it gets, they would open instance 0:0 as well.
    #[test]
    fn another_instances_capability_nodes_that_came_with_the_spec_are_taken_out() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let own = inv.find_mig("0:2").unwrap().uuid.clone();
        let record = crate::state::ledger::testing::record("c1", &[own.as_str()]);
        let edits = ContainerEdits::gpus_of(&inv, &record);
        let cap = |minor: u32| json!({"path": format!("/dev/nvidia-caps/nvidia-cap{minor}"), "type": "c", "major": 511, "minor": minor});
        let rule = |minor: u32| json!({"allow": true, "type": "c", "major": 511, "minor": minor, "access": "rw"});
        let mut spec = json!({
            "linux": {"devices": [cap(21), cap(22)], "resources": {"devices": [rule(21), rule(22)]}},
        });
        apply(&edits, &mut spec).unwrap();
        let paths: Vec<&str> = spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
        assert!(
            !paths
                .iter()
                .any(|p| p.ends_with("cap21") || p.ends_with("cap22")),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"/dev/nvidia-caps/nvidia-cap84"),
            "{paths:?}"
        );
        let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
        assert!(
            !rules.iter().any(|r| r["major"] == 511
                && (r["minor"] == 21 || r["minor"] == 22)
                && r["allow"] == true),
            "{rules:?}"
        );
        // A rule for every capability node (c 511:*) would admit the others: refused.
        let mut wide = json!({"linux": {"resources": {"devices": [{"allow": true, "type": "c", "major": 511, "access": "rw"}]}}});
        assert!(matches!(
            apply(&edits, &mut wide).unwrap_err(),
            ApplyError::Foreign(_)
        ));
    }

    #[test]
    fn a_wildcard_rule_is_refused_by_the_spec_writer() {
        let mut spec =
            json!({"linux": {"resources": {"devices": [{"allow": true, "access": "rwm"}]}}});
        let err = apply(&edits(), &mut spec).unwrap_err();
        assert!(matches!(err, ApplyError::Foreign(_)), "{err}");
    }
}
