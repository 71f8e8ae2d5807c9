//! `create` under gpupin-runtime: find the request, admit, write the edited spec.

use super::ShimError;
use crate::admit::{self, Admission, Claim};
use crate::config::Config;
use crate::docker;
use crate::driver::foreign::{self, GpuNumbers, Unrequested};
use crate::edits::{self, HookCommand};
use crate::ledger::{ClaimToken, HolderId, HolderMeta, Record};
use crate::request::{self, GpuRequest};
use crate::spec;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the shim finds a request: the spec's annotations and env, Docker's labels and
/// `--gpus` request in the container's folder when the spec shows one, and last the GPUs
/// NVIDIA's stack was asked for around gpupin.
struct ShimSources<'a> {
    annotations: HashMap<String, String>,
    spec: &'a Value,
    docker_dir: Option<PathBuf>,
    config: &'a Config,
}

impl request::Sources for ShimSources<'_> {
    type Error = ShimError;
    fn annotations(&self) -> &HashMap<String, String> {
        &self.annotations
    }
    fn labels(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        match &self.docker_dir {
            Some(dir) => Ok(docker::label_request(dir)?),
            None => Ok(None),
        }
    }
    fn env(&mut self) -> Result<Vec<String>, ShimError> {
        Ok(spec::process_env(self.spec))
    }
    fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        match &self.docker_dir {
            Some(dir) => Ok(docker::gpus_request(dir)?),
            None => Ok(None),
        }
    }
    fn foreign(&mut self) -> Result<Option<GpuRequest>, ShimError> {
        let config = self.config;
        foreign::request(self.spec, config.unrequested, || {
            let inventory =
                crate::inventory::load(&config.inventory, &config.state_dir, &config.nvml)?;
            Ok(GpuNumbers::of(&inventory))
        })
    }
}

fn sources<'a>(spec_value: &'a Value, id: &str, config: &'a Config) -> ShimSources<'a> {
    ShimSources {
        annotations: spec::annotations(spec_value),
        spec: spec_value,
        docker_dir: docker::container_dir(spec_value, id),
        config,
    }
}

/// Allocates for a container that asks for GPUs and rewrites its spec. `None`: the
/// container asked gpupin for nothing; its bundle was left as it came, or with what it
/// asked NVIDIA's stack for voided (`unrequested = "strip"`).
pub fn prepare(
    config: &Config,
    bundle: &Path,
    id: &str,
    hook: &HookCommand,
) -> Result<Option<Record>, ShimError> {
    let prepared = edit_spec(config, bundle, id, hook);
    match &prepared {
        Ok(Some(record)) => {
            tracing::debug!(container = %record.id, gpus = ?record.gpus, "spec edited; running the real runtime")
        }
        // Said by edit_spec, which knows whether it voided NVIDIA's request.
        Ok(None) => {}
        Err(err) => tracing::warn!(
            container = ?id,
            error = %crate::message::one_line(err),
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
) -> Result<Option<Record>, ShimError> {
    let config_path = bundle.join("config.json");
    let mut spec_value = spec::read(&config_path)?;
    let holder = HolderId::new(id)?;
    let mut sources = sources(&spec_value, id, config);
    tracing::debug!(
        container = %holder,
        docker_dir = ?sources.docker_dir,
        "create: looking for a request"
    );
    let Some(request) = request::find(&mut sources)? else {
        // What it asked NVIDIA's stack for goes too, unless the config says to leave it.
        if config.unrequested == Unrequested::Strip && foreign::void(&mut spec_value) {
            tracing::info!(container = %holder, "no request: NVIDIA's request set to void");
            spec::write_atomic(&config_path, &spec_value)?;
        } else {
            tracing::debug!(container = %holder, "no request: passing through unchanged");
        }
        return Ok(None);
    };
    edits::refuse_reserved(&sources.annotations)?;
    let token = ClaimToken::new(holder.clone())?;
    let admission = Admission {
        holder: &holder,
        request: &request,
        meta: HolderMeta {
            source: "runtime".into(),
            bundle: Some(bundle.to_path_buf()),
            ..HolderMeta::default()
        },
        claim: Some(Claim {
            token: &token,
            hook,
        }),
    };
    let (record, ()) = admit::admit(config, admission, |edits| {
        edits::spec::apply(edits, &mut spec_value)?;
        Ok(spec::write_atomic(&config_path, &spec_value)?)
    })?;
    Ok(Some(record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::foreign::testing::{cdi_linux, gpu_minors};
    use crate::ledger::Ledger;
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
            let record = prepare(&self.config, &bundle, id, &hook).unwrap();
            (record, spec::read(&path).unwrap())
        }

        fn hold(&self, id: &str, devices: &str) {
            let spec = json!({"annotations": {"gpupin.devices": devices}});
            assert!(self.prepare(id, &spec).0.is_some());
        }

        /// A Docker container folder for `id` whose hostconfig.json asks `--gpus count`.
        fn docker_container(&self, id: &str, count: i64) -> Value {
            let dir = self.root.join("docker/containers").join(id);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.v2.json"), r#"{"Config": {"Labels": {}}}"#).unwrap();
            let host = json!({"DeviceRequests": [
                {"Driver": "", "Count": count, "Capabilities": [["gpu"]]}
            ]});
            std::fs::write(dir.join("hostconfig.json"), host.to_string()).unwrap();
            json!([{"destination": "/etc/hostname", "source": dir.join("hostname")}])
        }
    }

    fn minors_of(config: &Config, record: &Record) -> Vec<u64> {
        let inventory =
            crate::inventory::load(&config.inventory, &config.state_dir, &config.nvml).unwrap();
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
        assert_eq!(record.request.origin, crate::request::Origin::DockerGpus);
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
        let ledger = Ledger::open(&s.config.state_dir).unwrap();
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
}
