//! What a container asks for, read from its OCI annotations (`gpupin.*`) or, when it has
//! none, its process env (`GPUPIN_*`). All validation of user input happens here, so that
//! nothing past this point sees a count of 0 or a policy it does not know.

use crate::policy::PolicyName;
use std::collections::HashMap;

/// Annotation keys and the env names that stand in for them.
pub const KEYS: &[(&str, &str)] = &[
    ("gpupin.count", "GPUPIN_COUNT"),
    ("gpupin.devices", "GPUPIN_DEVICES"),
    ("gpupin.policy", "GPUPIN_POLICY"),
];
pub const ANNOTATION_PREFIX: &str = "gpupin.";
/// Annotation gpupin itself writes into an edited spec: the UUIDs it assigned.
pub const ASSIGNED_ANNOTATION: &str = "gpupin.assigned";
/// Annotation of a spec edited at podman's precreate: the claim its GPUs are held under
/// until the prestart hook binds them to the container id.
pub const CLAIM_ANNOTATION: &str = "gpupin.claim";
/// Annotation of a spec whose precreate failed: the reason, for gpupin's prestart hook
/// to fail with (podman does not show a precreate hook's stderr).
pub const ERROR_ANNOTATION: &str = "gpupin.error";
/// Keys gpupin writes, not users: ignored when reading a request, so that a retried
/// create of an already edited spec reads the same request again.
pub const WRITTEN_BY_GPUPIN: &[&str] = &[ASSIGNED_ANNOTATION, CLAIM_ANNOTATION, ERROR_ANNOTATION];
pub const ENV_PREFIX: &str = "GPUPIN_";

/// Which GPUs are wanted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    Count(u32),
    /// Every GPU of the machine.
    All,
    /// Named GPUs: indices, UUIDs or PCI bus ids, as the user wrote them.
    Devices(Vec<String>),
}

/// Where a request was read from, for records and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Annotations,
    /// Docker labels (config.v2.json), read by the runtime shim.
    Labels,
    /// Docker's own GPU request (`--gpus`, compose device reservations) in hostconfig.json.
    DockerGpus,
    Env,
    Cli,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuRequest {
    pub selection: Selection,
    /// `None`: the configured default.
    pub policy: Option<PolicyName>,
    pub origin: Origin,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("invalid {key}={value:?}: {expected}")]
    Invalid {
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("unknown request key {key}: expected one of {}", known_keys(*.origin))]
    UnknownKey { key: String, origin: Origin },
    #[error("{count_key} and {devices_key} exclude each other: give one of them")]
    CountAndDevices {
        count_key: &'static str,
        devices_key: &'static str,
    },
    #[error("{policy_key} was given without {count_key} or {devices_key}")]
    PolicyAlone {
        policy_key: &'static str,
        count_key: &'static str,
        devices_key: &'static str,
    },
}

fn known_keys(origin: Origin) -> String {
    KEYS.iter()
        .map(|(a, e)| if origin == Origin::Env { *e } else { *a })
        .collect::<Vec<_>>()
        .join(", ")
}

const COUNT_EXPECTED: &str = "expected a positive integer or \"all\"";
const DEVICES_EXPECTED: &str =
    "expected a comma-separated list of GPU indices, GPU UUIDs or PCI bus ids";

/// Reads a request from OCI annotations. `Ok(None)`: no `gpupin.` key at all.
pub fn from_annotations(
    annotations: &HashMap<String, String>,
) -> Result<Option<GpuRequest>, RequestError> {
    from_keys(annotations, Origin::Annotations)
}

/// Reads a request from Docker labels, which use the annotation keys.
pub fn from_labels(labels: &HashMap<String, String>) -> Result<Option<GpuRequest>, RequestError> {
    from_keys(labels, Origin::Labels)
}

fn from_keys(
    map: &HashMap<String, String>,
    origin: Origin,
) -> Result<Option<GpuRequest>, RequestError> {
    let pairs = map
        .iter()
        .filter(|(k, _)| {
            k.starts_with(ANNOTATION_PREFIX) && !WRITTEN_BY_GPUPIN.contains(&k.as_str())
        })
        .map(|(k, v)| (k.as_str(), v.as_str()));
    parse(pairs, origin)
}

