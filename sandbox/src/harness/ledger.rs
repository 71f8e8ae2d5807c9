//! Snapshots of a state dir, read without gpupin and without following a symlink or
//! opening a FIFO: compare two to know that nothing changed.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Every file under <state_dir>/holders with its bytes: "the ledger" for before/after
/// comparisons.
pub fn holder_files(state_dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let Ok(entries) = fs::read_dir(state_dir.join("holders")) else {
        return BTreeMap::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&p).unwrap_or_default())
        })
        .collect()
}

/// `dir` and everything under it, without following symlinks.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let path = out[i].clone();
        i += 1;
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
            && let Ok(entries) = fs::read_dir(&path)
        {
            out.extend(entries.flatten().map(|e| e.path()));
        }
    }
    out
}

/// Every path under `dir` with its mode, owner and (for regular files) bytes.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, u32, Vec<u8>)> {
    walk(dir)
        .into_iter()
        .filter_map(|p| {
            let meta = fs::symlink_metadata(&p).ok()?;
            let bytes = if meta.is_file() {
                fs::read(&p).unwrap_or_default()
            } else {
                Vec::new()
            };
            Some((p, (meta.mode(), meta.uid(), bytes)))
        })
        .collect()
}

/// One entry of `snapshot_tree`. FIFOs and devices are never opened.
#[derive(Clone, PartialEq, Eq)]
pub enum Entry {
    File(Vec<u8>),
    Dir,
    Link(PathBuf),
    Special(&'static str),
}

impl std::fmt::Debug for Entry {
    /// File contents as text, cut short: assertion messages stay readable.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::File(bytes) => {
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(400)]);
                write!(f, "File({text:?}, {} bytes)", bytes.len())
            }
            Entry::Dir => write!(f, "Dir"),
            Entry::Link(target) => write!(f, "Link({})", target.display()),
            Entry::Special(kind) => write!(f, "Special({kind})"),
        }
    }
}

/// Everything under `dir` (not `dir` itself), keyed by relative path.
pub fn snapshot_tree(dir: &Path) -> BTreeMap<String, Entry> {
    walk(dir)
        .into_iter()
        .skip(1)
        .filter_map(|path| {
            let rel = path.strip_prefix(dir).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).ok()?;
            let ft = meta.file_type();
            let value = if ft.is_symlink() {
                Entry::Link(fs::read_link(&path).unwrap_or_default())
            } else if ft.is_dir() {
                Entry::Dir
            } else if ft.is_fifo() {
                Entry::Special("fifo")
            } else if ft.is_file() {
                Entry::File(fs::read(&path).unwrap_or_default())
            } else {
                Entry::Special("other")
            };
            Some((rel, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_lists_links_and_fifos_without_following_or_opening_them() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("holders")).unwrap();
        fs::write(d.join("holders/c1.json"), "{}").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("link")).unwrap();
        let fifo = std::ffi::CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let tree = snapshot_tree(d);
        assert_eq!(tree["holders"], Entry::Dir);
        assert_eq!(tree["holders/c1.json"], Entry::File(b"{}".to_vec()));
        assert_eq!(tree["link"], Entry::Link("/etc".into()));
        assert_eq!(tree["fifo"], Entry::Special("fifo"));
        assert_eq!(tree.len(), 4);
        assert_eq!(holder_files(d).len(), 1);
    }
}
