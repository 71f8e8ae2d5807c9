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
use crate::admission::foreign::{self, GpuNumbers};
use crate::host::inventory::InventoryError;
use crate::input::config::{Config, Unrequested};
use crate::input::request::{self, RequestError};
use crate::model::gpu::DeviceNode;
use crate::model::holder::{ContainerInfo, HolderId, HolderKind};
use crate::model::nvidia::{CDI_GPU_PREFIX, VISIBLE_DEVICES};
use crate::state::ledger::{ClaimError, ClaimToken, HolderMeta, LedgerError, Record};
use serde_json::{Value, json};
use std::collections::HashMap;

/// The source of the records this plugin makes (`gpupin status`, the audit log).
pub(crate) const SOURCE: &str = "nri";

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
    /// The device nodes it has already: (path, type, major, minor).
    pub devices: Vec<(&'a str, &'a str, i64, i64)>,
    /// CDI devices the runtime lists for the container. NRI lists none that another
    /// plugin adds: those of NVIDIA's plugin are read from the pod's annotations
    /// (`nvidia_plugin_devices`).
    pub cdi_devices: Vec<&'a str>,
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
    /// Nodes of GPUs the container was not given that it came with: taken out where
    /// another plugin added them, and denied in its device cgroup (NRI takes no node out
    /// that the runtime put there: the node stays, and cannot be opened).
    pub remove_devices: Vec<DeviceNode>,
    /// Annotations taken out (NVIDIA's CDI requests of a stripped container).
    pub remove_annotations: Vec<String>,
    pub env: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub hooks: Vec<Hook>,
    pub mounts: Vec<Mount>,
    /// CDI devices the runtime applies (`driver = "cdi"`: the driver's spec, by name).
    pub cdi_devices: Vec<String>,
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
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error("container id {0:?} cannot name a holder: expected letters, digits, '_', '.' or '-'")]
    Id(String),
    /// dockerd's NRI (experimental in Docker 29, moby v2) applies only env and mounts
    /// from a plugin and sends no stop or remove: what gpupin must give a container
    /// (nodes, the claim's annotations, the hooks that bind and release it) it refuses.
    #[error(
        "runtime {0:?} is dockerd, whose NRI applies no device nodes, hooks or annotations from a plugin and sends no stop or remove, so gpupin nri cannot give its containers GPUs: give Docker's containers their GPUs through gpupin's runtime (gpupin install docker) and take gpupin out of dockerd's NRI plugins"
    )]
    Dockerd(String),
    #[error(
        "CDI device {0:?} names no GPU gpupin can tell: expected nvidia.com/gpu=INDEX, =GPU-<uuid> or =all"
    )]
    CdiName(String),
}

/// An edit NRI has no way to make.
#[derive(Debug, thiserror::Error)]
#[error(
    "the driver's CDI spec adds groups {gids:?} to the process, which NRI cannot: use driver = \"legacy\" with gpupin nri"
)]
pub struct Unadjustable {
    gids: Vec<u32>,
}

/// Where `create` finds a request: the container's annotations over its pod's, its env,
/// then the GPUs NVIDIA's stack was asked for around gpupin (`foreign`), read from the
/// container as a spec (`as_spec`).
struct NriSources<'a> {
    annotations: HashMap<String, String>,
    env: &'a [String],
    spec: &'a Value,
    config: &'a Config,
}

impl request::Sources for NriSources<'_> {
    type Error = NriError;
    fn annotations(&self) -> &HashMap<String, String> {
        &self.annotations
    }
    fn env(&mut self) -> Result<Vec<String>, NriError> {
        Ok(self.env.to_vec())
    }
    fn foreign(&mut self) -> Result<Option<request::GpuRequest>, NriError> {
        let config = self.config;
        if foreign::has_char_devices(self.spec) {
            let inventory = config.load_inventory()?;
            let minors = foreign::gpu_minors(self.spec, &GpuNumbers::of(&inventory));
            if !minors.is_empty() {
                // NRI takes no node out of a container (only out of what other plugins
                // add): the GPUs it came with are the ones it gets, if no one holds them.
                let indices = inventory
                    .gpus
                    .iter()
                    .filter(|g| minors.contains(&g.minor))
                    .map(|g| g.index.to_string())
                    .collect();
                return Ok(Some(request::GpuRequest::new(
                    request::Selection::Devices(indices),
                    request::Origin::Nvidia,
                )));
            }
        }
        foreign::request(self.spec, config.unrequested, || {
            Ok(GpuNumbers::of(&config.load_inventory()?))
        })
    }
}

