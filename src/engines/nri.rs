//! gpupin as an NRI plugin (`gpupin nri`), without the wire (`gpupin-nri-api` speaks NRI;
//! the command is thin). containerd 2.x and CRI-O call every NRI plugin for every
//! container their CRI creates, whatever runtime handler the pod names, so a node with
//! the plugin needs no RuntimeClass for the ledger to see its pods.
//!
//! - `create`: the container's request (its annotations over its pod's, then its env; a
//!   pod-level request is each container's, as on the runtime-handler path) goes through
//!   the one admission path under a claim named by the container id; the edits become
//!   the adjustment NRI applies: the GPUs' nodes (which the runtime grants in the device
//!   cgroup), the env, the claim's annotations and gpupin's prestart and poststop hooks,
//!   which bind the claim to the container's process and release it, exactly as for a
//!   spec the Docker shim or podman's precreate edited.
//! - `release`: the container stopped or was removed; its GPUs go back (once: the poststop
//!   hook may have released them already).
//! - `reconcile`: on every (re)connection the runtime lists the containers there are; the
//!   holders this plugin made for containers that are gone are released.

use crate::admission::admit::{self, Admission, AdmitError, Claim};
use crate::admission::edits::{self, ContainerEdits, EditsError, Hook, HookCommand, Mount};
use crate::input::config::Config;
use crate::input::request::{self, RequestError};
use crate::model::gpu::DeviceNode;
use crate::model::holder::{ContainerInfo, HolderId, HolderKind};
use crate::state::ledger::{ClaimError, ClaimToken, HolderMeta, LedgerError, Record};
use std::collections::HashMap;

/// The source of the records this plugin makes (`gpupin status`, the audit log).
pub const SOURCE: &str = "nri";

/// What the runtime says of a container it is creating.
#[derive(Debug, Clone, Default)]
pub struct Created<'a> {
    /// The runtime, as it named itself to the plugin (`containerd`, `cri-o`).
    pub runtime: &'a str,
    pub pod_namespace: &'a str,
    pub pod_name: &'a str,
    pub pod_annotations: Option<&'a HashMap<String, String>>,
    pub id: &'a str,
    pub name: &'a str,
    pub annotations: Option<&'a HashMap<String, String>>,
    /// `KEY=VALUE`.
    pub env: &'a [String],
    /// The paths of the device nodes it has already.
    pub devices: Vec<&'a str>,
    /// How long the runtime waits for the plugin's answer (NRI's request timeout): a
    /// request that would wait longer for busy GPUs (`gpupin.wait`) waits half of it,
    /// then is refused. A plugin that answers late is dropped by the runtime, and every
    /// container operation on the node waits for it meanwhile.
    pub budget: std::time::Duration,
}

/// What gpupin changes in a container being created, for the runtime to apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adjustment {
    pub devices: Vec<DeviceNode>,
    /// Nodes of GPUs the container was not given that it came with: taken out.
    pub remove_devices: Vec<String>,
    pub env: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub hooks: Vec<Hook>,
    pub mounts: Vec<Mount>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NriError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Edits(#[from] EditsError),
    #[error(transparent)]
    Admit(#[from] AdmitError<Unadjustable>),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("container id {0:?} cannot name a holder: expected letters, digits, '_', '.' or '-'")]
    Id(String),
}

/// An edit NRI has no way to make.
#[derive(Debug, thiserror::Error)]
#[error(
    "the driver's CDI spec adds groups {gids:?} to the process, which NRI cannot: use driver = \"legacy\" with gpupin nri"
)]
pub struct Unadjustable {
    gids: Vec<u32>,
}

/// Where `create` finds a request: the container's annotations over its pod's, its env.
struct NriSources<'a> {
    annotations: HashMap<String, String>,
    env: &'a [String],
}

impl request::Sources for NriSources<'_> {
    type Error = RequestError;
    fn annotations(&self) -> &HashMap<String, String> {
        &self.annotations
    }
    fn env(&mut self) -> Result<Vec<String>, RequestError> {
        Ok(self.env.to_vec())
    }
}

/// The container's annotations over its pod's, with its name where CRI puts it (so
/// that `gpupin.containers` on the pod picks containers by name).
fn merged(created: &Created<'_>) -> HashMap<String, String> {
    let mut all: HashMap<String, String> = created.pod_annotations.cloned().unwrap_or_default();
    all.extend(created.annotations.cloned().unwrap_or_default());
    all.entry("io.kubernetes.cri.container-name".into())
        .or_insert_with(|| created.name.to_string());
    all
}

