//! A minimal root filesystem: one statically linked busybox plus links named after the
//! applets the demo and tests call. A dynamically linked busybox would need the host's
//! libc inside the rootfs, so only a static one is accepted.

use super::SandboxError;
use std::path::{Path, PathBuf};

/// Applets linked in /bin: what the demo, the tests (runc, podman, and Docker's image)
/// and the benches call: `sleep`, listing and inspecting /dev, `env`, reading
/// /proc/1/environ (`tr`, `sort`).
pub const APPLETS: &[&str] = &[
    "sh", "ls", "cat", "env", "sleep", "stat", "grep", "echo", "true", "id", "mkdir", "ps", "tr",
    "sort",
];

/// Where Debian's busybox-static (and most distributions) install busybox.
const BUSYBOX_PATHS: &[&str] = &["/bin/busybox", "/usr/bin/busybox", "/sbin/busybox"];

/// Directories runc expects as mount points; /etc and /tmp for programs that want them.
const DIRS: &[&str] = &["bin", "dev", "proc", "sys", "etc", "tmp"];

/// The first statically linked busybox found, or why there is none.
pub fn find_static_busybox() -> Result<PathBuf, String> {
    let found: Vec<&str> = BUSYBOX_PATHS
        .iter()
        .copied()
        .filter(|p| Path::new(p).is_file())
        .collect();
    if let Some(path) = found.iter().find(|p| is_static_elf(Path::new(p))) {
        return Ok(PathBuf::from(path));
    }
    match found.first() {
        Some(path) => Err(format!(
            "{path} is dynamically linked (install busybox-static)"
        )),
        None => Err("busybox not found (install busybox-static)".to_string()),
    }
}

/// Whether `path` is a 64-bit little-endian ELF without a PT_INTERP program header,
/// i.e. needs no dynamic loader.
pub fn is_static_elf(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|bytes| elf64_has_no_interp(&bytes).unwrap_or(false))
}

fn elf64_has_no_interp(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if b.get(..6)? != b"\x7fELF\x02\x01" {
        return Some(false);
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let phoff = u64::from_le_bytes(b.get(0x20..0x28)?.try_into().ok()?) as usize;
    let (phentsize, phnum) = (u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
        if p_type == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// Fills `dir` (created if needed) with busybox, its applet links and empty mount points.
pub fn build_busybox_rootfs(busybox: &Path, dir: &Path) -> Result<(), SandboxError> {
    for sub in DIRS {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(SandboxError::io("creating", &path))?;
    }
    let target = dir.join("bin/busybox");
    std::fs::copy(busybox, &target).map_err(SandboxError::io("copying busybox to", &target))?;
    for applet in APPLETS {
        let link = dir.join("bin").join(applet);
        // Relative links keep the rootfs valid wherever it is mounted.
        std::os::unix::fs::symlink("busybox", &link).map_err(SandboxError::io("linking", &link))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_not_a_static_elf() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("busybox");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(!is_static_elf(&script));
    }

    #[test]
    fn a_truncated_elf_is_not_static() {
        assert_eq!(elf64_has_no_interp(b"\x7fELF\x02\x01\0\0"), None);
    }

    #[test]
    fn rootfs_has_applets_and_mount_points() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-busybox");
        std::fs::write(&fake, b"binary").unwrap();
        let root = dir.path().join("rootfs");
        build_busybox_rootfs(&fake, &root).unwrap();
        assert_eq!(std::fs::read(root.join("bin/sleep")).unwrap(), b"binary");
        assert!(root.join("proc").is_dir() && root.join("dev").is_dir());
    }
}
