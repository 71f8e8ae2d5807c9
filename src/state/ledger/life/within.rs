//! Keys to a holder's GPUs. Taking GPUs from inside another holder (`gpupin.within`,
//! `GPUPIN_WITHIN`, `--within`) is a capability, not a name: holder ids are public
//! (`gpupin status`, the record files), and an image's `ENV` or a pod spec can write any
//! of them. A request that gpupin cannot tie to a person (a container) or that is not the
//! holder's owner's must present the holder's key, `HOLDER:KEY`.
//!
//! A key is an HMAC of the record's identity (id, creation time and a random salt of its
//! own) under a secret of this node, kept in the state dir readable by root alone. So the
//! ledger stores nothing secret in the world-readable records, yet root (or `gpupin serve`
//! for the holder's owner) can hand the key out again at any time, e.g. to a Slurm
//! TaskProlog; and a holder made anew under the same name gets a new key.

use crate::base::atomic::{self, Durability};
use crate::base::safe_open::{self, Links};
use crate::model::holder::HolderId;
use crate::model::holder::{KEY_HEX, WithinKey};
use crate::state::ledger::record::Record;
use crate::state::ledger::store;
use crate::state::ledger::{Ledger, LedgerError};
use hmac::{KeyInit, Mac};
use sha2::Sha256;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The node's secret, in the state dir: root only.
pub(crate) const SECRET_FILE: &str = "within.secret";
const SECRET_MODE: u32 = 0o600;
const SECRET_BYTES: usize = 32;
/// Bytes of a record's salt.
pub(in crate::state::ledger) const SALT_BYTES: usize = 8;

/// The node's secret, read (or made, the first time) under the ledger's lock.
pub(in crate::state::ledger) struct NodeSecret(Vec<u8>);

impl NodeSecret {
    /// Reads `<dir>/within.secret`, making it when missing. Refuses one that others may
    /// read or that is not this user's: a key anyone could compute guards nothing.
    pub(crate) fn load_or_create(dir: &Path) -> Result<NodeSecret, LedgerError> {
        let path = dir.join(SECRET_FILE);
        match safe_open::open(&path, Links::Refuse) {
            Ok(file) => {
                let meta = file.metadata().map_err(|source| io(&path, source))?;
                if meta.mode() & 0o077 != 0 || meta.uid() != rustix::process::geteuid().as_raw() {
                    return Err(LedgerError::UnsafeStateFile {
                        path,
                        reason: "it must be owned by root with mode 600 (remove it: gpupin makes a new one, and keys given out so far stop working)",
                    });
                }
                let text =
                    safe_open::read_file(file, meta.len()).map_err(|source| io(&path, source))?;
                let secret = std::str::from_utf8(&text)
                    .ok()
                    .and_then(|t| unhex(t.trim()))
                    .filter(|s| s.len() == SECRET_BYTES)
                    .ok_or(LedgerError::UnsafeStateFile {
                        path,
                        reason: "it is no secret gpupin wrote (remove it: gpupin makes a new one)",
                    })?;
                Ok(NodeSecret(secret))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let secret = random(SECRET_BYTES).map_err(|source| io(&path, source))?;
                let text = format!("{}\n", hex(&secret));
                atomic::replace(&path, text.as_bytes(), SECRET_MODE, Durability::Renamed)
                    .map_err(|e| io(&e.path, e.source))?;
                Ok(NodeSecret(secret))
            }
            Err(source) => Err(io(&path, source)),
        }
    }

    /// The key of `record`.
    pub(crate) fn key_for(&self, record: &Record) -> WithinKey {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(b"gpupin within key v1\0");
        mac.update(record.id.as_bytes());
        mac.update(b"\0");
        mac.update(record.created_at.to_string().as_bytes());
        mac.update(b"\0");
        mac.update(record.salt.as_bytes());
        let tag = mac.finalize().into_bytes();
        WithinKey::parse(&hex(&tag)[..KEY_HEX]).expect("hex of a tag is a key")
    }

