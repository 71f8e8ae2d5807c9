//! Kubernetes pods through a CRI runtime handler (containerd's `gpupin` runtime, CRI-O's).
//!
//! A pod's annotations that the runtime allow-lists (`pod_annotations = ["gpupin.*"]`)
//! are copied into the spec of every container of the pod, the sandbox (pause) container
//! included. So:
//! - the sandbox never asks for GPUs: it only holds the pod's namespaces;
//! - a pod-level request is each container's own request: a pod annotated
//!   `gpupin.count=1` with two containers holds two GPUs, one per container;
//! - `gpupin.containers=trainer,eval` limits the annotation request to the containers of
//!   those names (the others ask for nothing by annotation).

use crate::input::request::{RequestError, invalid_value};
use std::collections::HashMap;

/// The annotation naming the containers a pod's request is for.
pub(super) const CONTAINERS_ANNOTATION: &str = crate::model::names::annotation!("containers");

/// How containerd's CRI and CRI-O mark a pod's sandbox container.
const SANDBOX_MARKS: &[(&str, &str)] = &[
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
];

/// Where containerd's CRI and CRI-O put the container's name (its name in the pod spec).
const NAME_KEYS: &[&str] = &[
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
];

const CONTAINERS_EXPECTED: &str =
    "expected a comma-separated list of container names (letters, digits, '-', '.', '_')";

/// Whether these are a pod sandbox's annotations.
pub(super) fn is_sandbox(annotations: &HashMap<String, String>) -> bool {
    SANDBOX_MARKS
        .iter()
        .any(|(k, v)| annotations.get(*k).is_some_and(|got| got == v))
}

/// Whether the pod's annotation request is for this container: yes without
/// `gpupin.containers`, else only when its name is listed.
pub(super) fn annotation_request_applies(
    annotations: &HashMap<String, String>,
) -> Result<bool, RequestError> {
    let Some(list) = annotations.get(CONTAINERS_ANNOTATION) else {
        return Ok(true);
    };
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    let valid = names.iter().all(|n| {
        !n.is_empty()
            && n.len() <= 253
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    });
    if !valid {
        return Err(invalid_value(
            CONTAINERS_ANNOTATION,
            list,
            CONTAINERS_EXPECTED,
        ));
    }
    let name = NAME_KEYS.iter().find_map(|k| annotations.get(*k));
    Ok(name.is_some_and(|n| names.contains(&n.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sandboxes_of_containerd_and_cri_o_are_told_apart() {
        assert!(is_sandbox(&ann(&[(
            "io.kubernetes.cri.container-type",
            "sandbox"
        )])));
        assert!(is_sandbox(&ann(&[(
            "io.kubernetes.cri-o.ContainerType",
            "sandbox"
        )])));
        assert!(!is_sandbox(&ann(&[(
            "io.kubernetes.cri.container-type",
            "container"
        )])));
        assert!(!is_sandbox(&ann(&[])));
    }

    #[test]
    fn gpupin_containers_picks_containers_by_name() {
        let pod = |name: &str| {
            ann(&[
                ("gpupin.containers", "trainer, eval"),
                ("io.kubernetes.cri.container-name", name),
            ])
        };
        assert!(annotation_request_applies(&pod("trainer")).unwrap());
        assert!(annotation_request_applies(&pod("eval")).unwrap());
        assert!(!annotation_request_applies(&pod("sidecar")).unwrap());
        assert!(annotation_request_applies(&ann(&[])).unwrap());
        let err = annotation_request_applies(&ann(&[("gpupin.containers", "a b")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid gpupin.containers=\"a b\": expected a comma-separated list of container names (letters, digits, '-', '.', '_')"
        );
    }
}
