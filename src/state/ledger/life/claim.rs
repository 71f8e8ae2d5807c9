//! Claim tokens. GPUs assigned before their container has a pid (the Docker shim at
//! create, podman's precreate) are held under a holder id until the prestart hook binds
//! them to the container. The spec gpupin wrote carries `gpupin.claim=<holder>:<secret>`;
//! the record keeps only the secret's SHA-256. Holder ids are public (`gpupin status`,
//! the record files), the secret never leaves the spec, so no container can bind a claim
//! that was not made for it by writing annotations of its own.

use crate::model::holder::HolderId;
use sha2::{Digest, Sha256};
use std::fmt;

/// 128 random bits: far beyond guessing within a claim's grace period.
const SECRET_BYTES: usize = 16;

#[derive(Clone, PartialEq, Eq)]
pub struct ClaimToken {
    holder: HolderId,
    secret: String,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    #[error("reading random bytes for a claim")]
    Random(#[source] std::io::Error),
    #[error(
        "invalid gpupin.claim {0:?}: expected HOLDER:SECRET as written by gpupin (32 hex digits)"
    )]
    Malformed(String),
}

impl ClaimToken {
    /// A fresh token for GPUs held under `holder`.
    pub fn new(holder: HolderId) -> Result<ClaimToken, ClaimError> {
        Ok(ClaimToken {
            holder,
            secret: random_hex(SECRET_BYTES)?,
        })
    }

    /// A token for a claim that has no container id yet (precreate): `claim-` and 64
    /// random bits name it.
    pub fn new_claim() -> Result<ClaimToken, ClaimError> {
        let id = format!("{}{}", crate::model::holder::CLAIM_PREFIX, random_hex(8)?);
        ClaimToken::new(HolderId::new(&id).expect("claim ids are valid holder ids"))
    }

    /// Reads the `gpupin.claim` annotation. The message never repeats a well-formed secret.
    pub fn parse(text: &str) -> Result<ClaimToken, ClaimError> {
        let malformed = || ClaimError::Malformed(text.to_string());
        let (holder, secret) = text.split_once(':').ok_or_else(malformed)?;
        let hex = secret.len() == 2 * SECRET_BYTES
            && secret
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(malformed());
        }
        let holder = HolderId::new(holder).map_err(|_| malformed())?;
        Ok(ClaimToken {
            holder,
            secret: secret.to_string(),
        })
    }

    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// What the record keeps: the secret's SHA-256 in hex.
    pub fn digest(&self) -> String {
        hex(&Sha256::digest(self.secret.as_bytes()))
    }

    /// Whether `digest` (from a record) was made from this token's secret. Compared in
    /// constant time, as any check of a secret should be.
    pub fn matches(&self, digest: Option<&str>) -> bool {
        let Some(digest) = digest else {
            return false;
        };
        same_secret(&self.digest(), digest)
    }

    /// The annotation's value, secret included: for the spec only, never for a log.
    pub fn annotation(&self) -> String {
        format!("{}:{}", self.holder, self.secret)
    }
}

/// Debug output names the holder only: a token must not leak through a log line.
impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimToken")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// Whether two secrets (or digests of them) are equal, compared in constant time, as any
/// check of a secret should be: how long it takes says nothing of where they differ.
pub(in crate::state::ledger) fn same_secret(ours: &str, theirs: &str) -> bool {
    ours.len() == theirs.len()
        && ours
            .bytes()
            .zip(theirs.bytes())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

fn random_hex(len: usize) -> Result<String, ClaimError> {
    let mut bytes = vec![0u8; len];
    let mut filled = 0;
    // getrandom(2) may return fewer bytes than asked (a signal); a claim without real
    // randomness would be guessable, so failure is an error, never a fallback.
    while filled < len {
        let n =
            rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())
                .map_err(|e| ClaimError::Random(e.into()))?;
        filled += n;
    }
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_round_trips_and_matches_only_its_own_digest() {
        let token = ClaimToken::new_claim().unwrap();
        assert!(token.holder().as_str().starts_with("claim-"));
        let parsed = ClaimToken::parse(&token.annotation()).unwrap();
        assert_eq!(parsed, token);
        assert!(parsed.matches(Some(&token.digest())));
        let other = ClaimToken::new(token.holder().clone()).unwrap();
        assert!(!other.matches(Some(&token.digest())));
        assert!(!token.matches(None));
    }

    /// Differences in two places that cancel out (the same bits flipped) are still a
    /// difference.
    #[test]
    fn secrets_differing_anywhere_are_not_the_same() {
        let ours = "0123456789abcdef";
        assert!(same_secret(ours, ours));
        assert!(!same_secret(ours, "1023456789abcdef"), "'0'^'1' twice");
        assert!(!same_secret(ours, "0123456789abcdee"));
        assert!(!same_secret(ours, "0123456789abcde"));
        assert!(!same_secret("", "0"));
    }

    #[test]
    fn a_holder_id_alone_or_a_bad_secret_is_malformed() {
        let holder = "claim-0123456789abcdef";
        for bad in [
            holder.to_string(),
            format!("{holder}:"),
            format!("{holder}:{}", "A".repeat(32)),
            format!("{holder}:{}", "0".repeat(31)),
            format!("../x:{}", "0".repeat(32)),
            "\n".to_string(),
        ] {
            let err = ClaimToken::parse(&bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid gpupin.claim"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn debug_output_hides_the_secret() {
        let token = ClaimToken::new_claim().unwrap();
        let secret = token.annotation().split_once(':').unwrap().1.to_string();
        let debug = format!("{token:?}");
        assert!(!debug.contains(&secret), "{debug}");
        assert!(debug.contains(token.holder().as_str()), "{debug}");
    }
}
