//! A POSIX access ACL as the Linux kernel stores it in the `system.posix_acl_access`
//! xattr (include/uapi/linux/posix_acl_xattr.h): a little-endian header `u32 version = 2`,
//! then one `{u16 tag, u16 perm, u32 id}` per entry, sorted by tag and, among named
//! entries, by id; the `*_OBJ`, mask and other entries carry id `u32::MAX`. A mask entry
//! is required whenever a named entry exists (acl(5)).

use std::collections::BTreeMap;

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;
const ENTRY_LEN: usize = 8;

/// Read and write: what a holder's user gets on its GPU's node.
pub(crate) const RW: u16 = 0o6;

/// An access ACL: the three entries every file has, the named entries, and the mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acl {
    pub owner: u16,
    pub users: BTreeMap<u32, u16>,
    pub group: u16,
    pub groups: BTreeMap<u32, u16>,
    pub mask: Option<u16>,
    pub other: u16,
}

/// Why bytes are no access ACL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AclFormatError {
    #[error("{len} bytes are no POSIX ACL (a 4-byte header, then 8 bytes an entry)")]
    Length { len: usize },
    #[error("ACL version {0}, expected 2")]
    Version(u32),
    #[error("unknown ACL entry tag {0:#x}")]
    Tag(u16),
    #[error("the ACL has {0} entries for the same tag and id")]
    Repeated(u16),
    #[error("the ACL lacks its {0} entry")]
    Missing(&'static str),
}

impl Acl {
    /// The ACL a file without one acts by: its mode's owner, group and other bits.
    pub(crate) fn from_mode(mode: u32) -> Acl {
        Acl {
            owner: ((mode >> 6) & 7) as u16,
            users: BTreeMap::new(),
            group: ((mode >> 3) & 7) as u16,
            groups: BTreeMap::new(),
            mask: None,
            other: (mode & 7) as u16,
        }
    }

    /// This ACL with exactly `uids` as its named users, each with `perm`; named groups
    /// kept. The mask becomes the union of the group class, as setfacl computes it, and
    /// goes when no named entry is left: a minimal ACL, which the kernel folds back into
    /// the mode (group bits from the group entry again) and removes.
    pub(crate) fn with_users(&self, uids: impl IntoIterator<Item = u32>, perm: u16) -> Acl {
        let users: BTreeMap<u32, u16> = uids.into_iter().map(|u| (u, perm)).collect();
        let named = users.values().chain(self.groups.values());
        let mask = named.fold(None, |m: Option<u16>, p| Some(m.unwrap_or(self.group) | p));
        Acl {
            users,
            mask,
            ..self.clone()
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        let mut push = |tag: u16, perm: u16, id: u32| {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        };
        push(USER_OBJ, self.owner, UNDEFINED_ID);
        for (&uid, &perm) in &self.users {
            push(USER, perm, uid);
        }
        push(GROUP_OBJ, self.group, UNDEFINED_ID);
        for (&gid, &perm) in &self.groups {
            push(GROUP, perm, gid);
        }
        if let Some(mask) = self.mask {
            push(MASK, mask, UNDEFINED_ID);
        }
        push(OTHER, self.other, UNDEFINED_ID);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Acl, AclFormatError> {
        if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(ENTRY_LEN) {
            return Err(AclFormatError::Length { len: bytes.len() });
        }
        let version = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(AclFormatError::Version(version));
        }
        let (mut owner, mut group, mut mask, mut other) = (None, None, None, None);
        let (mut users, mut groups) = (BTreeMap::new(), BTreeMap::new());
        for entry in bytes[4..].chunks_exact(ENTRY_LEN) {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let perm = u16::from_le_bytes([entry[2], entry[3]]);
            let id = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
            let fresh = match tag {
                USER_OBJ => owner.replace(perm).is_none(),
                USER => users.insert(id, perm).is_none(),
                GROUP_OBJ => group.replace(perm).is_none(),
                GROUP => groups.insert(id, perm).is_none(),
                MASK => mask.replace(perm).is_none(),
                OTHER => other.replace(perm).is_none(),
                _ => return Err(AclFormatError::Tag(tag)),
            };
            if !fresh {
                return Err(AclFormatError::Repeated(tag));
            }
        }
        let acl = Acl {
            owner: owner.ok_or(AclFormatError::Missing("owner (user::)"))?,
            users,
            group: group.ok_or(AclFormatError::Missing("owning group (group::)"))?,
            groups,
            mask,
            other: other.ok_or(AclFormatError::Missing("other (other::)"))?,
        };
        if acl.mask.is_none() && !(acl.users.is_empty() && acl.groups.is_empty()) {
            return Err(AclFormatError::Missing("mask (mask::)"));
        }
        Ok(acl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `setfacl -m u:65534:rw` on a node made `mknod -m 600`, as the kernel stored it
    /// (read back with getxattr on ext4).
    const SETFACL_ONE_USER: &str =
        "0200000001000600ffffffff02000600feff000004000000ffffffff10000600ffffffff20000000ffffffff";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn one_user_on_a_root_only_node_encodes_as_setfacl_writes_it() {
        let acl = Acl::from_mode(0o600).with_users([65534], RW);
        assert_eq!(hex(&acl.encode()), SETFACL_ONE_USER);
        assert_eq!(acl.mask, Some(RW));
    }

    #[test]
    fn decode_reads_back_what_encode_wrote() {
        let mut acl = Acl::from_mode(0o640).with_users([1002, 1001, 7], RW);
        acl.groups.insert(44, 0o4);
        acl = acl.with_users([1001, 1002], RW);
        assert_eq!(Acl::decode(&acl.encode()).unwrap(), acl);
        let ids: Vec<u32> = acl.users.keys().copied().collect();
        assert_eq!(ids, [1001, 1002]);
    }

    #[test]
    fn no_users_left_gives_the_minimal_acl_of_the_mode() {
        let acl = Acl::from_mode(0o600).with_users([1000], RW);
        let none = acl.with_users([], RW);
        assert_eq!(none, Acl::from_mode(0o600));
        assert_eq!(none.encode().len(), 4 + 3 * 8);
    }

    #[test]
    fn an_admins_named_group_stays_and_keeps_the_mask() {
        let mut acl = Acl::from_mode(0o600);
        acl.groups.insert(44, 0o6);
        let acl = acl.with_users([], RW);
        assert_eq!(acl.mask, Some(0o6));
        assert_eq!(acl.groups.get(&44), Some(&0o6));
    }

    #[test]
    fn bad_bytes_are_refused_with_what_is_wrong() {
        let good = Acl::from_mode(0o600).with_users([5], RW).encode();
        assert!(matches!(
            Acl::decode(&good[..good.len() - 1]),
            Err(AclFormatError::Length { .. })
        ));
        let mut v1 = good.clone();
        v1[0] = 1;
        assert_eq!(Acl::decode(&v1), Err(AclFormatError::Version(1)));
        let mut no_mask = Acl::from_mode(0o600).with_users([5], RW);
        no_mask.mask = None;
        assert_eq!(
            Acl::decode(&no_mask.encode()),
            Err(AclFormatError::Missing("mask (mask::)"))
        );
        let mut twice = good.clone();
        twice.extend_from_slice(&good[4..12]);
        assert_eq!(Acl::decode(&twice), Err(AclFormatError::Repeated(USER_OBJ)));
        let mut unknown = good;
        unknown[4] = 0x40;
        assert_eq!(Acl::decode(&unknown), Err(AclFormatError::Tag(0x40)));
    }
}
