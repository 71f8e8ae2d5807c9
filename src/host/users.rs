//! Who a local user is: name and groups for a uid, or the uid of a name, through the
//! system's user database (NSS: /etc/passwd, LDAP, sssd alike). Only the dynamically
//! linked `gpupin` uses this: NSS modules are loaded at run time, which a static binary
//! must not do.

use crate::model::holder::Owner;
use nix::unistd::{Gid, Group, Uid, User};
use std::ffi::CString;

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("unknown user {0:?}: expected a user name or uid of this machine")]
    UnknownName(String),
    #[error("uid {0} has no entry in the user database")]
    UnknownUid(u32),
    #[error("looking up uid {uid} in the user database: {source}")]
    Lookup {
        uid: u32,
        #[source]
        source: nix::Error,
    },
}

/// This process's user name, else its uid: how an admin's `usermod` names the caller.
pub(crate) fn own_name() -> String {
    let uid = nix::unistd::getuid().as_raw();
    name_of(uid).unwrap_or_else(|| uid.to_string())
}

/// The name of `uid` in the user database; `None` where it has none or the lookup
/// failed (callers fall back to the uid or /etc/passwd).
pub(crate) fn name_of(uid: u32) -> Option<String> {
    User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// The owner record of `uid`: name and the names of all its groups (primary first).
pub fn owner_of(uid: u32) -> Result<Owner, UserError> {
    let user = User::from_uid(Uid::from_raw(uid))
        .map_err(|source| UserError::Lookup { uid, source })?
        .ok_or(UserError::UnknownUid(uid))?;
    Ok(Owner {
        uid,
        groups: group_names(&user.name, user.gid),
        user: user.name,
    })
}

/// The owner record of a user named by name or uid (`gpupin hold --user`).
pub fn owner_named(name: &str) -> Result<Owner, UserError> {
    if let Ok(uid) = name.parse::<u32>() {
        return owner_of(uid);
    }
    let user = User::from_name(name)
        .ok()
        .flatten()
        .ok_or_else(|| UserError::UnknownName(name.to_string()))?;
    owner_of(user.uid.as_raw())
}

/// Names of the groups `user` is in. A group without a name (a gid with no entry) is left
/// out: limits name groups.
fn group_names(user: &str, primary: Gid) -> Vec<String> {
    let gids = CString::new(user)
        .ok()
        .and_then(|name| nix::unistd::getgrouplist(&name, primary).ok())
        .unwrap_or_else(|| vec![primary]);
    let mut names: Vec<String> = Vec::new();
    for gid in std::iter::once(primary).chain(gids) {
        if let Ok(Some(group)) = Group::from_gid(gid)
            && !names.contains(&group.name)
        {
            names.push(group.name);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_uid_0_in_group_root() {
        let root = owner_of(0).unwrap();
        assert_eq!(root.user, "root");
        assert_eq!(root.groups.first().map(String::as_str), Some("root"));
        assert_eq!(owner_named("root").unwrap(), root);
        assert_eq!(owner_named("0").unwrap(), root);
    }

    #[test]
    fn an_unknown_name_is_one_line_naming_it() {
        let err = owner_named("no-such-user-gpupin").unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown user \"no-such-user-gpupin\": expected a user name or uid of this machine"
        );
    }
}