    /// Whether `key` is `record`'s, compared in constant time.
    pub(crate) fn opens(&self, record: &Record, key: &WithinKey) -> bool {
        super::claim::same_secret(self.key_for(record).as_str(), key.as_str())
    }
}

/// A fresh salt for a new record.
pub(in crate::state::ledger) fn new_salt() -> Result<String, LedgerError> {
    random(SALT_BYTES)
        .map(|b| hex(&b))
        .map_err(|source| LedgerError::Io {
            action: "reading random bytes for",
            path: "a holder's key".into(),
            source,
        })
}

fn io(path: &Path, source: std::io::Error) -> LedgerError {
    LedgerError::Io {
        action: "reading",
        path: path.to_path_buf(),
        source,
    }
}

fn random(len: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    let mut filled = 0;
    // getrandom(2) may return fewer bytes than asked (a signal); a key without real
    // randomness would be guessable, so failure is an error, never a fallback.
    while filled < len {
        filled +=
            rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Ledger {
    /// The key that lets others take from `holder`'s GPUs (`gpupin.within=HOLDER:KEY`):
    /// for root, who hands it to the holder's owner (`gpupin key`, a Slurm TaskProlog).
    /// `None`: no live holder of that name.
    pub fn key(&self, holder: &HolderId) -> Result<Option<(Record, WithinKey)>, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        let Some(record) = store::read_holder(&self.dir, holder)?.filter(|r| !self.is_stale(r))
        else {
            return Ok(None);
        };
        let key = NodeSecret::load_or_create(&self.dir)?.key_for(&record);
        Ok(Some((record, key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::testing::record;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_opens_only_its_own_record() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = NodeSecret::load_or_create(tmp.path()).unwrap();
        let mut a = record("res-7", &["GPU-0"]);
        a.salt = "0011223344556677".into();
        let key = secret.key_for(&a);
        assert!(secret.opens(&a, &key));
        assert_eq!(WithinKey::parse(&key.to_string()), Some(key.clone()));
        // Another holder, the same holder made again later or with another salt: no.
        let mut b = a.clone();
        b.id = "res-8".into();
        assert!(!secret.opens(&b, &key));
        let mut again = a.clone();
        again.created_at += 1;
        assert!(!secret.opens(&again, &key));
        let mut salted = a.clone();
        salted.salt = "0011223344556678".into();
        assert!(!secret.opens(&salted, &key));
        // The same record under another node's secret: no.
        let other = tempfile::tempdir().unwrap();
        let theirs = NodeSecret::load_or_create(other.path()).unwrap();
        assert!(!theirs.opens(&a, &key));
        // The secret is kept: a second load gives the same keys.
        let reloaded = NodeSecret::load_or_create(tmp.path()).unwrap();
        assert!(reloaded.opens(&a, &key));
    }

    #[test]
    fn the_secret_is_root_only_and_a_readable_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        NodeSecret::load_or_create(tmp.path()).unwrap();
        let path = tmp.path().join(SECRET_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = NodeSecret::load_or_create(tmp.path()).err().unwrap();
        assert!(err.to_string().contains("mode 600"), "{err}");
    }

    #[test]
    fn a_linked_or_garbled_secret_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(SECRET_FILE);
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(NodeSecret::load_or_create(tmp.path()).is_err());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "not hex\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = NodeSecret::load_or_create(tmp.path()).err().unwrap();
        assert!(err.to_string().contains("no secret gpupin wrote"), "{err}");
    }

    #[test]
    fn keys_are_32_lowercase_hex_digits() {
        assert!(WithinKey::parse(&"a".repeat(32)).is_some());
        for bad in [
            "",
            "A".repeat(32).as_str(),
            "a".repeat(31).as_str(),
            "g".repeat(32).as_str(),
        ] {
            assert!(WithinKey::parse(bad).is_none(), "{bad}");
        }
        assert_eq!(
            format!("{:?}", WithinKey::parse(&"a".repeat(32)).unwrap()),
            "WithinKey(..)"
        );
    }
}
