//! CDI specs (the Container Device Interface, cncf-tags/container-device-interface
//! SPEC.md) for kind `nvidia.com/gpu`, as `nvidia-ctk cdi generate` writes them: read
//! from the spec dirs, parsed into gpupin's own small model. The CDI project's Rust crate
//! is not used: it edits only `oci_spec::runtime::Spec`, which drops keys gpupin must
//! keep, and pulls in a few hundred crates (docs/ARCHITECTURE.md, "Driver libraries").

use crate::base::safe_open::{self, Links};
use serde::{Deserialize, Deserializer};
use std::path::{Path, PathBuf};

/// The only kind gpupin applies.
pub(crate) const KIND: &str = "nvidia.com/gpu";

/// The device name that stands for every GPU; gpupin never applies it.
pub(crate) const ALL: &str = "all";

/// One spec file. Fields gpupin does not use (annotations, intelRdt, netDevices) are
/// tolerated and ignored, as are fields a later CDI version adds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, deserialize_with = "or_empty")]
    pub devices: Vec<Device>,
    /// Edits every device of the spec needs (control nodes, the driver's files).
    #[serde(default, deserialize_with = "or_empty")]
    pub container_edits: Edits,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Device {
    pub name: String,
    #[serde(default, deserialize_with = "or_empty")]
    pub container_edits: Edits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Edits {
    /// `KEY=VALUE` entries.
    #[serde(default, deserialize_with = "or_empty")]
    pub env: Vec<String>,
    #[serde(default, deserialize_with = "or_empty")]
    pub device_nodes: Vec<Node>,
    #[serde(default, deserialize_with = "or_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, deserialize_with = "or_empty")]
    pub mounts: Vec<Mount>,
    /// Groups the process joins (nvidia-ctk >= 1.17 adds the group of a node only that
    /// group may open, such as /dev/dri/renderD*'s).
    #[serde(default, deserialize_with = "or_empty")]
    pub additional_gids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Node {
    /// Where the node is in the container.
    pub path: String,
    /// Where it is on the host, when that differs (a driver root); stat'ed for missing
    /// numbers.
    pub host_path: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub permissions: Option<String>,
    pub file_mode: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Hook {
    /// The OCI hook stage: `createContainer` for nvidia-cdi-hook.
    pub hook_name: String,
    pub path: String,
    #[serde(default, deserialize_with = "or_empty")]
    pub args: Vec<String>,
    #[serde(default, deserialize_with = "or_empty")]
    pub env: Vec<String>,
    pub timeout: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default, deserialize_with = "or_empty")]
    pub options: Vec<String>,
}

/// YAML writes an empty list as `null` (`env:` with nothing after it): read it as empty.
fn or_empty<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A spec file as found, with its directory's rank (a later spec dir outranks an earlier
/// one, as in the CDI reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub path: PathBuf,
    pub rank: usize,
    pub spec: Spec,
}

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("listing CDI spec dir {path}")]
    ListDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading CDI spec {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing CDI spec {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    /// Its hooks run as root on every pinned container's start: only root (or the user
    /// gpupin runs as) may be able to write it.
    #[error("refusing CDI spec {what} {path}: {reason}")]
    Untrusted {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}

/// Why a spec file or dir must not be trusted, if it must not: owned by another user than
/// root or this one, or writable by group or others (the state dir's rule).
fn distrust(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!("owned by uid {}, not root", meta.uid()));
    }
    (meta.mode() & 0o022 != 0).then(|| "it is writable by group or others".to_string())
}

/// Every `nvidia.com/gpu` spec in `dirs` (`*.json`, `*.yaml`, `*.yml`; a missing dir has
/// none), each dir's files in name order. A file that cannot be read or parsed is an
/// error naming it: skipping it could hide the spec that holds the chosen GPUs, and
/// the container would start without its driver. Files of other kinds are skipped.
pub(crate) fn load(dirs: &[PathBuf]) -> Result<Vec<Found>, CdiError> {
    let mut found = Vec::new();
    for (rank, dir) in dirs.iter().enumerate() {
        for path in spec_files(dir)? {
            if let Some(spec) = read(&path)? {
                found.push(Found { path, rank, spec });
            }
        }
    }
    Ok(found)
}

