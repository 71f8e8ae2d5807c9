//! Which engine started a container, and the name and image it gave it: only what the
//! engine itself tells gpupin on the way in (annotations it puts into the spec, Docker's
//! container folder, the runtime root containerd gives runc), never an engine's API,
//! which would deadlock inside `create`. The text comes from the container's spec, which
//! its author partly writes: it is kept short and on one line (`clean`), and it only
//! labels a holder in `gpupin status` and the audit log; nothing is decided by it.

use crate::model::holder::ContainerInfo;
use std::collections::HashMap;
use std::path::Path;

pub(crate) const DOCKER: &str = "docker";
pub(crate) const PODMAN: &str = "podman";
pub(crate) const CONTAINERD: &str = "containerd";

/// At most this many bytes of a name or image are kept: enough for any real one
/// (Docker caps names far below; an image reference with a digest is ~150 bytes).
pub(crate) const MAX_TEXT: usize = 256;

/// containerd's CRI plugin (pkg/cri/annotations): the container, its pod and namespace,
/// and the image as the pod spec names it.
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
const CRI_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
/// nerdctl's name for a container it runs through containerd.
const NERDCTL_NAME: &str = "nerdctl/name";
/// Podman (libpod) marks every spec it makes with this; podman 4.3 puts neither the
/// container's name nor its image into the spec (seen at precreate and prestart).
const PODMAN_MANAGER: (&str, &str) = ("io.container.manager", "libpod");

/// The containerd runc shim's default `--root` (`/run/containerd/runc/<namespace>`);
/// /var/run is the same directory through a link.
const CONTAINERD_RUNC_ROOTS: [&str; 2] = ["/run/containerd/runc/", "/var/run/containerd/runc/"];

/// `text` on one line and at most `MAX_TEXT` bytes: control characters, line and
/// paragraph separators and bidi overrides (which could make a status line read
/// otherwise than it is) become U+FFFD. `None` when nothing but blanks is left.
pub(crate) fn clean(text: &str) -> Option<String> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    let mut out = String::new();
    for c in text.trim().chars() {
        let c = if unsafe_char(c) { '\u{fffd}' } else { c };
        if out.len() + c.len_utf8() > MAX_TEXT {
            break;
        }
        out.push(c);
    }
    (!out.trim().is_empty()).then_some(out)
}

/// What a container's annotations say about it: containerd's CRI and nerdctl's names,
/// podman's mark. `None` when they name no engine.
pub(crate) fn from_annotations(annotations: &HashMap<String, String>) -> Option<ContainerInfo> {
    let get = |key: &str| annotations.get(key).and_then(|v| clean(v));
    let cri = [CRI_CONTAINER_TYPE, CRI_CONTAINER_NAME, CRI_SANDBOX_NAME]
        .iter()
        .any(|k| annotations.contains_key(*k));
    if cri {
        // namespace/pod/container, as kubectl users know it; a pod's sandbox (pause)
        // container has no container name: namespace/pod.
        let parts: Vec<String> = [CRI_SANDBOX_NAMESPACE, CRI_SANDBOX_NAME, CRI_CONTAINER_NAME]
            .iter()
            .filter_map(|k| get(k))
            .collect();
        return Some(ContainerInfo {
            engine: Some(CONTAINERD.into()),
            name: (!parts.is_empty())
                .then(|| parts.join("/"))
                .and_then(|n| clean(&n)),
            image: get(CRI_IMAGE_NAME),
        });
    }
    if let Some(name) = get(NERDCTL_NAME) {
        return Some(ContainerInfo {
            engine: Some(CONTAINERD.into()),
            name: Some(name),
            image: None,
        });
    }
    let (key, value) = PODMAN_MANAGER;
    if annotations.get(key).is_some_and(|v| v == value) {
        return Some(engine_only(PODMAN));
    }
    None
}

/// Whether runc's `--root` is the one containerd's runc shim gives it.
pub(crate) fn is_containerd_root(root: &Path) -> bool {
    let root = root.to_string_lossy();
    CONTAINERD_RUNC_ROOTS.iter().any(|r| root.starts_with(r))
}

/// A container started by `engine`, which told nothing else about it.
pub(crate) fn engine_only(engine: &str) -> ContainerInfo {
    ContainerInfo {
        engine: Some(engine.into()),
        ..ContainerInfo::default()
    }
}

