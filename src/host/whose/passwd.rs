//! A uid's name from /etc/passwd. The static hook and shim must not load NSS modules
//! (`users` says why), so what they name is what the files database knows; a user only
//! LDAP or sssd knows is shown by uid there. The `gpupin` CLI asks NSS first.

use crate::base::safe_open::{self, Links};
use std::path::Path;

const PASSWD: &str = "/etc/passwd";

/// The name /etc/passwd gives `uid`, if any.
pub(crate) fn passwd_name(uid: u32) -> Option<String> {
    // Admins manage /etc/passwd with links at times (NixOS): followed; never a FIFO.
    let text = safe_open::read_to_string(Path::new(PASSWD), Links::Follow).ok()?;
    name_in(&text, uid)
}

const GROUP: &str = "/etc/group";

/// The owner record of the user `name` as the files database knows it: uid from
/// /etc/passwd, groups from /etc/group (the primary one first). For the static hook and
/// shim, where `users::owner_named` (NSS) must not run.
pub(crate) fn files_owner(name: &str) -> Option<crate::model::holder::Owner> {
    let passwd = safe_open::read_to_string(Path::new(PASSWD), Links::Follow).ok()?;
    let group = safe_open::read_to_string(Path::new(GROUP), Links::Follow).unwrap_or_default();
    owner_in(&passwd, &group, name)
}

fn owner_in(passwd: &str, group: &str, name: &str) -> Option<crate::model::holder::Owner> {
    let (uid, gid) = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            [n, _, uid, gid, ..] if *n == name => {
                Some((uid.parse().ok()?, gid.parse::<u32>().ok()?))
            }
            _ => None,
        }
    })?;
    let mut groups: Vec<String> = Vec::new();
    for line in group.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        let [group_name, _, id, members, ..] = fields.as_slice() else {
            continue;
        };
        let primary = id.parse::<u32>().ok() == Some(gid);
        let member = members.split(',').any(|m| m == name);
        if (primary || member) && !group_name.is_empty() && !groups.iter().any(|g| g == group_name)
        {
            match primary {
                true => groups.insert(0, group_name.to_string()),
                false => groups.push(group_name.to_string()),
            }
        }
    }
    Some(crate::model::holder::Owner {
        uid,
        user: name.to_string(),
        groups,
    })
}

fn name_in(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid && !name.is_empty()).then(|| crate::base::message::escape_controls(name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_entry_with_the_uid_names_it() {
        let text = "root:x:0:0:root:/root:/bin/bash\n# note\nbob:x:1000:1000::/home/bob:/bin/sh\nbobby:x:1000:1000::/:/bin/sh\n";
        assert_eq!(name_in(text, 1000).as_deref(), Some("bob"));
        assert_eq!(name_in(text, 0).as_deref(), Some("root"));
        assert_eq!(name_in(text, 5), None);
        assert_eq!(name_in(":x:5:5::/:/bin/sh\n", 5), None);
    }

    #[test]
    fn a_users_uid_and_groups_from_the_files() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1001:100::/home/alice:/bin/sh\n";
        let group = "root:x:0:\nusers:x:100:\nml:x:2000:bob,alice\nother:x:2001:alicex\n";
        let alice = owner_in(passwd, group, "alice").unwrap();
        assert_eq!((alice.uid, alice.user.as_str()), (1001, "alice"));
        assert_eq!(alice.groups, ["users", "ml"]);
        assert_eq!(owner_in(passwd, group, "alic"), None);
        assert_eq!(owner_in(passwd, group, "root").unwrap().uid, 0);
    }

    #[test]
    fn root_is_root_here() {
        assert_eq!(passwd_name(0).as_deref(), Some("root"));
    }
}
