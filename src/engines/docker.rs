//! What Docker knows about a container but does not put into the OCI spec: its labels
//! (config.v2.json) and GPU device requests (hostconfig.json), read from the container's
//! folder under Docker's root. The folder is found from the spec's mounts: Docker bind
//! mounts /etc/hostname, /etc/hosts and /etc/resolv.conf from it. The Docker API is never
//! called: during `create` the daemon holds the container's lock, and a call would deadlock.

use crate::base::safe_open::{self, Links};
use crate::input::request::{self, GpuRequest, Origin, RequestError, Selection};
use crate::model::holder::ContainerInfo;
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const CONFIG_FILE: &str = "config.v2.json";
const HOSTCONFIG_FILE: &str = "hostconfig.json";
const DOCKER_MOUNTS: &[&str] = &["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"];

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("reading Docker container file {path:?}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing Docker container file {path:?}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("invalid Docker GPU request in {path:?}: {reason}")]
    BadDeviceRequest { path: PathBuf, reason: String },
}

/// The container's folder under Docker's root, when the spec shows one for `id`.
/// Only a folder named after the container and holding config.v2.json counts, so a user's
/// own bind mount onto /etc/hosts cannot point gpupin at another container's labels.
pub(crate) fn container_dir(spec: &Value, id: &str) -> Option<PathBuf> {
    let mounts = spec.get("mounts")?.as_array()?;
    mounts.iter().find_map(|m| {
        let dest = m.get("destination")?.as_str()?;
        if !DOCKER_MOUNTS.contains(&dest) {
            return None;
        }
        let dir = Path::new(m.get("source")?.as_str()?).parent()?;
        let named_after_id = dir.file_name()?.to_str()? == id;
        (named_after_id && dir.join(CONFIG_FILE).is_file()).then(|| dir.to_path_buf())
    })
}

/// What gpupin reads of config.v2.json: the labels, the name and the image.
#[derive(Deserialize)]
struct ConfigV2 {
    /// `/name`, as dockerd stores it.
    #[serde(rename = "Name", default)]
    name: Option<String>,
    #[serde(rename = "Config", default)]
    config: Option<ContainerConfig>,
}

#[derive(Deserialize)]
struct ContainerConfig {
    #[serde(rename = "Labels", default)]
    labels: Option<HashMap<String, String>>,
    /// The image as the user named it (`busybox`, `my/app:2`, or an id).
    #[serde(rename = "Image", default)]
    image: Option<String>,
}

/// A Docker container's config.v2.json, read once for its labels and for what
/// `gpupin status` tells about it.
pub(crate) struct DockerContainer {
    config: ConfigV2,
}

impl DockerContainer {
    pub(crate) fn read(dir: &Path) -> Result<DockerContainer, DockerError> {
        Ok(DockerContainer {
            config: read_json(&dir.join(CONFIG_FILE))?,
        })
    }

    /// The container's labels.
    pub(crate) fn labels(&self) -> HashMap<String, String> {
        let config = self.config.config.as_ref();
        config.and_then(|c| c.labels.clone()).unwrap_or_default()
    }

    /// A request from `gpupin.*` labels.
    pub(crate) fn label_request(&self) -> Result<Option<GpuRequest>, DockerError> {
        Ok(request::from_labels(&self.labels())?)
    }

    /// Engine, name and image, as `gpupin status` shows them.
    pub(crate) fn info(&self) -> ContainerInfo {
        let image = self.config.config.as_ref().and_then(|c| c.image.as_deref());
        crate::engines::engine::docker(self.config.name.as_deref(), image)
    }
}

#[derive(Deserialize)]
struct HostConfig {
    #[serde(rename = "DeviceRequests", default)]
    device_requests: Option<Vec<DeviceRequest>>,
}

/// One entry of Docker's `DeviceRequests` (`--gpus`, compose `reservations.devices`).
#[derive(Deserialize, Debug)]
struct DeviceRequest {
    #[serde(rename = "Driver", default)]
    driver: String,
    /// -1 means all (`--gpus all`).
    #[serde(rename = "Count", default)]
    count: i64,
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<Vec<String>>,
    #[serde(rename = "Capabilities", default)]
    capabilities: Option<Vec<Vec<String>>>,
}

impl DeviceRequest {
    /// Docker routes a request to its NVIDIA driver by driver name or the `gpu` capability.
    fn is_gpu(&self) -> bool {
        self.driver == "nvidia"
            || self
                .capabilities
                .iter()
                .flatten()
                .any(|set| set.iter().any(|c| c == "gpu"))
    }
}

