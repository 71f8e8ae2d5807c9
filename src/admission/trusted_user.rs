//! Whose a container is, where the admin trusts a label to say it (`trusted_user_label`):
//! a spawner or platform (JupyterHub's DockerSpawner, a job portal) sets it, and users
//! cannot set labels themselves there. Engines do not say who started a container, and
//! anyone who may start one can write any label, so this is off by default; a container
//! that carries `gpupin.user` on a host that does not trust it is refused, so that a
//! spawner's limits never silently fail to apply.
//!
//! The user must be in /etc/passwd: the static hook and shim read the files database,
//! not NSS (`whose::files_owner`).

use crate::input::config::Config;
use crate::input::request::USER_LABEL;
use crate::model::holder::Owner;
use std::collections::HashMap;

#[derive(Debug, thiserror::Error)]
pub enum TrustedUserError {
    #[error(
        "label {key}={value:?} names no user of this host: expected a user name in /etc/passwd; fix the label, or add the user"
    )]
    Unknown { key: String, value: String },
    #[error(
        "label {USER_LABEL}={value:?} is not trusted on this host (trusted_user_label is not set): remove the label, or ask the admin to trust it"
    )]
    Untrusted { value: String },
}

/// The owner the container's trusted label names; `None` when the config trusts no label
/// or the container carries none. `labels`: its annotations and, for Docker, its labels.
pub(crate) fn owner(
    config: &Config,
    labels: &HashMap<String, String>,
) -> Result<Option<Owner>, TrustedUserError> {
    // Quoted with `{:?}` (control characters escaped) and cut: the container wrote it.
    let shown = |v: &str| v.chars().take(64).collect::<String>();
    let Some(key) = &config.trusted_user_label else {
        return match labels.get(USER_LABEL) {
            Some(value) => Err(TrustedUserError::Untrusted {
                value: shown(value),
            }),
            None => Ok(None),
        };
    };
    let Some(value) = labels.get(key) else {
        return Ok(None);
    };
    crate::host::whose::files_owner(value)
        .map(Some)
        .ok_or_else(|| TrustedUserError::Unknown {
            key: key.clone(),
            value: shown(value),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn trusting(key: Option<&str>) -> Config {
        Config {
            trusted_user_label: key.map(str::to_string),
            ..Config::default()
        }
    }

    #[test]
    fn a_trusted_label_names_the_owner() {
        let root = owner(
            &trusting(Some("hub.example.org/user")),
            &labels(&[("hub.example.org/user", "root")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!((root.uid, root.user.as_str()), (0, "root"));
        let none = owner(
            &trusting(Some("hub.example.org/user")),
            &labels(&[("gpupin.count", "1")]),
        );
        assert!(none.unwrap().is_none());
    }

    #[test]
    fn an_unknown_user_or_an_untrusted_label_is_refused_in_one_line() {
        let err = owner(
            &trusting(Some("gpupin.user")),
            &labels(&[("gpupin.user", "no-such-user\n")]),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "label gpupin.user=\"no-such-user\\n\" names no user of this host: expected a user name in /etc/passwd; fix the label, or add the user"
        );
        let err = owner(&trusting(None), &labels(&[("gpupin.user", "root")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("label gpupin.user=\"root\" is not trusted on this host"),
            "{err}"
        );
        // Another key is no claim of gpupin's: without trust it is just a label.
        assert!(
            owner(
                &trusting(None),
                &labels(&[("hub.example.org/user", "root")])
            )
            .unwrap()
            .is_none()
        );
    }
}