/// Reads a request from a process env (`KEY=VALUE` strings). The last occurrence of a
/// variable wins, as it does for the process itself.
pub fn from_env<S: AsRef<str>>(env: &[S]) -> Result<Option<GpuRequest>, RequestError> {
    let mut vars: Vec<(&str, &str)> = Vec::new();
    for entry in env {
        let Some((k, v)) = entry.as_ref().split_once('=') else {
            continue;
        };
        if k.starts_with(ENV_PREFIX) {
            vars.retain(|(seen, _)| *seen != k);
            vars.push((k, v));
        }
    }
    parse(vars.into_iter(), Origin::Env)
}

/// Builds a request from parts given on a command line (`gpupin pick`, tests).
pub fn from_parts(
    count: Option<&str>,
    devices: Option<&str>,
    policy: Option<&str>,
) -> Result<Option<GpuRequest>, RequestError> {
    let pairs = [
        ("gpupin.count", count),
        ("gpupin.devices", devices),
        ("gpupin.policy", policy),
    ];
    parse(
        pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))),
        Origin::Cli,
    )
}

fn key_name(annotation: &'static str, origin: Origin) -> &'static str {
    match origin {
        Origin::Env => KEYS.iter().find(|(a, _)| *a == annotation).unwrap().1,
        _ => annotation,
    }
}

fn parse<'a>(
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
    origin: Origin,
) -> Result<Option<GpuRequest>, RequestError> {
    let (mut count, mut devices, mut policy) = (None, None, None);
    let mut any = false;
    for (key, value) in pairs {
        let Some(&(annotation, _)) = KEYS
            .iter()
            .find(|(a, e)| key == if origin == Origin::Env { *e } else { *a })
        else {
            return Err(RequestError::UnknownKey {
                key: key.to_string(),
                origin,
            });
        };
        any = true;
        match annotation {
            "gpupin.count" => count = Some(parse_count(key, value)?),
            "gpupin.devices" => devices = Some(parse_devices(key, value)?),
            _ => policy = Some(parse_policy(key, value)?),
        }
    }
    if !any {
        return Ok(None);
    }
    let count_key = key_name("gpupin.count", origin);
    let devices_key = key_name("gpupin.devices", origin);
    let selection = match (count, devices) {
        (Some(_), Some(_)) => {
            return Err(RequestError::CountAndDevices {
                count_key,
                devices_key,
            });
        }
        (Some(c), None) => c,
        (None, Some(d)) => d,
        (None, None) => {
            return Err(RequestError::PolicyAlone {
                policy_key: key_name("gpupin.policy", origin),
                count_key,
                devices_key,
            });
        }
    };
    Ok(Some(GpuRequest {
        selection,
        policy,
        origin,
    }))
}

fn invalid(key: &str, value: &str, expected: &'static str) -> RequestError {
    RequestError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    }
}

fn parse_count(key: &str, value: &str) -> Result<Selection, RequestError> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("all") {
        return Ok(Selection::All);
    }
    // Digits only: `+2`, `2.0` and `0x2` are typos more often than intent.
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(key, value, COUNT_EXPECTED));
    }
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(Selection::Count(n)),
        _ => Err(invalid(key, value, COUNT_EXPECTED)),
    }
}

fn parse_devices(key: &str, value: &str) -> Result<Selection, RequestError> {
    let mut list: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim) {
        let well_formed = !item.is_empty()
            && item.len() <= 64
            && item
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':' || b == b'.');
        if !well_formed {
            return Err(invalid(key, value, DEVICES_EXPECTED));
        }
        if !list.iter().any(|seen| seen.eq_ignore_ascii_case(item)) {
            list.push(item.to_string());
        }
    }
    Ok(Selection::Devices(list))
}

