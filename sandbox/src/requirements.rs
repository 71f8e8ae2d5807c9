//! What real containers need on this machine, checked up front so that a missing piece
//! is reported as one sentence rather than as a runc failure halfway through.

use super::rootfs::find_static_busybox;
use std::path::{Path, PathBuf};

/// The programs a sandbox runs, once found.
#[derive(Debug, Clone)]
pub struct Requirements {
    pub runc: PathBuf,
    pub busybox: PathBuf,
}

impl Requirements {
    /// Root, runc on PATH, a static busybox; `Err` says what is missing.
    pub fn check() -> Result<Requirements, String> {
        if !is_root() {
            return Err("not running as root (runc and device nodes need it)".into());
        }
        crate::engines::check(&["runc"])?;
        let runc = find_on_path("runc").ok_or("runc not found on PATH (install runc)")?;
        let busybox = find_static_busybox()?;
        Ok(Requirements { runc, busybox })
    }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The first executable file named `name` in `$PATH`, or in the sbin directories, which
/// a non-login root shell may lack from PATH but where Debian installs runc.
///
/// Under `GPUPIN_ENGINES=modern` a modern engine (runc, containerd, ctr, the runc shim,
/// dockerd, docker-proxy, docker-compose) is the peers' cache's build or nothing: a run
/// on the modern generation must not pass on Debian's engines.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    match crate::engines::modern(name) {
        Ok(Some(modern)) => return Some(modern),
        Ok(None) => {}
        Err(_) => return None,
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
