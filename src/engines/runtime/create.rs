//! `create` under gpupin-runtime: find the request, admit, write the edited spec.

use super::ShimError;
use crate::admission::before_create::{self, BeforeCreate, EngineSources, SpecSources};
use crate::admission::edits::HookCommand;
use crate::admission::spec;
use crate::engines::docker::{self, DockerContainer};
use crate::engines::engine;
use crate::input::config::Config;
use crate::input::request::{self, GpuRequest};
use crate::model::holder::{ContainerInfo, HolderId};
use crate::state::ledger::{ClaimToken, HolderMeta, Record};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What Docker adds to the spec's sources (`before_create::SpecSources`): its labels and
/// `--gpus` request in the container's folder, when the spec shows one.
struct DockerSources {
    dir: Option<PathBuf>,
    /// config.v2.json, once read (for the labels, or for `container_info`).
    container: Option<DockerContainer>,
}

impl DockerSources {
    /// The Docker container's config.v2.json, read at most once per create.
    fn docker(&mut self) -> Result<Option<&DockerContainer>, ShimError> {
        if let (None, Some(dir)) = (&self.container, &self.dir) {
            self.container = Some(DockerContainer::read(dir)?);
        }
        Ok(self.container.as_ref())
    }

    /// The Docker container's labels (none outside Docker): a spawner's, where the
    /// config trusts one to name the user.
    fn docker_labels(&mut self) -> Result<HashMap<String, String>, ShimError> {
        Ok(self
            .docker()?
            .map(DockerContainer::labels)
            .unwrap_or_default())
    }

    /// What the engine tells about the container: Docker's folder, else the spec's
    /// annotations, else the runtime root containerd gives runc. config.v2.json that
    /// cannot be read leaves only the engine: it labels the holder, it decides nothing.
    fn container_info(
        &mut self,
        annotations: &HashMap<String, String>,
        runc_root: Option<&Path>,
    ) -> Option<ContainerInfo> {
        if self.dir.is_some() {
            return Some(match self.docker() {
                Ok(docker) => docker.map(DockerContainer::info).unwrap_or_default(),
                Err(err) => {
                    tracing::warn!(error = %crate::base::message::one_line(&err), "no container name");
                    engine::engine_only(engine::DOCKER)
                }
            });
        }
        let containerd = runc_root.is_some_and(engine::is_containerd_root);
        match engine::from_annotations(annotations) {
            Some(info) => Some(info),
            None if containerd => Some(engine::engine_only(engine::CONTAINERD)),
            None => None,
        }
    }
}

impl EngineSources for DockerSources {
    type Error = ShimError;
    fn labels(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        match self.docker()? {
            Some(docker) => Ok(docker.label_request()?),
            None => Ok(None),
        }
    }
    fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        match &self.dir {
            Some(dir) => Ok(docker::gpus_request(dir)?),
            None => Ok(None),
        }
    }
}

/// Allocates for a container that asks for GPUs and rewrites its spec. `None`: the
/// container asked gpupin for nothing; its bundle was left as it came, or with what it
/// asked NVIDIA's stack for voided (`unrequested = "strip"`). `runc_root`: runc's
/// `--root`, which tells containerd's containers apart.
pub fn prepare(
    config: &Config,
    bundle: &Path,
    id: &str,
    hook: &HookCommand,
    runc_root: Option<&Path>,
) -> Result<Option<Record>, ShimError> {
    let prepared = edit_spec(config, bundle, id, hook, runc_root);
    match &prepared {
        Ok(Some(record)) => {
            tracing::debug!(container = %record.id, gpus = ?record.gpus, "spec edited; running the real runtime")
        }
        // Said by edit_spec, which knows whether it voided NVIDIA's request.
        Ok(None) => {}
        Err(err) => tracing::warn!(
            container = ?id,
            error = %crate::base::message::one_line(err),
            "refused"
        ),
    }
    prepared
}

