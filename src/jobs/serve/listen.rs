//! The daemon's socket: handed over by systemd (socket activation), or made here.

use crate::input::config::Config;
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// The first fd systemd passes (sd_listen_fds(3)).
const SD_LISTEN_FDS_START: i32 = 3;

/// Who may connect, when no group is configured: every local user may ask; limits and
/// ownership checks decide what they get.
const OPEN_MODE: u32 = 0o666;
/// With `socket_group`: root and that group.
const GROUP_MODE: u32 = 0o660;

/// The socket systemd passed to this process, if it passed one (LISTEN_PID is ours and
/// LISTEN_FDS is at least 1). The variables are cleared so that no child takes them.
pub fn from_systemd() -> Option<UnixListener> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: i32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    // SAFETY: only the environment of this single-threaded start is changed.
    unsafe {
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    if pid != std::process::id() || fds < 1 {
        return None;
    }
    // SAFETY: systemd passes fd 3 open for us, and nothing else in this process owns it.
    let listener = unsafe { UnixListener::from_raw_fd(SD_LISTEN_FDS_START) };
    let _ = rustix::io::fcntl_setfd(&listener, rustix::io::FdFlags::CLOEXEC);
    Some(listener)
}

/// Makes the socket at `config.socket_path()`: a stale socket there is replaced, a
/// running daemon's is not, and anything that is no socket is refused.
pub fn bind(config: &Config) -> io::Result<UnixListener> {
    let path = config.socket_path();
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("another gpupin serve listens on {}", path.display()),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is no socket", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Until the mode below is set, the umask's mode lets at most root in.
    let listener = UnixListener::bind(&path)?;
    set_access(&path, config.socket_group.as_deref())?;
    Ok(listener)
}

fn set_access(path: &Path, group: Option<&str>) -> io::Result<()> {
    let mode = match group {
        None => OPEN_MODE,
        Some(name) => {
            let group = nix::unistd::Group::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("socket_group {name:?}: no such group on this machine"),
                    )
                })?;
            std::os::unix::fs::lchown(path, None, Some(group.gid.as_raw()))?;
            GROUP_MODE
        }
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}
