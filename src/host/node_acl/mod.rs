//! Who may open a device node besides its mode: the named-user entries of its POSIX
//! access ACL (`node_access = "acl"`). gpupin owns those entries on GPU and MIG capability
//! nodes; the mode bits and named groups are the administrator's and stay as they are.
//!
//! A node is reached with O_PATH|O_NOFOLLOW (nothing opened on the driver, no FIFO
//! opened, a symlink in its place refused) and must be the character device asked for;
//! its xattr is then read and written through `/proc/self/fd/N`, which names that very
//! inode (an O_PATH fd takes no f*xattr calls).

mod codec;

pub(crate) use codec::{Acl, AclFormatError, RW};

use rustix::fs::{FileType, Mode, OFlags};
use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

const XATTR: &str = "system.posix_acl_access";
/// The largest ACL read: about a thousand entries, far more than any node has.
const MAX_ACL: usize = 8 << 10;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum NodeAclError {
    #[error("opening device node {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing {path}: {what}, not the device node {major}:{minor}; left alone")]
    NotTheNode {
        path: PathBuf,
        what: String,
        major: u32,
        minor: u32,
    },
    #[error("reading the ACL of {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the ACL of {path} is unreadable: {source}; left alone (inspect it with getfacl)")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: AclFormatError,
    },
    #[error(
        "the file system of {path} keeps no POSIX ACLs (tmpfs needs CONFIG_TMPFS_POSIX_ACL, others the acl mount option)"
    )]
    Unsupported { path: PathBuf },
    #[error("writing the ACL of {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A device node and the users who should have named entries on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeUsers {
    /// Where the node is on the host.
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub uids: BTreeSet<u32>,
}

/// Makes the named-user entries of `node.path`'s ACL exactly `node.uids`, read and write
/// each; writes nothing when they are already (the common case: a handful of getxattr
/// calls for a change that touched no host holder). `true`: the ACL was rewritten.
pub(crate) fn set_users(node: &NodeUsers) -> Result<bool, NodeAclError> {
    let path = &node.path;
    let (fd, mode) = open_node(node)?;
    let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let current = match read(&proc, path)? {
        Some(acl) => acl,
        None => Acl::from_mode(mode),
    };
    let wanted = current.with_users(node.uids.iter().copied(), RW);
    if wanted == current {
        return Ok(false);
    }
    rustix::fs::setxattr(
        proc.as_str(),
        XATTR,
        &wanted.encode(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::OPNOTSUPP => NodeAclError::Unsupported { path: path.clone() },
        e => NodeAclError::Write {
            path: path.clone(),
            source: e.into(),
        },
    })?;
    Ok(true)
}

/// The uids with named entries on the node, for the tests (nothing else reads them back).
#[cfg(test)]
pub(crate) fn users(node: &NodeUsers) -> Result<BTreeSet<u32>, NodeAclError> {
    let (fd, _) = open_node(node)?;
    let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(read(&proc, &node.path)?
        .map(|acl| acl.users.into_keys().collect())
        .unwrap_or_default())
}

/// The node as an O_PATH fd, checked to be the character device `major:minor`, and its
/// mode bits.
fn open_node(node: &NodeUsers) -> Result<(OwnedFd, u32), NodeAclError> {
    let path = &node.path;
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| NodeAclError::Open {
        path: path.clone(),
        source: e.into(),
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| NodeAclError::Open {
        path: path.clone(),
        source: e.into(),
    })?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    let (major, minor) = (
        rustix::fs::major(stat.st_rdev),
        rustix::fs::minor(stat.st_rdev),
    );
    let what = match kind {
        FileType::CharacterDevice if (major, minor) == (node.major, node.minor) => None,
        FileType::CharacterDevice => Some(format!("character device {major}:{minor}")),
        FileType::Symlink => Some("a symlink".to_string()),
        other => Some(format!("{other:?}").to_lowercase()),
    };
    if let Some(what) = what {
        return Err(NodeAclError::NotTheNode {
            path: path.clone(),
            what,
            major: node.major,
            minor: node.minor,
        });
    }
    Ok((fd, stat.st_mode & 0o777))
}

/// The node's access ACL; `None` where it has none (its mode says it all).
fn read(proc: &str, path: &Path) -> Result<Option<Acl>, NodeAclError> {
    let mut buf = vec![0u8; MAX_ACL];
    match rustix::fs::getxattr(proc, XATTR, &mut buf[..]) {
        Ok(len) => Acl::decode(&buf[..len])
            .map(Some)
            .map_err(|source| NodeAclError::Corrupt {
                path: path.to_path_buf(),
                source,
            }),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(rustix::io::Errno::OPNOTSUPP) => Ok(None),
        Err(e) => Err(NodeAclError::Read {
            path: path.to_path_buf(),
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests;
