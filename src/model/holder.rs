//! Who holds GPUs: a holder's id (container ids and exec'd processes become file names in
//! the ledger, so they are validated before they touch the filesystem), its kind, the
//! person it belongs to and what an engine told about a container. Plain data that the
//! ledger stores and every layer above it names; and the key a request presents to take
//! GPUs within a holder (made and checked by the ledger's `within`).

use std::fmt;

/// A validated holder id: 1-128 characters of `[A-Za-z0-9_.-]`, starting with a letter
/// or digit. That covers Docker's 64-hex ids, podman's, runc's and CRI-O's, and excludes
/// anything that could name a path (`/`, `..`) or hide a file (leading `.`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid container id {0:?}: expected 1-128 characters of letters, digits, '_', '.', '-', starting with a letter or digit"
)]
pub struct BadHolderId(pub String);

pub(crate) const MAX_LEN: usize = 128;

/// How the holder ids gpupin makes itself begin: Slurm jobs' holds, the device plugin's,
/// podman's claims, unnamed jobs. A user may not choose them (`Ledger::allocate`).
pub(crate) const RESERVED_PREFIXES: &[&str] =
    &[SLURM_PREFIX, KUBE_PREFIX, CLAIM_PREFIX, EXEC_PREFIX];
/// A Slurm job's hold: `slurm-<job id>`, made by the prolog.
pub(crate) const SLURM_PREFIX: &str = "slurm-";
/// The device plugin's holds: `k8s-<digest>`.
pub(crate) const KUBE_PREFIX: &str = "k8s-";
/// podman's claims before its container has an id: `claim-<random hex>`.
pub(crate) const CLAIM_PREFIX: &str = "claim-";
/// A job that names no holder: `exec-<user>`.
pub const EXEC_PREFIX: &str = "exec-";

impl HolderId {
    pub fn new(id: &str) -> Result<HolderId, BadHolderId> {
        let ok = !id.is_empty()
            && id.len() <= MAX_LEN
            && id.as_bytes()[0].is_ascii_alphanumeric()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(HolderId(id.to_string()))
        } else {
            Err(BadHolderId(id.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The record's file name inside `holders/`.
    pub fn file_name(&self) -> String {
        format!("{}.json", self.0)
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What kind of holder a record is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HolderKind {
    #[default]
    Container,
    /// A process `gpupin exec` started.
    Exec,
    /// GPUs set aside by `gpupin hold`, with or without a process.
    Hold,
}

impl HolderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Container => "container",
            HolderKind::Exec => "exec",
            HolderKind::Hold => "hold",
        }
    }
}

/// The person a holder belongs to: whoever ran `gpupin exec`, or the user a hold was made
/// for. Containers have none: engines do not say who asked for them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub user: String,
    /// The user's groups when the record was made, for the group limits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// What the engine tells about a container; each part only where it is known.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ContainerInfo {
    /// docker, podman, containerd, runc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// A holder id cut to 12 characters, as docker shows container ids (64 hex digits): how
/// people know a container that has no name; shorter ids stay whole.
fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// `id` as a message shows it: an engine's long hex id (32 digits or more: Docker's,
/// containerd's, podman's) cut as `short_id` cuts it, any other id whole.
pub(crate) fn shown_id(id: &str) -> &str {
    let engine_id = id.len() >= 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    if engine_id { short_id(id) } else { id }
}

/// Hex digits of a holder's key: 128 bits, beyond guessing while a holder lives.
pub(crate) const KEY_HEX: usize = 32;

/// A holder's key as a request presents it. Its `Debug` hides it: requests are logged.
#[derive(Clone, PartialEq, Eq)]
pub struct WithinKey(String);

impl fmt::Debug for WithinKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WithinKey(..)")
    }
}

impl fmt::Display for WithinKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl WithinKey {
    /// A key as written after `HOLDER:`: 32 lowercase hex digits, else `None`.
    pub fn parse(text: &str) -> Option<WithinKey> {
        let ok = text.len() == KEY_HEX
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| WithinKey(text.to_string()))
    }

    /// The 32 hex digits, for the ledger's constant-time comparison.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_runtime_ids() {
        for id in ["c1", "a".repeat(64).as_str(), "web_1.worker-2", "4f2a"] {
            assert!(HolderId::new(id).is_ok(), "{id}");
        }
    }

    #[test]
    fn rejects_path_like_and_hidden_ids() {
        for id in [
            "",
            "../../etc",
            "a/b",
            ".hidden",
            "..",
            "-x",
            "a b",
            "x\n",
            &"a".repeat(129),
        ] {
            let err = HolderId::new(id).unwrap_err().to_string();
            assert!(err.contains("invalid container id"), "{err}");
        }
    }
}