/// The spec files of one dir, sorted by name.
fn spec_files(dir: &Path) -> Result<Vec<PathBuf>, CdiError> {
    let list_err = |source| CdiError::ListDir {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(list_err(e)),
    };
    if let Some(reason) = distrust(&std::fs::metadata(dir).map_err(list_err)?) {
        return Err(CdiError::Untrusted {
            what: "dir",
            path: dir.to_path_buf(),
            reason,
        });
    }
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(list_err)?.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if matches!(ext, Some("json" | "yaml" | "yml")) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// One file: `None` when it is not an `nvidia.com/gpu` spec. Admins link specs into the
/// dirs, so a link is followed; a FIFO or a directory is refused, never waited on, and so
/// is a file another user could write (`distrust`).
pub(crate) fn read(path: &Path) -> Result<Option<Spec>, CdiError> {
    let read_err = |source| CdiError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = safe_open::open(path, Links::Follow).map_err(read_err)?;
    // The opened file's owner and mode, so the check and the read see the same file.
    let meta = file.metadata().map_err(read_err)?;
    if let Some(reason) = distrust(&meta) {
        return Err(CdiError::Untrusted {
            what: "file",
            path: path.to_path_buf(),
            reason,
        });
    }
    let bytes = safe_open::read_file(file, meta.len()).map_err(read_err)?;
    let parse_err = |reason: String| CdiError::Parse {
        path: path.to_path_buf(),
        reason: reason.split_whitespace().collect::<Vec<_>>().join(" "),
    };
    let json = path.extension().is_some_and(|e| e == "json");
    // The kind first, from a loose parse: another vendor's spec need not fit the model.
    let kind = if json {
        serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| parse_err(e.to_string()))?
            .get("kind")
            .and_then(|k| k.as_str().map(str::to_owned))
    } else {
        serde_norway::from_slice::<serde_norway::Value>(&bytes)
            .map_err(|e| parse_err(e.to_string()))?
            .get("kind")
            .and_then(|k| k.as_str().map(str::to_owned))
    };
    if kind.as_deref() != Some(KIND) {
        return Ok(None);
    }
    let spec = if json {
        serde_json::from_slice(&bytes).map_err(|e| parse_err(e.to_string()))?
    } else {
        serde_norway::from_slice(&bytes).map_err(|e| parse_err(e.to_string()))?
    };
    Ok(Some(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
    - name: "0"
      containerEdits:
        deviceNodes:
            - path: /dev/nvidia0
              major: 195
              fileMode: 438
              permissions: rwm
        hooks:
            - hookName: createContainer
              path: /usr/bin/nvidia-cdi-hook
              args: [nvidia-cdi-hook, create-symlinks, --link, "../card1::/dev/dri/by-path/pci-0000:17:00.0-card"]
              env: [NVIDIA_CTK_DEBUG=false]
    - name: all
      annotations: {x: y}
      containerEdits:
        deviceNodes:
            - path: /dev/nvidia0
containerEdits:
    env:
        - NVIDIA_VISIBLE_DEVICES=void
    additionalGids: [44]
    mounts:
        - hostPath: /usr/bin/nvidia-smi
          containerPath: /usr/bin/nvidia-smi
          options: [ro, nosuid, nodev, rbind, rprivate]
futureField: 1
"#;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn yaml_as_nvidia_ctk_writes_it_parses_with_unknown_fields() {
        let dir = tempfile::tempdir().unwrap();
        let spec = read(&write(dir.path(), "nvidia.yaml", YAML))
            .unwrap()
            .unwrap();
        assert_eq!(
            (spec.cdi_version.as_str(), spec.kind.as_str()),
            ("0.5.0", KIND)
        );
        let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["0", "all"]);
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(
            (node.major, node.minor, node.file_mode),
            (Some(195), None, Some(438))
        );
        let hook = &spec.devices[0].container_edits.hooks[0];
        assert_eq!(hook.hook_name, "createContainer");
        assert_eq!(
            hook.args[3],
            "../card1::/dev/dri/by-path/pci-0000:17:00.0-card"
        );
        assert_eq!(spec.container_edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        assert_eq!(spec.container_edits.additional_gids, [44]);
        assert_eq!(spec.container_edits.mounts[0].options.len(), 5);
    }

    #[test]
    fn json_parses_and_null_lists_are_empty() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","containerEdits":{"env":null},
            "devices":[{"name":"GPU-1","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia1","hostPath":"/r/dev/nvidia1"}]}}]}"#;
        let spec = read(&write(dir.path(), "x.json", text)).unwrap().unwrap();
        assert!(spec.container_edits.env.is_empty());
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(node.host_path.as_deref(), Some("/r/dev/nvidia1"));
    }

    #[test]
    fn other_kinds_are_skipped_but_a_broken_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let other = "cdiVersion: 0.5.0\nkind: vendor.com/fpga\ndevices: 3\n";
        assert_eq!(read(&write(dir.path(), "fpga.yaml", other)).unwrap(), None);
        let broken = write(
            dir.path(),
            "nvidia.yaml",
            "kind: nvidia.com/gpu\ndevices: [\n",
        );
        let err = crate::base::message::one_line(&read(&broken).unwrap_err());
        assert!(
            err.starts_with(&format!("parsing CDI spec {}: ", broken.display())),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
        let wrong = write(
            dir.path(),
            "n.json",
            r#"{"kind":"nvidia.com/gpu","devices":{}}"#,
        );
        let err = crate::base::message::one_line(&read(&wrong).unwrap_err());
        assert!(
            err.contains("n.json") && err.contains("expected a sequence"),
            "{err}"
        );
    }

    #[test]
    fn load_reads_every_dir_in_order_and_only_spec_files() {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        write(dirs[1].path(), "b.yml", YAML);
        write(dirs[1].path(), "a.yaml", YAML);
        write(dirs[0].path(), "nvidia.yaml", YAML);
        write(dirs[0].path(), "README", "not a spec");
        let mut paths: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_path_buf()).collect();
        paths.insert(1, PathBuf::from("/nonexistent/cdi"));
        let found = load(&paths).unwrap();
        let seen: Vec<(usize, String)> = found
            .iter()
            .map(|f| (f.rank, f.path.file_name().unwrap().to_string_lossy().into()))
            .collect();
        assert_eq!(
            seen,
            [
                (0, "nvidia.yaml".into()),
                (2, "a.yaml".into()),
                (2, "b.yml".into())
            ]
        );
    }

    #[test]
    fn a_spec_or_dir_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "nvidia.yaml", YAML);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o646)).unwrap();
        let err = crate::base::message::one_line(&load(&[dir.path().to_path_buf()]).unwrap_err());
        assert_eq!(
            err,
            format!(
                "refusing CDI spec file {}: it is writable by group or others",
                path.display()
            )
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load(&[dir.path().to_path_buf()]).unwrap().len(), 1);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = crate::base::message::one_line(&load(&[dir.path().to_path_buf()]).unwrap_err());
        assert!(err.starts_with("refusing CDI spec dir "), "{err}");
    }

    #[test]
    fn a_linked_spec_is_followed_and_a_fifo_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let real = write(dir.path(), "real.txt", YAML);
        std::os::unix::fs::symlink(&real, dir.path().join("nvidia.yaml")).unwrap();
        assert_eq!(load(&[dir.path().to_path_buf()]).unwrap().len(), 1);
        let fifo = dir.path().join("z.yaml");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let err = crate::base::message::one_line(&load(&[dir.path().to_path_buf()]).unwrap_err());
        assert!(err.contains("z.yaml") && err.contains("FIFO"), "{err}");
    }
}
