//! `gpupin serve` and its socket: users who are not root run `gpupin exec`, `hold` and
//! `release` through it. A socket nobody listens on (a daemon that died, or one stopped
//! without removing it) turns every user's command into "Connection refused".

use super::{Finding, Setup};
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

const CHECK: &str = "serve";

pub(super) fn check(setup: &Setup) -> Finding {
    let socket = setup.config.socket_path();
    let shown = socket.display();
    let meta = match std::fs::symlink_metadata(&socket) {
        Ok(meta) => meta,
        Err(err) if err.kind() == ErrorKind::NotFound => {
            return Finding::warn(
                CHECK,
                format!(
                    "gpupin serve: no socket at {shown}: users who are not root cannot run gpupin exec, hold or release"
                ),
            )
            .fix("systemctl enable --now gpupin.socket (or run gpupin serve as root)");
        }
        Err(err) => return Finding::problem(CHECK, format!("gpupin serve: {shown}: {err}")),
    };
    if !meta.file_type().is_socket() {
        return Finding::problem(
            CHECK,
            format!("gpupin serve: {shown} is no socket: gpupin serve cannot listen there"),
        )
        .fix(format!(
            "look at what {shown} is and remove it, then systemctl restart gpupin.socket"
        ));
    }
    let access = format!(
        "mode {:04o}, group {}",
        meta.permissions().mode() & 0o7777,
        group_name(meta.gid())
    );
    match std::os::unix::net::UnixStream::connect(&socket) {
        Ok(_) => Finding::ok(
            CHECK,
            format!("gpupin serve listens at {shown} ({access})"),
        ),
        Err(err) if err.kind() == ErrorKind::ConnectionRefused => Finding::problem(
            CHECK,
            format!(
                "gpupin serve: nothing listens at {shown}: the daemon stopped and left its socket; users get Connection refused"
            ),
        )
        .fix("systemctl restart gpupin.socket (or remove the socket and start gpupin serve)"),
        Err(err) if err.kind() == ErrorKind::PermissionDenied => {
            let group = group_name(meta.gid());
            Finding::problem(
                CHECK,
                format!(
                    "gpupin serve at {shown} ({access}): you may not use it: only members of group {group} may run gpupin exec, hold or release as themselves"
                ),
            )
            .fix(format!(
                "ask an admin to add you: usermod -aG {group} {}; then log in again",
                crate::host::users::own_name()
            ))
        }
        Err(err) => Finding::problem(CHECK, format!("gpupin serve at {shown}: {err}")),
    }
}

fn group_name(gid: u32) -> String {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or_else(|| gid.to_string(), |g| g.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::finding::Status;
    use crate::input::config::Config;

    fn setup(dir: &std::path::Path) -> Setup {
        let config = Config {
            state_dir: dir.to_path_buf(),
            ..Config::default()
        };
        Setup::host(config, dir.join("gpupin"))
    }

    #[test]
    fn a_missing_a_stale_and_a_live_socket() {
        let dir = tempfile::tempdir().unwrap();
        let setup = setup(dir.path());
        let socket = setup.config.socket_path();
        let missing = check(&setup);
        assert_eq!(missing.status, Status::Warn, "{missing:?}");
        assert_eq!(
            missing.fix.as_deref(),
            Some("systemctl enable --now gpupin.socket (or run gpupin serve as root)")
        );
        // A daemon that died: its socket stays, nothing listens.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let stale = check(&setup);
        assert_eq!(stale.status, Status::Problem, "{stale:?}");
        assert!(stale.what.contains("nothing listens at"), "{stale:?}");
        std::fs::remove_file(&socket).unwrap();
        let _listening = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let live = check(&setup);
        assert_eq!(live.status, Status::Ok, "{live:?}");
        assert!(
            live.what.starts_with(&format!(
                "gpupin serve listens at {} (mode ",
                socket.display()
            )),
            "{live:?}"
        );
        std::fs::remove_file(&socket).unwrap();
        std::fs::write(&socket, "").unwrap();
        assert_eq!(check(&setup).status, Status::Problem);
    }
}
