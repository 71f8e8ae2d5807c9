//! The `policy` setting (and a request's `gpupin.policy`): which of `policy/`'s pure
//! policies chooses, by name. The match from a name to its policy is here, with the
//! setting; `policy/` offers the policies themselves.

use crate::policy::{Policy, load, pack, spread, topology};

/// The policies a request or the config can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PolicyName {
    /// The best-connected free GPUs (NVLink, then PCIe distance), leaving the
    /// best-connected ones free for later; like `pack` where links are unknown.
    #[default]
    Topology,
    /// Lowest-numbered free GPUs first, keeping the high ones free for big jobs.
    Pack,
    /// Rotate through the GPUs, starting after the last one handed out, so wear and heat spread.
    Spread,
    /// Lowest utilization first, then most free memory (live figures; `pack` without them).
    LeastLoaded,
    /// Most free memory first (live figures; `pack` without them).
    MostFree,
}

impl PolicyName {
    /// Every policy, in the order error messages list them.
    pub const ALL: [PolicyName; 5] = [
        PolicyName::Topology,
        PolicyName::Pack,
        PolicyName::Spread,
        PolicyName::LeastLoaded,
        PolicyName::MostFree,
    ];

    /// A literal so that it can sit in other `const`s and `#[error]`s; a test keeps it equal
    /// to `ALL`.
    pub const EXPECTED: &'static str =
        "expected one of topology, pack, spread, least-loaded, most-free";

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Topology => "topology",
            PolicyName::Pack => "pack",
            PolicyName::Spread => "spread",
            PolicyName::LeastLoaded => "least-loaded",
            PolicyName::MostFree => "most-free",
        }
    }

    pub fn policy(self) -> &'static dyn Policy {
        match self {
            PolicyName::Topology => &topology::Topology,
            PolicyName::Pack => &pack::Pack,
            PolicyName::Spread => &spread::Spread,
            PolicyName::LeastLoaded => &load::LeastLoaded,
            PolicyName::MostFree => &load::MostFree,
        }
    }

    /// Whether the policy reads `PolicyInput::live`, so the caller should fetch live
    /// figures (NVML is slow to open: only ask when this is true).
    pub fn needs_live(self) -> bool {
        matches!(self, PolicyName::LeastLoaded | PolicyName::MostFree)
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown policy {0:?}: {expected}", expected = PolicyName::EXPECTED)]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for PolicyName {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_lists_every_policy_in_order() {
        let names: Vec<&str> = PolicyName::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            PolicyName::EXPECTED,
            format!("expected one of {}", names.join(", "))
        );
    }

    #[test]
    fn names_agree_across_fromstr_and_serde() {
        for p in PolicyName::ALL {
            assert_eq!(p.as_str().parse::<PolicyName>().unwrap(), p);
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("{:?}", p.as_str())
            );
        }
        let err = "best".parse::<PolicyName>().unwrap_err().to_string();
        assert!(err.contains(PolicyName::EXPECTED), "{err}");
    }

    #[test]
    fn topology_is_the_default_and_only_load_policies_need_live() {
        assert_eq!(PolicyName::default(), PolicyName::Topology);
        let live: Vec<_> = PolicyName::ALL
            .into_iter()
            .filter(|p| p.needs_live())
            .collect();
        assert_eq!(live, [PolicyName::LeastLoaded, PolicyName::MostFree]);
    }
}