/// The folder comes from the spec's mounts, so its path is quoted in errors and its files
/// are read as dockerd writes them: regular files, never links, never a FIFO to block on.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, DockerError> {
    let bytes = safe_open::read(path, Links::Refuse).map_err(|source| DockerError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| DockerError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Docker's own GPU request, as a gpupin request: a count stays a count (so gpupin, not
/// Docker's 0..N-1, picks the GPUs), `all` stays all, device ids become explicit devices.
pub(crate) fn gpus_request(dir: &Path) -> Result<Option<GpuRequest>, DockerError> {
    let path = dir.join(HOSTCONFIG_FILE);
    let host: HostConfig = read_json(&path)?;
    let Some(req) = host
        .device_requests
        .unwrap_or_default()
        .into_iter()
        .find(DeviceRequest::is_gpu)
    else {
        return Ok(None);
    };
    let bad = |reason: String| DockerError::BadDeviceRequest {
        path: path.clone(),
        reason,
    };
    let ids = req.device_ids.unwrap_or_default();
    let selection = if !ids.is_empty() {
        let joined = ids.join(",");
        match request::from_pairs(
            &[(request::Key::Devices.as_str(), &joined)],
            Origin::DockerGpus,
        )? {
            Some(GpuRequest { selection, .. }) => selection,
            None => return Err(bad(format!("empty DeviceIDs {ids:?}"))),
        }
    } else {
        match req.count {
            -1 => Selection::All,
            n if n > 0 && n <= u32::MAX as i64 => Selection::Count(n as u32),
            n => {
                return Err(bad(format!(
                    "Count {n}: expected a positive number or -1 (all)"
                )));
            }
        }
    };
    Ok(Some(GpuRequest::new(selection, Origin::DockerGpus)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(id: &str, labels: Value, host: Value) -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("containers").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let config = json!({"ID": id, "Config": {"Labels": labels, "Env": ["A=1"]}});
        std::fs::write(dir.join(CONFIG_FILE), config.to_string()).unwrap();
        std::fs::write(dir.join(HOSTCONFIG_FILE), host.to_string()).unwrap();
        (root, dir)
    }

    fn label_request(dir: &Path) -> Result<Option<GpuRequest>, DockerError> {
        DockerContainer::read(dir)?.label_request()
    }

    fn spec_mounting(dir: &Path) -> Value {
        json!({"mounts": [
            {"destination": "/proc", "source": "proc"},
            {"destination": "/etc/hostname", "source": dir.join("hostname")},
        ]})
    }

    #[test]
    fn finds_the_container_folder_from_the_hostname_mount() {
        let (_root, dir) = container("abc123", json!({}), json!({}));
        assert_eq!(
            container_dir(&spec_mounting(&dir), "abc123"),
            Some(dir.clone())
        );
        assert_eq!(container_dir(&spec_mounting(&dir), "other"), None);
        assert_eq!(container_dir(&json!({}), "abc123"), None);
    }

    #[test]
    fn labels_make_a_request() {
        let (_root, dir) = container("c", json!({"gpupin.count": "2", "x": "y"}), json!({}));
        let r = label_request(&dir).unwrap().unwrap();
        assert_eq!(r.selection, Selection::Count(2));
        assert_eq!(r.origin, Origin::Labels);
        let (_root, dir) = container("c", json!({"gpupin.count": "-1"}), json!({}));
        assert!(
            label_request(&dir)
                .unwrap_err()
                .to_string()
                .contains("gpupin.count=\"-1\"")
        );
    }

    #[test]
    fn config_v2_gives_the_name_and_image() {
        let (_root, dir) = container("c", json!({"gpupin.count": "1"}), json!({}));
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(dir.join(CONFIG_FILE)).unwrap()).unwrap();
        config["Name"] = json!("/trainer");
        config["Config"]["Image"] = json!("my/trainer:2");
        std::fs::write(dir.join(CONFIG_FILE), config.to_string()).unwrap();
        let docker = DockerContainer::read(&dir).unwrap();
        let info = docker.info();
        assert_eq!(info.engine.as_deref(), Some("docker"));
        assert_eq!(info.name.as_deref(), Some("trainer"));
        assert_eq!(info.image.as_deref(), Some("my/trainer:2"));
        assert_eq!(docker.labels()["gpupin.count"], "1");
    }

    #[test]
    fn a_path_from_the_spec_is_quoted_in_errors() {
        let (_root, dir) = container("c\nfake: line", json!({}), json!({}));
        std::fs::write(dir.join(HOSTCONFIG_FILE), "{").unwrap();
        let err = gpus_request(&dir).unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains(r"c\nfake: line/hostconfig.json"), "{err}");
    }

    #[test]
    fn container_files_that_are_links_or_fifos_are_refused() {
        let (_root, dir) = container("c", json!({"gpupin.count": "1"}), json!({}));
        let elsewhere = dir.parent().unwrap().join("other.json");
        std::fs::rename(dir.join(CONFIG_FILE), &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join(CONFIG_FILE)).unwrap();
        let err = crate::base::message::one_line(&label_request(&dir).unwrap_err());
        assert!(err.starts_with("reading Docker container file"), "{err}");
        std::fs::remove_file(dir.join(HOSTCONFIG_FILE)).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.join(HOSTCONFIG_FILE),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(gpus_request(&dir).map(|_| ()));
        });
        let result = rx.recv_timeout(std::time::Duration::from_secs(5));
        let err = result.expect("still blocked after 5 s").unwrap_err();
        assert!(
            crate::base::message::one_line(&err).contains("FIFO"),
            "{err}"
        );
    }

    #[test]
    fn docker_gpus_count_all_and_ids() {
        let gpu = |extra: Value| {
            let mut r = json!({"Driver": "", "Capabilities": [["gpu"]], "Options": {}});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            json!({"DeviceRequests": [r]})
        };
        let cases = [
            (gpu(json!({"Count": 2})), Selection::Count(2)),
            (gpu(json!({"Count": -1})), Selection::All),
            (
                gpu(json!({"Count": 0, "DeviceIDs": ["3", "GPU-x"]})),
                Selection::Devices(vec!["3".into(), "GPU-x".into()]),
            ),
        ];
        for (host, expected) in cases {
            let (_root, dir) = container("c", json!({}), host);
            assert_eq!(gpus_request(&dir).unwrap().unwrap().selection, expected);
        }
        let (_root, dir) = container("c", json!({}), json!({"DeviceRequests": null}));
        assert_eq!(gpus_request(&dir).unwrap(), None);
        let (_root, dir) = container("c", json!({}), gpu(json!({"Count": 0})));
        assert!(
            gpus_request(&dir)
                .unwrap_err()
                .to_string()
                .contains("Count 0")
        );
    }
}
