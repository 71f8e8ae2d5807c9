//! A uid's name from /etc/passwd. The static hook and shim must not load NSS modules
//! (`users` says why), so what they name is what the files database knows; a user only
//! LDAP or sssd knows is shown by uid there. The `gpupin` CLI asks NSS first.

use crate::base::safe_open::{self, Links};
use std::path::Path;

const PASSWD: &str = "/etc/passwd";

/// The name /etc/passwd gives `uid`, if any.
pub fn passwd_name(uid: u32) -> Option<String> {
    // Admins manage /etc/passwd with links at times (NixOS): followed; never a FIFO.
    let text = safe_open::read_to_string(Path::new(PASSWD), Links::Follow).ok()?;
    name_in(&text, uid)
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
    fn root_is_root_here() {
        assert_eq!(passwd_name(0).as_deref(), Some("root"));
    }
}