/// A Docker container: `name` as config.v2.json holds it (`/name`), `image` as the user
/// named it (`Config.Image`).
pub(crate) fn docker(name: Option<&str>, image: Option<&str>) -> ContainerInfo {
    ContainerInfo {
        engine: Some(DOCKER.into()),
        name: name.and_then(|n| clean(n.strip_prefix('/').unwrap_or(n))),
        image: image.and_then(clean),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn text_from_a_spec_stays_on_one_short_line() {
        assert_eq!(clean("  web-1 ").as_deref(), Some("web-1"));
        assert_eq!(
            clean("a\nb\rc\u{1b}[31m\u{2028}d\u{202e}e").as_deref(),
            Some("a\u{fffd}b\u{fffd}c\u{fffd}[31m\u{fffd}d\u{fffd}e")
        );
        assert_eq!(clean(" \t "), None);
        assert_eq!(clean("\n"), None);
        let long = clean(&"é".repeat(MAX_TEXT)).unwrap();
        assert!(
            long.len() <= MAX_TEXT && long.len() >= MAX_TEXT - 1,
            "{}",
            long.len()
        );
        assert!(long.chars().all(|c| c == 'é'));
    }

    #[test]
    fn cri_annotations_name_namespace_pod_and_container() {
        let info = from_annotations(&annotations(&[
            (CRI_CONTAINER_TYPE, "container"),
            (CRI_CONTAINER_NAME, "trainer"),
            (CRI_SANDBOX_NAME, "job-7"),
            (CRI_SANDBOX_NAMESPACE, "ml"),
            (CRI_IMAGE_NAME, "registry.example/trainer:2"),
        ]))
        .unwrap();
        assert_eq!(info.engine.as_deref(), Some("containerd"));
        assert_eq!(info.name.as_deref(), Some("ml/job-7/trainer"));
        assert_eq!(info.image.as_deref(), Some("registry.example/trainer:2"));
        let sandbox = from_annotations(&annotations(&[
            (CRI_CONTAINER_TYPE, "sandbox"),
            (CRI_SANDBOX_NAME, "job-7"),
            (CRI_SANDBOX_NAMESPACE, "ml"),
        ]))
        .unwrap();
        assert_eq!(sandbox.name.as_deref(), Some("ml/job-7"));
        assert_eq!(sandbox.image, None);
    }

    #[test]
    fn nerdctl_name_and_podmans_mark() {
        let info = from_annotations(&annotations(&[(NERDCTL_NAME, "web\n1")])).unwrap();
        assert_eq!(info.engine.as_deref(), Some("containerd"));
        assert_eq!(info.name.as_deref(), Some("web\u{fffd}1"));
        // What podman 4.3 put into a named container's spec from an image: no name, no
        // image.
        let podman = annotations(&[
            ("io.container.manager", "libpod"),
            (
                "io.kubernetes.cri-o.Created",
                "2026-12-03T17:55:27.478274224Z",
            ),
            ("io.kubernetes.cri-o.TTY", "false"),
            ("io.podman.annotations.autoremove", "TRUE"),
            ("org.opencontainers.image.stopSignal", "15"),
        ]);
        assert_eq!(from_annotations(&podman), Some(engine_only("podman")));
        assert_eq!(
            from_annotations(&annotations(&[("gpupin.count", "1")])),
            None
        );
    }

    #[test]
    fn containerds_runc_root() {
        assert!(is_containerd_root(Path::new(
            "/run/containerd/runc/default"
        )));
        assert!(is_containerd_root(Path::new(
            "/var/run/containerd/runc/k8s.io"
        )));
        assert!(!is_containerd_root(Path::new(
            "/run/docker/runtime-runc/moby"
        )));
        assert!(!is_containerd_root(Path::new("/run/runc")));
    }

    #[test]
    fn docker_names_lose_their_slash() {
        let info = docker(Some("/trainer"), Some("my/trainer:latest"));
        assert_eq!(info.name.as_deref(), Some("trainer"));
        assert_eq!(info.image.as_deref(), Some("my/trainer:latest"));
        assert_eq!(docker(Some("/"), None), engine_only("docker"));
    }
}