/// The annotation domain of NVIDIA's NRI plugin (the toolkit's, started by its installer
/// with `--enable-nri-plugin`): it injects the CDI devices a pod names there.
const NVIDIA_PLUGIN_DOMAIN: &str = "nvidia.cdi.k8s.io";

/// The CDI devices NVIDIA's NRI plugin injects into `created`, from its pod's annotations
/// as that plugin reads them: `nvidia.cdi.k8s.io/container.<name>`, else
/// `nvidia.cdi.k8s.io/pod`, else `nvidia.cdi.k8s.io`, a comma-separated list.
///
/// Read here, not from the container: NRI gives no plugin the CDI devices another added
/// (they are resolved by the runtime after every plugin answered), so whatever gpupin's
/// index, NVIDIA's plugin would hand out these GPUs around the ledger unseen. Each must
/// be a name gpupin can tell (`nvidia.com/gpu=INDEX|GPU-<uuid>|all`); any other (a MIG
/// instance, `management.nvidia.com/gpu=all`, which is every GPU) is refused.
fn nvidia_plugin_devices<'a>(created: &Created<'a>) -> Result<Vec<&'a str>, NriError> {
    let Some(annotations) = created.pod_annotations else {
        return Ok(Vec::new());
    };
    let keys = [
        format!("{NVIDIA_PLUGIN_DOMAIN}/container.{}", created.name),
        format!("{NVIDIA_PLUGIN_DOMAIN}/pod"),
        NVIDIA_PLUGIN_DOMAIN.to_string(),
    ];
    let Some(value) = keys.iter().find_map(|k| annotations.get(k)) else {
        return Ok(Vec::new());
    };
    let names: Vec<&str> = value.split(',').map(str::trim).collect();
    match names.iter().find(|n| !n.starts_with(CDI_GPU_PREFIX)) {
        Some(unknown) => Err(NriError::CdiName(unknown.to_string())),
        None => Ok(names),
    }
}

/// The GPUs NVIDIA's CDI devices among `names` ask for (`nvidia.com/gpu=<index>`,
/// `=<uuid>`, `=all`), as a request for exactly those; `None` where none does.
fn nvidia_cdi(names: &[&str]) -> Result<Option<request::GpuRequest>, NriError> {
    let wanted: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix(CDI_GPU_PREFIX))
        .collect();
    if wanted.is_empty() {
        return Ok(None);
    }
    let selection = if wanted.contains(&"all") {
        request::Selection::All
    } else {
        let mut devices = Vec::new();
        for entry in &wanted {
            let known = entry.parse::<u32>().is_ok() || entry.starts_with("GPU-");
            if !known {
                return Err(NriError::CdiName(format!("{CDI_GPU_PREFIX}{entry}")));
            }
            devices.push(entry.to_string());
        }
        request::Selection::Devices(devices)
    };
    Ok(Some(request::GpuRequest::new(
        selection,
        request::Origin::Nvidia,
    )))
}

/// The minors of the GPUs `selection` (from NVIDIA's CDI names) names.
fn named_gpus(config: &Config, selection: &request::Selection) -> Result<Vec<u32>, NriError> {
    let inventory = config.load_inventory()?;
    Ok(inventory
        .gpus
        .iter()
        .filter(|g| match selection {
            request::Selection::All => true,
            request::Selection::Devices(names) => names
                .iter()
                .any(|n| *n == g.index.to_string() || *n == g.uuid),
            request::Selection::Count(_) => false,
        })
        .map(|g| g.minor)
        .collect())
}

