//! How many GPUs people may hold, and which (`[limits]` in the config). Limits apply to
//! holders that belong to a user who is not root: `gpupin exec` and holds a user makes
//! through `gpupin serve`. Containers have no known user and are not limited here.
//!
//! ```toml
//! [limits]
//! max_gpus_per_user = 2          # everyone, unless a users.NAME entry says otherwise
//! [limits.users.alice]
//! max_gpus = 4                   # alice's own limit, instead of max_gpus_per_user
//! [limits.groups.vision]
//! max_gpus = 4                   # all members of vision together
//! gpus = [0, 1, 2, 3]            # members may only use these (indices, UUIDs, bus ids)
//! ```

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_gpus_per_user: Option<u32>,
    /// Requests one user may have waiting in the queue at once (`gpupin.wait`); `None`:
    /// `DEFAULT_MAX_WAITING`. Containers have no user and are not counted.
    pub max_waiting_per_user: Option<u32>,
    #[serde(default)]
    pub users: BTreeMap<String, UserLimit>,
    #[serde(default)]
    pub groups: BTreeMap<String, GroupLimit>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserLimit {
    pub max_gpus: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupLimit {
    /// GPUs the group's members hold together, at most.
    pub max_gpus: Option<u32>,
    /// The GPUs its members may use; a user in several groups that name GPUs may use
    /// each group's. Groups that name none restrict nothing.
    pub gpus: Option<Vec<GpuKey>>,
}

/// A GPU as the config names it: an index, or a UUID or PCI bus id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum GpuKey {
    Index(u32),
    Name(String),
}

impl GpuKey {
    pub fn as_key(&self) -> String {
        match self {
            GpuKey::Index(i) => i.to_string(),
            GpuKey::Name(s) => s.clone(),
        }
    }
}

/// One limit that applies to a user, and where the config sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applicable {
    pub max_gpus: u32,
    /// The config key, as the refusal names it: `limits.max_gpus_per_user`.
    pub key: String,
    /// `None`: the user's own limit; `Some(group)`: a group's, shared by its members.
    pub group: Option<String>,
}

/// How many requests one user may have waiting, unless `max_waiting_per_user` says.
pub(crate) const DEFAULT_MAX_WAITING: u32 = 4;

impl Limits {
    /// Requests one user may have waiting in the queue at once.
    pub fn max_waiting(&self) -> u32 {
        self.max_waiting_per_user.unwrap_or(DEFAULT_MAX_WAITING)
    }

    pub fn is_empty(&self) -> bool {
        self == &Limits::default()
    }

    /// The limits on `user` (a member of `groups`): their own, then each group's.
    pub fn applicable(&self, user: &str, groups: &[String]) -> Vec<Applicable> {
        let mut out = Vec::new();
        let own = self.users.get(user).and_then(|u| u.max_gpus);
        if let Some(max) = own {
            out.push(Applicable {
                max_gpus: max,
                key: format!("limits.users.{user}.max_gpus"),
                group: None,
            });
        } else if let Some(max) = self.max_gpus_per_user {
            out.push(Applicable {
                max_gpus: max,
                key: "limits.max_gpus_per_user".into(),
                group: None,
            });
        }
        for group in groups {
            if let Some(max) = self.groups.get(group).and_then(|g| g.max_gpus) {
                out.push(Applicable {
                    max_gpus: max,
                    key: format!("limits.groups.{group}.max_gpus"),
                    group: Some(group.clone()),
                });
            }
        }
        out
    }

    /// The GPUs (as config keys) a member of `groups` may use; `None`: any.
    pub fn allowed_gpus(&self, groups: &[String]) -> Option<Vec<String>> {
        let named: Vec<&Vec<GpuKey>> = groups
            .iter()
            .filter_map(|g| self.groups.get(g).and_then(|g| g.gpus.as_ref()))
            .collect();
        if named.is_empty() {
            return None;
        }
        Some(named.into_iter().flatten().map(GpuKey::as_key).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(text: &str) -> Limits {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_users_own_limit_replaces_the_default_and_groups_add_theirs() {
        let l = limits(
            "max_gpus_per_user = 2\n[users.alice]\nmax_gpus = 4\n[groups.vision]\nmax_gpus = 3\ngpus = [0, \"GPU-x\"]\n",
        );
        let keys = |u: &str, g: &[&str]| -> Vec<(u32, String)> {
            let groups: Vec<String> = g.iter().map(|s| s.to_string()).collect();
            l.applicable(u, &groups)
                .into_iter()
                .map(|a| (a.max_gpus, a.key))
                .collect()
        };
        assert_eq!(
            keys("alice", &[]),
            [(4, "limits.users.alice.max_gpus".into())]
        );
        assert_eq!(
            keys("bob", &["vision", "other"]),
            [
                (2, "limits.max_gpus_per_user".into()),
                (3, "limits.groups.vision.max_gpus".into())
            ]
        );
        assert_eq!(
            l.allowed_gpus(&["vision".into()]),
            Some(vec!["0".into(), "GPU-x".into()])
        );
        assert_eq!(l.allowed_gpus(&["other".into()]), None);
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<Limits>("max_gpu = 1").is_err());
        assert!(toml::from_str::<Limits>("[users.a]\nmax = 1").is_err());
    }
}