/// Admits `created`'s request, if it has one: `None` where it asks for nothing.
pub fn create(
    config: &Config,
    hook: &HookCommand,
    created: &Created<'_>,
) -> Result<Option<(Record, Adjustment)>, NriError> {
    let annotations = merged(created);
    let mut sources = NriSources {
        annotations,
        env: created.env,
    };
    let Some(mut found) = request::find(&mut sources)? else {
        return Ok(None);
    };
    found.wait = found.wait.map(|wait| wait.min(created.budget / 2));
    // Annotations only gpupin writes, set by the pod's author, would be taken for
    // gpupin's own by the hook that binds the claim.
    edits::refuse_reserved(&sources.annotations)?;
    let holder = HolderId::new(created.id).map_err(|_| NriError::Id(created.id.to_string()))?;
    let token = ClaimToken::new(holder.clone())?;
    let name = [created.pod_namespace, created.pod_name, created.name]
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/");
    let meta = HolderMeta {
        source: SOURCE.into(),
        kind: HolderKind::Container,
        container: Some(ContainerInfo {
            engine: crate::engines::engine::clean(created.runtime),
            name: crate::engines::engine::clean(&name),
            image: None,
        }),
        ..HolderMeta::default()
    };
    let admission = Admission {
        holder: &holder,
        request: &found,
        meta,
        claim: Some(Claim {
            token: &token,
            hook,
        }),
        slurm_job: request::slurm_job(created.env),
        labels: sources.annotations,
    };
    let (record, adjustment) = admit::admit(config, admission, |edits| {
        adjustment(edits, &created.devices)
    })?;
    Ok(Some((record, adjustment)))
}

/// The edits as NRI applies them.
fn adjustment(edits: &ContainerEdits, has: &[&str]) -> Result<Adjustment, Unadjustable> {
    if !edits.additional_gids.is_empty() {
        return Err(Unadjustable {
            gids: edits.additional_gids.clone(),
        });
    }
    Ok(Adjustment {
        devices: edits.nodes.clone(),
        remove_devices: edits
            .withheld
            .iter()
            .filter(|node| has.contains(&node.path.as_str()))
            .map(|node| node.path.clone())
            .collect(),
        env: edits.env.clone(),
        annotations: edits.annotations.clone(),
        hooks: edits.hooks.clone(),
        mounts: edits.mounts.clone(),
    })
}

/// Releases the GPUs this plugin gave container `id`, if it still holds them.
pub fn release(config: &Config, id: &str) -> Result<Option<Record>, NriError> {
    let Ok(holder) = HolderId::new(id) else {
        return Ok(None);
    };
    let ledger = crate::state::open_ledger(config)?;
    let ours = ledger
        .records()?
        .into_iter()
        .any(|r| r.id == id && r.source == SOURCE);
    if !ours {
        return Ok(None);
    }
    Ok(ledger.release(&holder)?)
}