/// The container as much of an OCI spec as the rules on GPUs that came around gpupin read
/// (`admission::foreign`): its env, device nodes and annotations.
fn as_spec(created: &Created<'_>, annotations: &HashMap<String, String>) -> Value {
    let devices: Vec<Value> = created
        .devices
        .iter()
        .map(|(path, kind, major, minor)| json!({"path": path, "type": kind, "major": major, "minor": minor}))
        .collect();
    json!({
        "process": {"env": created.env},
        "linux": {"devices": devices},
        "annotations": annotations,
    })
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

/// Whether gpupin nri can serve the runtime that named itself `runtime` at Configure:
/// not dockerd (`docker`), whose NRI cannot carry a grant (`NriError::Dockerd`).
pub fn serves(runtime: &str) -> Result<(), NriError> {
    match runtime {
        "docker" => Err(NriError::Dockerd(runtime.to_string())),
        _ => Ok(()),
    }
}

/// What `create` did.
#[derive(Debug)]
pub enum Outcome {
    /// The container asks for no GPU and came with none.
    Nothing,
    /// It asks gpupin for none, and what it asked NVIDIA's stack for is voided
    /// (`unrequested = "strip"`).
    Stripped(Adjustment),
    /// Its GPUs, held (boxed: a record is large beside the other answers).
    Admitted(Box<Record>, Adjustment),
}

/// Admits `created`'s request, if it has one; else voids what it asked NVIDIA's stack
/// for around gpupin, as `unrequested` says.
pub fn create(
    config: &Config,
    hook: &HookCommand,
    created: &Created<'_>,
) -> Result<Outcome, NriError> {
    let annotations = merged(created);
    let spec = as_spec(created, created.annotations.unwrap_or(&HashMap::new()));
    let mut sources = NriSources {
        annotations,
        env: created.env,
        spec: &spec,
        config,
    };
    let injected = nvidia_plugin_devices(created)?;
    let mut cdi_names = created.cdi_devices.clone();
    cdi_names.extend(injected.iter().copied());
    let named = nvidia_cdi(&cdi_names)?;
    let found = request::find(&mut sources)?;
    // NRI takes no CDI device out of a container: the GPUs NVIDIA's name are its request
    // (they are those of the nodes it came with, where the CRI's CDI made them), and
    // beside a request of its own they are denied (`adjustment`).
    let found = match (found, &named) {
        (Some(own), _) if own.origin != request::Origin::Nvidia => Some(own),
        (_, Some(named)) => Some(named.clone()),
        (found, None) => found,
    };
    // The minors of the GPUs named, to deny those not given.
    let named_minors: Vec<u32> = match &named {
        Some(named) => named_gpus(config, &named.selection)?,
        None => Vec::new(),
    };
    let Some(mut found) = found else {
        return Ok(match stripped(config, &spec)? {
            Some(adjustment) => Outcome::Stripped(adjustment),
            None => Outcome::Nothing,
        });
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
            driver_by_name: true,
        }),
        slurm_job: request::slurm_job(created.env),
        labels: sources.annotations,
    };
    let (record, adjustment) = admit::admit(config, admission, |edits| {
        adjustment(edits, &created.devices, &named_minors, &injected)
    })?;
    Ok(Outcome::Admitted(Box::new(record), adjustment))
}

/// `unrequested = "strip"` for a container that asks gpupin for nothing: what `void`
/// changes in its spec, as an adjustment (`NVIDIA_VISIBLE_DEVICES=void`, NVIDIA's
/// annotations removed); `None` where it asked NVIDIA's stack for nothing.
fn stripped(config: &Config, spec: &Value) -> Result<Option<Adjustment>, NriError> {
    if config.unrequested != Unrequested::Strip {
        return Ok(None);
    }
    let mut voided = spec.clone();
    if !foreign::void(&mut voided) {
        return Ok(None);
    }
    let mut adjustment = Adjustment::default();
    let env = |spec: &Value| spec["process"]["env"].clone();
    if env(&voided) != env(spec) {
        adjustment
            .env
            .push((VISIBLE_DEVICES.to_string(), "void".to_string()));
    }
    if let (Some(before), Some(after)) = (
        spec["annotations"].as_object(),
        voided["annotations"].as_object(),
    ) {
        adjustment.remove_annotations = before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .cloned()
            .collect();
    }
    Ok(Some(adjustment))
}

