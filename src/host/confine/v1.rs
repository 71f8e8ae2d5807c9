//! Deny entries in the cgroup v1 devices controller
//! (Documentation/admin-guide/cgroup-v1/devices.rst).
//!
//! A new cgroup starts as a copy of its parent: its default (allow or deny) and its
//! exceptions, and the kernel edits exceptions by exact match only. So:
//! - under a default-allow parent (`a *:* rwm`, the host's usual case), one
//!   `devices.deny` line per other GPU adds a deny exception for exactly that node;
//!   `devices.allow` of one minor would never carve a hole in a wildcard deny;
//! - under a default-deny parent (a container, a systemd DevicePolicy), `devices.deny`
//!   removes the allow exception of exactly that node, and leaves a wildcard such as
//!   `c 195:* rw` allowing every minor. That wildcard is removed and replaced by one
//!   entry per other minor of the driver's range. Only there does devices.list tell what
//!   took (in default-allow mode the kernel lists `a *:* rwm` alone), so it is read back
//!   and any entry that still opens a denied GPU is an error.

use super::{ConfineError, DeviceRules, dir};
use std::path::Path;

/// NVIDIA's driver registers 256 minors of its major: GPUs from 0, nvidia-modeset at 254,
/// nvidiactl at 255. A wildcard over the major is replaced by entries for these.
const DRIVER_MINORS: std::ops::RangeInclusive<u32> = 0..=255;

pub(super) fn apply(dir: &Path, rules: &DeviceRules) -> Result<(), ConfineError> {
    let major = rules.gpu_major;
    for (major, minor) in rules.denied_nodes() {
        dir::write(dir, "devices.deny", &format!("c {major}:{minor} rwm"))?;
    }
    let list = read_list(dir)?;
    if list.iter().any(|e| e.is_allow_all()) {
        return Ok(());
    }
    for wildcard in list.iter().filter(|e| e.is_minor_wildcard_of(major)) {
        if !rules
            .denied_minors
            .iter()
            .any(|&m| wildcard.opens(major, m))
        {
            continue;
        }
        dir::write(dir, "devices.deny", &format!("c {major}:* rwm"))?;
        for minor in DRIVER_MINORS.filter(|&m| !rules.denies(m)) {
            let rule = format!("c {major}:{minor} {}", wildcard.access);
            dir::write(dir, "devices.allow", &rule)?;
        }
    }
    verify(dir, rules)
}

/// Fails when an entry of `dir`'s devices.list still opens a denied node (a GPU, or a
/// MIG capability node, whose wildcards are not rewritten: such a parent fails closed);
/// an entry that does not parse counts as one that does.
fn verify(dir: &Path, rules: &DeviceRules) -> Result<(), ConfineError> {
    let path = dir.join("devices.list");
    let text = read(&path)?;
    let denied_nodes = rules.denied_nodes();
    for line in text.lines() {
        let entry = Entry::parse(line);
        let denied = denied_nodes
            .iter()
            .find(|&&(major, minor)| entry.as_ref().is_none_or(|e| e.opens(major, minor)));
        if let Some(&(major, minor)) = denied {
            return Err(ConfineError::RuleNotTaken {
                path,
                entry: line.to_owned(),
                major,
                minor,
            });
        }
    }
    Ok(())
}

fn read_list(dir: &Path) -> Result<Vec<Entry>, ConfineError> {
    let text = read(&dir.join("devices.list"))?;
    Ok(text.lines().filter_map(Entry::parse).collect())
}

fn read(path: &Path) -> Result<String, ConfineError> {
    std::fs::read_to_string(path).map_err(|source| ConfineError::Read {
        path: path.to_owned(),
        source,
    })
}

/// One devices.list line, `TYPE MAJOR:MINOR ACCESS`, `*` (None) for any number.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: char,
    major: Option<u32>,
    minor: Option<u32>,
    access: String,
}

impl Entry {
    fn parse(line: &str) -> Option<Entry> {
        let mut fields = line.split_whitespace();
        let (kind, numbers, access) = (fields.next()?, fields.next()?, fields.next()?);
        let number = |n: &str| match n {
            "*" => Some(None),
            n => n.parse().ok().map(Some),
        };
        let (major, minor) = numbers.split_once(':')?;
        let mut kind = kind.chars();
        let entry = Entry {
            kind: kind.next()?,
            major: number(major)?,
            minor: number(minor)?,
            access: access.to_owned(),
        };
        (kind.next().is_none() && fields.next().is_none()).then_some(entry)
    }

    fn is_allow_all(&self) -> bool {
        self.kind == 'a' && self.major.is_none() && self.minor.is_none()
    }

    fn is_minor_wildcard_of(&self, major: u32) -> bool {
        self.kind == 'c' && self.major == Some(major) && self.minor.is_none()
    }

    /// Whether it lets a process open (read or write; mknod alone opens nothing) the char
    /// device `major:minor`.
    fn opens(&self, major: u32, minor: u32) -> bool {
        matches!(self.kind, 'a' | 'c')
            && self.major.is_none_or(|m| m == major)
            && self.minor.is_none_or(|m| m == minor)
            && self.access.contains(['r', 'w'])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_with_wildcards() {
        let e = Entry::parse("c 195:* rw").unwrap();
        assert_eq!((e.kind, e.major, e.minor), ('c', Some(195), None));
        assert!(Entry::parse("a *:* rwm").unwrap().is_allow_all());
        assert!(Entry::parse("c 195 rwm").is_none());
        assert!(Entry::parse("c x:1 rwm").is_none());
    }

    #[test]
    fn an_entry_opens_what_it_matches_for_read_or_write() {
        let opens = |line: &str, minor| Entry::parse(line).unwrap().opens(195, minor);
        assert!(opens("c 195:3 rwm", 3));
        assert!(opens("c 195:* r", 3));
        assert!(opens("c *:* w", 3));
        assert!(!opens("c 195:1 rwm", 3));
        assert!(!opens("c *:* m", 3), "mknod alone opens nothing");
        assert!(!opens("b 195:3 rwm", 3), "a block device is another node");
        assert!(!opens("c 196:3 rwm", 3));
    }

    fn fake_list(list: &str) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("devices.list"), list).unwrap();
        tmp
    }

    #[test]
    fn an_entry_still_opening_a_denied_gpu_is_reported() {
        let rules = DeviceRules::deny(195, [2, 3]).with_caps(237, [30]);
        let tmp = fake_list("c 1:3 rwm\nc 195:1 rwm\nc 195:3 rw\n");
        let err = verify(tmp.path(), &rules).unwrap_err();
        assert!(
            matches!(err, ConfineError::RuleNotTaken { minor: 3, ref entry, .. } if entry == "c 195:3 rw"),
            "{err}"
        );
        let tmp = fake_list("c 1:3 rwm\nc 195:1 rwm\nc *:* m\n");
        verify(tmp.path(), &rules).unwrap();
        let tmp = fake_list("c 195:1 rwm\nc 237:* rw\n");
        let err = verify(tmp.path(), &rules).unwrap_err();
        assert!(
            matches!(
                err,
                ConfineError::RuleNotTaken {
                    major: 237,
                    minor: 30,
                    ..
                }
            ),
            "{err}"
        );
        let tmp = fake_list("c 195:1 rwm\nsomething new\n");
        assert!(
            verify(tmp.path(), &rules).is_err(),
            "unknown lines fail closed"
        );
    }
}