/// Releases the holders this plugin made for containers `running` does not know (gone
/// while the plugin was away); the records released.
pub fn reconcile(config: &Config, running: impl Fn(&str) -> bool) -> Result<Vec<Record>, NriError> {
    let ledger = crate::state::open_ledger(config)?;
    let mut released = Vec::new();
    for record in ledger.records()? {
        if record.source != SOURCE || running(&record.id) {
            continue;
        }
        let Ok(holder) = HolderId::new(&record.id) else {
            continue;
        };
        released.extend(ledger.release(&holder)?);
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(state_dir: &Path) -> Config {
        Config {
            state_dir: state_dir.to_path_buf(),
            inventory: "sim:nvswitch8".parse().unwrap(),
            audit_log: state_dir.join("audit.log"),
            ..Config::default()
        }
    }

    fn hook() -> HookCommand {
        HookCommand::beside(Path::new("/usr/bin/gpupin"), None)
    }

    /// Container `id` of pod `default/pod` with these annotations (the pod's none).
    fn created<'a>(id: &'a str, annotations: &'a HashMap<String, String>) -> Created<'a> {
        Created {
            runtime: "containerd",
            pod_namespace: "default",
            pod_name: "pod",
            id,
            name: "main",
            annotations: Some(annotations),
            budget: std::time::Duration::from_secs(2),
            ..Created::default()
        }
    }

    fn asks(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ids(config: &Config) -> Vec<String> {
        let ledger = crate::state::open_ledger(config).unwrap();
        let mut ids: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_request_is_held_under_a_claim_with_the_hooks_that_bind_and_release_it() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let two = asks(&[("gpupin.count", "2")]);
        let (record, adjustment) = create(&config, &hook(), &created("c1", &two))
            .unwrap()
            .unwrap();
        assert_eq!(record.gpus.len(), 2);
        assert_eq!(record.source, SOURCE);
        assert!(
            record.claim_digest.is_some(),
            "held under a claim: {record:?}"
        );
        let info = record.container.unwrap();
        assert_eq!(info.name.as_deref(), Some("default/pod/main"));
        assert_eq!(info.engine.as_deref(), Some("containerd"));
        let stages: Vec<&str> = adjustment.hooks.iter().map(|h| h.stage).collect();
        assert_eq!(stages, ["prestart", "poststop"]);
        assert!(adjustment.hooks[0].args.contains(&"prestart".to_string()));
        let gpu_nodes = adjustment
            .devices
            .iter()
            .filter(|d| d.path.starts_with("/dev/nvidia") && d.path[11..].parse::<u32>().is_ok())
            .count();
        assert_eq!(gpu_nodes, 2, "{:?}", adjustment.devices);
        let visible = adjustment
            .env
            .iter()
            .find(|(k, _)| k == "NVIDIA_VISIBLE_DEVICES")
            .map(|(_, v)| v.clone());
        assert_eq!(visible, Some(record.gpus.join(",")));
        assert!(
            adjustment
                .annotations
                .iter()
                .any(|(k, _)| k == "gpupin.claim"),
            "{:?}",
            adjustment.annotations
        );
    }

    #[test]
    fn the_pods_request_is_each_containers_and_the_containers_own_comes_first() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let pod = asks(&[("gpupin.count", "1")]);
        let none = HashMap::new();
        let from_pod = Created {
            pod_annotations: Some(&pod),
            ..created("c1", &none)
        };
        let (record, _) = create(&config, &hook(), &from_pod).unwrap().unwrap();
        assert_eq!(record.gpus.len(), 1);
        let three = asks(&[("gpupin.count", "3")]);
        let own = Created {
            pod_annotations: Some(&pod),
            ..created("c2", &three)
        };
        let (record, _) = create(&config, &hook(), &own).unwrap().unwrap();
        assert_eq!(record.gpus.len(), 3);
        // `gpupin.containers` on the pod names the containers its request is for.
        let for_others = asks(&[("gpupin.count", "1"), ("gpupin.containers", "trainer")]);
        let not_named = Created {
            pod_annotations: Some(&for_others),
            ..created("c3", &none)
        };
        assert!(create(&config, &hook(), &not_named).unwrap().is_none());
        assert_eq!(ids(&config), ["c1", "c2"]);
    }

    #[test]
    fn nothing_is_held_for_a_container_that_asks_for_nothing_or_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let none = HashMap::new();
        assert!(
            create(&config, &hook(), &created("c1", &none))
                .unwrap()
                .is_none()
        );
        let nine = asks(&[("gpupin.count", "9")]);
        let err = create(&config, &hook(), &created("c2", &nine)).unwrap_err();
        assert!(err.to_string().contains("count 9"), "{err}");
        // A claim annotation its author wrote would be taken for gpupin's own.
        let forged = asks(&[("gpupin.count", "1"), ("gpupin.claim", "c9:00")]);
        let err = create(&config, &hook(), &created("c3", &forged)).unwrap_err();
        assert!(err.to_string().contains("gpupin.claim"), "{err}");
        assert_eq!(ids(&config), Vec::<String>::new());
    }

    /// NRI gives a plugin 2 s an answer: a request that may wait for busy GPUs waits 1 s
    /// of it, then is refused with the ledger's line, and holds nothing.
    #[test]
    fn a_request_that_would_wait_longer_than_nri_allows_waits_half_of_it() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        crate::jobs::hold::testing::roots(&config, "all", "0,1,2,3,4,5,6,7");
        let waits = asks(&[("gpupin.count", "1"), ("gpupin.wait", "10m")]);
        let err = create(&config, &hook(), &created("c1", &waits)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("gave up waiting for GPUs for c1 after 1s: "),
            "{err}"
        );
        assert_eq!(ids(&config), ["all"]);
    }

    #[test]
    fn gpus_the_container_came_with_that_it_was_not_given_are_taken_out() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let one = asks(&[("gpupin.devices", "0")]);
        let with_others = Created {
            devices: vec!["/dev/nvidia0", "/dev/nvidia5", "/dev/fuse"],
            ..created("c1", &one)
        };
        let (_, adjustment) = create(&config, &hook(), &with_others).unwrap().unwrap();
        assert_eq!(adjustment.remove_devices, ["/dev/nvidia5"]);
    }

    #[test]
    fn release_and_reconcile_touch_only_the_plugins_own_holders() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let one = asks(&[("gpupin.count", "1")]);
        for id in ["c1", "c2", "c3"] {
            create(&config, &hook(), &created(id, &one))
                .unwrap()
                .unwrap();
        }
        crate::jobs::hold::testing::roots(&config, "maintenance", "7");
        assert!(
            release(&config, "maintenance").unwrap().is_none(),
            "not the plugin's"
        );
        assert_eq!(release(&config, "c1").unwrap().unwrap().id, "c1");
        assert!(release(&config, "c1").unwrap().is_none(), "released once");
        // The runtime lists c3 alone: c2 went while the plugin was away.
        let released = reconcile(&config, |id| id == "c3").unwrap();
        assert_eq!(
            released.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["c2"]
        );
        assert_eq!(ids(&config), ["c3", "maintenance"]);
    }
}