/// The edits as NRI applies them; `has`, the device nodes the container came with;
/// `injected`, the CDI devices NVIDIA's plugin adds (NRI refuses a create where two
/// plugins add the same CDI device, so gpupin leaves those to it).
fn adjustment(
    edits: &ContainerEdits,
    has: &[(&str, &str, i64, i64)],
    named_minors: &[u32],
    injected: &[&str],
) -> Result<Adjustment, Unadjustable> {
    if !edits.additional_gids.is_empty() {
        return Err(Unadjustable {
            gids: edits.additional_gids.clone(),
        });
    }
    // By number: a node keeps its device whatever its path in the container.
    let mut remove_devices: Vec<DeviceNode> = has
        .iter()
        .filter(|(_, kind, major, minor)| {
            *kind == "c"
                && edits
                    .withheld
                    .iter()
                    .any(|w| i64::from(w.major) == *major && i64::from(w.minor) == *minor)
        })
        .map(|(path, _, major, minor)| DeviceNode {
            path: path.to_string(),
            major: *major as u32,
            minor: *minor as u32,
        })
        .collect();
    // GPUs CDI devices name that it was not given: their nodes come after gpupin's answer.
    for withheld in &edits.withheld {
        let named = named_minors.contains(&withheld.minor);
        let listed = remove_devices
            .iter()
            .any(|d| (d.major, d.minor) == (withheld.major, withheld.minor));
        if named && !listed {
            remove_devices.push(withheld.clone());
        }
    }
    Ok(Adjustment {
        devices: edits.nodes.clone(),
        remove_devices,
        env: edits.env.clone(),
        annotations: edits.annotations.clone(),
        hooks: edits.hooks.clone(),
        mounts: edits.mounts.clone(),
        cdi_devices: edits
            .cdi_devices
            .iter()
            .filter(|name| !injected.contains(&name.as_str()))
            .cloned()
            .collect(),
        ..Adjustment::default()
    })
}