fn parse_policy(key: &str, value: &str) -> Result<PolicyName, RequestError> {
    value.trim().parse().map_err(|_| RequestError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        expected: PolicyName::EXPECTED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> Result<Option<GpuRequest>, RequestError> {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_annotations(&map)
    }

    #[test]
    fn no_gpupin_key_is_no_request() {
        assert_eq!(ann(&[("org.opencontainers.x", "1")]).unwrap(), None);
        assert_eq!(from_env(&["PATH=/bin", "HOME=/"]).unwrap(), None);
    }

    #[test]
    fn count_from_annotation() {
        let r = ann(&[("gpupin.count", "2")]).unwrap().unwrap();
        assert_eq!(r.selection, Selection::Count(2));
        assert_eq!(r.origin, Origin::Annotations);
        assert_eq!(r.policy, None);
    }

    #[test]
    fn all_is_every_gpu() {
        assert_eq!(
            ann(&[("gpupin.count", "ALL")]).unwrap().unwrap().selection,
            Selection::All
        );
    }

    #[test]
    fn bad_counts_name_key_value_and_expectation() {
        for bad in ["0", "-1", "two", "", "2.0", "+2", "99999999999"] {
            let err = ann(&[("gpupin.count", bad)]).unwrap_err().to_string();
            assert!(err.contains("gpupin.count"), "{err}");
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains("positive integer"), "{err}");
        }
    }

    #[test]
    fn devices_list_is_parsed_and_deduplicated() {
        let r = ann(&[("gpupin.devices", "0, GPU-abc,00000000:17:00.0,0")])
            .unwrap()
            .unwrap();
        assert_eq!(
            r.selection,
            Selection::Devices(vec![
                "0".into(),
                "GPU-abc".into(),
                "00000000:17:00.0".into()
            ])
        );
    }

    #[test]
    fn malformed_devices_are_rejected() {
        for bad in ["", "0,,1", "../x", "0;1", "a b"] {
            let err = ann(&[("gpupin.devices", bad)]).unwrap_err().to_string();
            assert!(err.contains("gpupin.devices"), "{err}");
        }
    }

    #[test]
    fn count_and_devices_exclude_each_other() {
        let err = ann(&[("gpupin.count", "1"), ("gpupin.devices", "0")]).unwrap_err();
        assert!(matches!(err, RequestError::CountAndDevices { .. }));
    }

    #[test]
    fn unknown_policy_lists_known_ones() {
        let err = ann(&[("gpupin.count", "1"), ("gpupin.policy", "random")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"random\"") && err.contains("pack") && err.contains("spread"));
    }

    #[test]
    fn unknown_key_is_an_error_not_a_silent_default() {
        let err = ann(&[("gpupin.cuont", "1")]).unwrap_err().to_string();
        assert!(
            err.contains("gpupin.cuont") && err.contains("gpupin.count"),
            "{err}"
        );
    }

    #[test]
    fn gpupins_own_annotation_is_not_a_request_key() {
        let r = ann(&[("gpupin.count", "1"), (ASSIGNED_ANNOTATION, "GPU-x")])
            .unwrap()
            .unwrap();
        assert_eq!(r.selection, Selection::Count(1));
        assert_eq!(ann(&[(ASSIGNED_ANNOTATION, "GPU-x")]).unwrap(), None);
    }

    #[test]
    fn policy_alone_is_rejected() {
        assert!(matches!(
            ann(&[("gpupin.policy", "pack")]).unwrap_err(),
            RequestError::PolicyAlone { .. }
        ));
    }

    #[test]
    fn env_uses_env_names_and_last_occurrence_wins() {
        let r = from_env(&["GPUPIN_COUNT=1", "GPUPIN_POLICY=spread", "GPUPIN_COUNT=3"])
            .unwrap()
            .unwrap();
        assert_eq!(r.selection, Selection::Count(3));
        assert_eq!(r.policy, Some(PolicyName::Spread));
        assert_eq!(r.origin, Origin::Env);
        let err = from_env(&["GPUPIN_COUNT=-1"]).unwrap_err().to_string();
        assert!(err.contains("GPUPIN_COUNT=\"-1\""), "{err}");
    }
}