fn edit_spec(
    config: &Config,
    bundle: &Path,
    id: &str,
    hook: &HookCommand,
    runc_root: Option<&Path>,
) -> Result<Option<Record>, ShimError> {
    let config_path = bundle.join("config.json");
    let mut spec_value = spec::read(&config_path)?;
    let holder = HolderId::new(id)?;
    let docker = DockerSources {
        dir: docker::container_dir(&spec_value, id),
        container: None,
    };
    let mut sources = SpecSources::new(&spec_value, config, docker);
    tracing::debug!(
        container = %holder,
        docker_dir = ?sources.engine.dir,
        "create: looking for a request"
    );
    let found = request::find(&mut sources)?;
    let SpecSources {
        annotations,
        engine: mut docker,
        ..
    } = sources;
    let Some(request) = found else {
        // What it asked NVIDIA's stack for goes too, unless the config says to leave it.
        let unrequested = || Ok::<_, ShimError>(config.unrequested);
        if before_create::strip_unrequested(&mut spec_value, unrequested)? {
            tracing::info!(container = %holder, "no request: NVIDIA's request set to void");
            spec::write_atomic(&config_path, &spec_value)?;
        } else {
            tracing::debug!(container = %holder, "no request: passing through unchanged");
        }
        return Ok(None);
    };
    let token = ClaimToken::new(holder.clone())?;
    let step = BeforeCreate {
        config,
        request: &request,
        annotations: &annotations,
        token: &token,
        hook,
        meta: HolderMeta {
            source: "runtime".into(),
            bundle: Some(bundle.to_path_buf()),
            container: docker.container_info(&annotations, runc_root),
            ..HolderMeta::default()
        },
        // A broken config.v2.json beside an annotation request fails the start only
        // where a label is trusted to name the user (else see `container_info`).
        labels: match (docker.docker_labels(), &config.trusted_user_label) {
            (Ok(labels), _) => labels,
            (Err(_), None) => HashMap::new(),
            (Err(err), Some(_)) => return Err(err),
        },
    };
    let (record, ()) = before_create::edit_spec(step, &mut spec_value, |spec| {
        spec::write_atomic(&config_path, spec)
    })?;
    Ok(Some(record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::foreign::testing::{cdi_linux, gpu_minors};
    use crate::input::config::Unrequested;
    use crate::state::ledger::Ledger;
    use serde_json::Value;
    use serde_json::json;

    struct Setup {
        _tmp: tempfile::TempDir,
        config: Config,
        root: PathBuf,
    }

    fn setup(unrequested: Unrequested) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let config = Config {
            state_dir: root.join("state"),
            inventory: "sim:nvswitch8".parse().unwrap(),
            unrequested,
            // Not /var/log: a user who cannot write it would get only warnings there.
            audit_log: root.join("audit.log"),
            ..Config::default()
        };
        Setup {
            _tmp: tmp,
            config,
            root,
        }
    }

    impl Setup {
        /// Writes `spec` as container `id`'s bundle and runs create's edit on it.
        fn prepare(&self, id: &str, spec: &Value) -> (Option<Record>, Value) {
            let bundle = self.root.join("bundles").join(id);
            std::fs::create_dir_all(&bundle).unwrap();
            let path = bundle.join("config.json");
            std::fs::write(&path, spec.to_string()).unwrap();
            let hook = HookCommand::beside(Path::new("/usr/bin/gpupin-runtime"), None);
            let record = prepare(&self.config, &bundle, id, &hook, None).unwrap();
            (record, spec::read(&path).unwrap())
        }

        fn hold(&self, id: &str, devices: &str) {
            let spec = json!({"annotations": {"gpupin.devices": devices}});
            assert!(self.prepare(id, &spec).0.is_some());
        }

        /// A Docker container folder for `id` whose hostconfig.json asks `--gpus count`.
        fn docker_container(&self, id: &str, count: i64) -> Value {
            self.docker_named(id, count, r#"{"Config": {"Labels": {}}}"#)
        }

        /// A Docker container folder for `id` with this config.v2.json, asking `--gpus`.
        fn docker_named(&self, id: &str, count: i64, config_v2: &str) -> Value {
            let dir = self.root.join("docker/containers").join(id);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.v2.json"), config_v2).unwrap();
            let host = json!({"DeviceRequests": [
                {"Driver": "", "Count": count, "Capabilities": [["gpu"]]}
            ]});
            std::fs::write(dir.join("hostconfig.json"), host.to_string()).unwrap();
            json!([{"destination": "/etc/hostname", "source": dir.join("hostname")}])
        }
    }

    fn minors_of(config: &Config, record: &Record) -> Vec<u64> {
        let inventory = config.load_inventory().unwrap();
        let mut minors: Vec<u64> = record
            .gpus
            .iter()
            .map(|u| u64::from(inventory.gpus.iter().find(|g| &g.uuid == u).unwrap().minor))
            .collect();
        minors.sort();
        minors
    }

    #[test]
    fn docker_gpus_resolved_as_cdi_gets_gpupins_two_not_dockers_zero_and_one() {
        let s = setup(Unrequested::Strip);
        s.hold("a", "0");
        s.hold("b", "1");
        // moby PR #50228: --gpus 2 becomes CDI devices nvidia.com/gpu=0,1 in the spec.
        let spec = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            "mounts": s.docker_container("c", 2),
            "linux": cdi_linux(&[0, 1]),
        });
        let (record, edited) = s.prepare("c", &spec);
        let record = record.unwrap();
        assert_eq!(
            record.request.origin,
            crate::input::request::Origin::DockerGpus
        );
        assert_eq!(gpu_minors(&edited), minors_of(&s.config, &record));
        assert!(
            !minors_of(&s.config, &record).contains(&0)
                && !minors_of(&s.config, &record).contains(&1)
        );
    }

    #[test]
    fn cdi_gpus_without_any_request_become_a_count() {
        let s = setup(Unrequested::Pass);
        s.hold("a", "0");
        let spec = json!({"linux": cdi_linux(&[0, 1, 2])});
        let (record, edited) = s.prepare("c", &spec);
        let record = record.unwrap();
        assert_eq!(record.gpus.len(), 3);
        assert_eq!(gpu_minors(&edited), minors_of(&s.config, &record));
        let ledger = Ledger::open(&crate::input::config::LedgerSettings::at(
            &s.config.state_dir,
        ))
        .unwrap();
        assert_eq!(ledger.records().unwrap().len(), 2);
    }

    #[test]
    fn unrequested_env_is_voided_passed_or_requested_as_configured() {
        let spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=0,1"]}});
        let s = setup(Unrequested::Strip);
        let (record, edited) = s.prepare("c", &spec);
        assert!(record.is_none());
        assert_eq!(
            edited["process"]["env"],
            json!(["NVIDIA_VISIBLE_DEVICES=void"])
        );
        assert!(!s.config.state_dir.join("holders").exists());
        let s = setup(Unrequested::Pass);
        let (record, edited) = s.prepare("c", &spec);
        assert!(record.is_none());
        assert_eq!(edited, spec);
        let s = setup(Unrequested::Request);
        let (record, edited) = s.prepare("c", &spec);
        let record = record.unwrap();
        assert_eq!(record.gpus.len(), 2);
        assert_eq!(
            edited["process"]["env"],
            json!([format!("NVIDIA_VISIBLE_DEVICES={}", record.gpus.join(","))])
        );
    }

    #[test]
    fn a_docker_container_is_recorded_with_its_name_and_image() {
        let s = setup(Unrequested::Strip);
        let config_v2 = r#"{"Name": "/trainer\nx", "Config": {"Image": "my/trainer:2",
            "Labels": {"gpupin.count": "1"}}}"#;
        let spec = json!({"mounts": s.docker_named("c", 1, config_v2)});
        let record = s.prepare("c", &spec).0.unwrap();
        assert_eq!(record.request.origin, crate::input::request::Origin::Labels);
        let info = record.container.unwrap();
        assert_eq!(info.engine.as_deref(), Some("docker"));
        assert_eq!(info.name.as_deref(), Some("trainer\u{fffd}x"));
        assert_eq!(info.image.as_deref(), Some("my/trainer:2"));
        // An annotation request: config.v2.json is read for the name alone.
        let spec = json!({"annotations": {"gpupin.count": "1"},
            "mounts": s.docker_named("d", 1, r#"{"Name": "/web"}"#)});
        let info = s.prepare("d", &spec).0.unwrap().container.unwrap();
        assert_eq!(info.name.as_deref(), Some("web"));
        assert_eq!(info.image, None);
    }

    #[test]
    fn a_broken_config_v2_beside_an_annotation_request_leaves_only_the_engine() {
        let s = setup(Unrequested::Strip);
        let spec = json!({"annotations": {"gpupin.count": "1"},
            "mounts": s.docker_named("c", 1, "{")});
        let info = s.prepare("c", &spec).0.unwrap().container.unwrap();
        assert_eq!(info, crate::engines::engine::engine_only("docker"));
    }

    #[test]
    fn containerds_runc_root_or_its_annotations_name_the_engine() {
        let s = setup(Unrequested::Strip);
        let bundle = s.root.join("bundles/ctr");
        std::fs::create_dir_all(&bundle).unwrap();
        let spec = json!({"annotations": {"gpupin.count": "1"}});
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let hook = HookCommand::beside(Path::new("/usr/bin/gpupin-runtime"), None);
        let root = Path::new("/run/containerd/runc/default");
        let record = prepare(&s.config, &bundle, "ctr", &hook, Some(root)).unwrap();
        let info = record.unwrap().container.unwrap();
        assert_eq!(info, crate::engines::engine::engine_only("containerd"));
        let spec = json!({"annotations": {"gpupin.count": "1",
            "io.kubernetes.cri.container-name": "worker",
            "io.kubernetes.cri.sandbox-name": "job",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "io.kubernetes.cri.image-name": "trainer:1"}});
        let info = s.prepare("cri", &spec).0.unwrap().container.unwrap();
        assert_eq!(info.engine.as_deref(), Some("containerd"));
        assert_eq!(info.name.as_deref(), Some("ml/job/worker"));
        assert_eq!(info.image.as_deref(), Some("trainer:1"));
        // Under another runtime root, and without annotations of any engine: unknown.
        let spec = json!({"annotations": {"gpupin.count": "1"}});
        assert_eq!(s.prepare("plain", &spec).0.unwrap().container, None);
    }
}