/// Releases the GPUs container `id` holds, if it holds any (as poststop does: one lstat
/// when it holds nothing, and never a record of that name that is no container's).
pub fn release(config: &Config, id: &str) -> Result<Option<Record>, NriError> {
    let Ok(holder) = HolderId::new(id) else {
        return Ok(None);
    };
    let ledger = crate::state::open_ledger(config)?;
    if !ledger.holds(&holder) {
        return Ok(None);
    }
    Ok(ledger.release_container(&holder)?)
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

    impl Outcome {
        fn admitted(self) -> (Record, Adjustment) {
            match self {
                Outcome::Admitted(record, adjustment) => (*record, adjustment),
                other => panic!("not admitted: {other:?}"),
            }
        }
    }

    use crate::input::config::testing::sim8_in as config;

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
            .admitted();
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
        let (record, _) = create(&config, &hook(), &from_pod).unwrap().admitted();
        assert_eq!(record.gpus.len(), 1);
        let three = asks(&[("gpupin.count", "3")]);
        let own = Created {
            pod_annotations: Some(&pod),
            ..created("c2", &three)
        };
        let (record, _) = create(&config, &hook(), &own).unwrap().admitted();
        assert_eq!(record.gpus.len(), 3);
        // `gpupin.containers` on the pod names the containers its request is for.
        let for_others = asks(&[("gpupin.count", "1"), ("gpupin.containers", "trainer")]);
        let not_named = Created {
            pod_annotations: Some(&for_others),
            ..created("c3", &none)
        };
        assert!(matches!(
            create(&config, &hook(), &not_named).unwrap(),
            Outcome::Nothing
        ));
        assert_eq!(ids(&config), ["c1", "c2"]);
    }

    #[test]
    fn nothing_is_held_for_a_container_that_asks_for_nothing_or_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let none = HashMap::new();
        let outcome = create(&config, &hook(), &created("c1", &none)).unwrap();
        assert!(matches!(outcome, Outcome::Nothing), "{outcome:?}");
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

    /// GPU nodes a container came with (containerd's own CDI, a `--device`), asking
    /// gpupin for nothing: NRI cannot take them out, so those GPUs are its request; one
    /// another holds is refused, naming the holder, and nothing is held.
    #[test]
    fn gpu_nodes_a_container_came_with_are_its_request() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        crate::jobs::hold::testing::roots(&config, "taken", "3");
        let none = HashMap::new();
        // A node's path in the container need not be the host's.
        let came_with = |id, minor| Created {
            devices: vec![
                ("/dev/gpu-from-cdi", "c", 195, minor),
                ("/dev/nvidiactl", "c", 195, 255),
            ],
            ..created(id, &none)
        };
        let (record, adjustment) = create(&config, &hook(), &came_with("c1", 2))
            .unwrap()
            .admitted();
        assert_eq!(record.indices, [2]);
        assert_eq!(adjustment.remove_devices, Vec::<DeviceNode>::new());
        let err = create(&config, &hook(), &came_with("c2", 3)).unwrap_err();
        assert!(err.to_string().contains("taken"), "{err}");
        assert_eq!(ids(&config), ["c1", "taken"]);
    }

    /// `unrequested = "strip"` (the default): NVIDIA_VISIBLE_DEVICES becomes `void` and
    /// NVIDIA's CDI annotations go; nothing is held. `pass` leaves them.
    #[test]
    fn what_a_container_asked_nvidias_stack_for_around_gpupin_is_voided() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let cdi = asks(&[("cdi.k8s.io/gpu", "nvidia.com/gpu=1"), ("team", "ml")]);
        let env = vec!["NVIDIA_VISIBLE_DEVICES=all".to_string(), "A=1".to_string()];
        let around = Created {
            env: &env,
            ..created("c1", &cdi)
        };
        let Outcome::Stripped(adjustment) = create(&config, &hook(), &around).unwrap() else {
            panic!("not stripped");
        };
        assert_eq!(
            adjustment.env,
            [("NVIDIA_VISIBLE_DEVICES".to_string(), "void".to_string())]
        );
        assert_eq!(adjustment.remove_annotations, ["cdi.k8s.io/gpu"]);
        assert_eq!(ids(&config), Vec::<String>::new());
        let pass = Config {
            unrequested: Unrequested::Pass,
            ..config.clone()
        };
        assert!(matches!(
            create(&pass, &hook(), &around).unwrap(),
            Outcome::Nothing
        ));
        let plain = vec!["A=1".to_string()];
        let none = HashMap::new();
        let asks_nothing = Created {
            env: &plain,
            ..created("c2", &none)
        };
        assert!(matches!(
            create(&config, &hook(), &asks_nothing).unwrap(),
            Outcome::Nothing
        ));
    }

    /// CDI devices the runtime lists for the container: containerd will apply them, so
    /// they are the request, held; beside a request of the container's own, denied; a
    /// name gpupin cannot tell is refused.
    #[test]
    fn nvidias_cdi_devices_the_runtime_lists_are_held_or_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let none = HashMap::new();
        let named = |id, names: Vec<&'static str>| Created {
            cdi_devices: names,
            ..created(id, &none)
        };
        let (record, _) = create(
            &config,
            &hook(),
            &named("c1", vec!["nvidia.com/gpu=3", "other.com/x=1"]),
        )
        .unwrap()
        .admitted();
        assert_eq!(record.indices, [3]);
        let err = create(&config, &hook(), &named("c2", vec!["nvidia.com/gpu=3"])).unwrap_err();
        assert!(err.to_string().contains("it is held by"), "{err}");
        let err = create(&config, &hook(), &named("c3", vec!["nvidia.com/gpu=0:1"])).unwrap_err();
        assert!(err.to_string().contains("nvidia.com/gpu=0:1"), "{err}");
        let two = asks(&[("gpupin.count", "2")]);
        let both = Created {
            cdi_devices: vec!["nvidia.com/gpu=5"],
            ..created("c4", &two)
        };
        let (record, adjustment) = create(&config, &hook(), &both).unwrap().admitted();
        assert_eq!(record.indices.len(), 2);
        assert!(!record.indices.contains(&5), "{record:?}");
        let denied: Vec<u32> = adjustment.remove_devices.iter().map(|d| d.minor).collect();
        assert_eq!(denied, [5]);
        assert!(matches!(
            create(&config, &hook(), &named("c5", vec!["other.com/x=1"])).unwrap(),
            Outcome::Nothing
        ));
        assert_eq!(ids(&config), ["c1", "c4"]);
    }

    /// NVIDIA's NRI plugin injects the CDI devices of the pod's `nvidia.cdi.k8s.io`
    /// annotations, which NRI never shows gpupin: read as that plugin reads them (the
    /// container's key over the pod's over the bare domain), they are the container's
    /// request whatever the plugins' order; a name gpupin cannot tell (every GPU's
    /// management device, a MIG instance) is refused; under `driver = "cdi"` gpupin does
    /// not add a CDI device NVIDIA's plugin adds (NRI fails a create where two do).
    #[test]
    fn what_nvidias_nri_plugin_will_inject_is_the_containers_request() {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = config(tmp.path());
        let none = HashMap::new();
        let in_pod = |id, pod: &'static HashMap<String, String>| Created {
            pod_annotations: Some(pod),
            ..created(id, &none)
        };
        let leak = |pairs: &[(&str, &str)]| -> &'static HashMap<String, String> {
            Box::leak(Box::new(asks(pairs)))
        };
        let keyed = leak(&[
            (
                "nvidia.cdi.k8s.io/container.main",
                "nvidia.com/gpu=1,nvidia.com/gpu=2",
            ),
            ("nvidia.cdi.k8s.io/container.other", "nvidia.com/gpu=5"),
            ("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=6"),
        ]);
        let (record, _) = create(&config, &hook(), &in_pod("c1", keyed))
            .unwrap()
            .admitted();
        assert_eq!(record.indices, [1, 2]);
        let (record, _) = create(
            &config,
            &hook(),
            &in_pod("c2", leak(&[("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=3")])),
        )
        .unwrap()
        .admitted();
        assert_eq!(record.indices, [3]);
        let (record, _) = create(
            &config,
            &hook(),
            &in_pod("c3", leak(&[("nvidia.cdi.k8s.io", "nvidia.com/gpu=4")])),
        )
        .unwrap()
        .admitted();
        assert_eq!(record.indices, [4]);
        let err = create(
            &config,
            &hook(),
            &in_pod("c4", leak(&[("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=2")])),
        )
        .unwrap_err();
        assert!(err.to_string().contains("it is held by"), "{err}");
        let management = leak(&[(
            "nvidia.cdi.k8s.io/pod",
            "nvidia.com/gpu=0,management.nvidia.com/gpu=all",
        )]);
        let err = create(&config, &hook(), &in_pod("c5", management)).unwrap_err();
        assert!(
            err.to_string()
                .contains("\"management.nvidia.com/gpu=all\""),
            "{err}"
        );
        // Other annotations of the domain's shape are not NVIDIA's plugin's.
        let unrelated = leak(&[("nvidia.cdi.k8s.io.example/pod", "nvidia.com/gpu=0")]);
        assert!(matches!(
            create(&config, &hook(), &in_pod("c6", unrelated)).unwrap(),
            Outcome::Nothing
        ));
        assert_eq!(ids(&config), ["c1", "c2", "c3"]);

        // driver = "cdi": gpupin names GPU 7's CDI device by its UUID, as NVIDIA's
        // annotation does here.
        let uuid = config.load_inventory().unwrap().gpus[7].uuid.clone();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("nvidia.yaml"),
            format!(
                "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: {uuid}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia7\n"
            ),
        )
        .unwrap();
        config.driver = crate::input::config::Driver::Cdi;
        config.cdi_spec_dirs = vec![dir];
        let name = format!("nvidia.com/gpu={uuid}");
        let by_name = leak(&[("nvidia.cdi.k8s.io/pod", &name)]);
        let (record, adjustment) = create(&config, &hook(), &in_pod("c7", by_name))
            .unwrap()
            .admitted();
        assert_eq!(record.indices, [7]);
        assert_eq!(adjustment.cdi_devices, Vec::<String>::new());
        // Without NVIDIA's annotation the same grant names it.
        let ask = asks(&[("gpupin.devices", "7")]);
        release(&config, "c7").unwrap();
        let (_, adjustment) = create(&config, &hook(), &created("c8", &ask))
            .unwrap()
            .admitted();
        assert_eq!(adjustment.cdi_devices, [name]);
    }

    #[test]
    fn dockerds_nri_is_not_served_and_the_refusal_says_what_to_use() {
        for runtime in ["containerd", "cri-o", ""] {
            assert!(serves(runtime).is_ok(), "{runtime}");
        }
        let line = serves("docker").unwrap_err().to_string();
        assert!(
            line.starts_with("runtime \"docker\" is dockerd")
                && line.contains("gpupin install docker"),
            "{line}"
        );
    }

    #[test]
    fn gpus_the_container_came_with_that_it_was_not_given_are_taken_out() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let one = asks(&[("gpupin.devices", "0")]);
        let with_others = Created {
            devices: vec![
                ("/dev/nvidia0", "c", 195, 0),
                ("/dev/nvidia5", "c", 195, 5),
                ("/dev/fuse", "c", 10, 229),
            ],
            ..created("c1", &one)
        };
        let (_, adjustment) = create(&config, &hook(), &with_others).unwrap().admitted();
        let removed: Vec<(&str, u32)> = adjustment
            .remove_devices
            .iter()
            .map(|d| (d.path.as_str(), d.minor))
            .collect();
        assert_eq!(removed, [("/dev/nvidia5", 5)]);
    }

    #[test]
    fn release_and_reconcile_touch_only_the_plugins_own_holders() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let one = asks(&[("gpupin.count", "1")]);
        for id in ["c1", "c2", "c3"] {
            create(&config, &hook(), &created(id, &one))
                .unwrap()
                .admitted();
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
