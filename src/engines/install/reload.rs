//! Asking a running dockerd to re-read daemon.json: SIGHUP reloads `runtimes` and
//! `default-runtime` without restarting it or its containers (dockerd(8), "Daemon
//! configuration file", configuration reload behavior).

use std::path::{Path, PathBuf};

/// Where dockerd writes its pid unless started with `--pidfile`.
pub const DEFAULT_PIDFILE: &str = "/var/run/docker.pid";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// SIGHUP was sent to this pid.
    Signalled(i32),
    /// No dockerd runs (no pidfile, or its pid is gone or is not dockerd): it reads the
    /// file when it starts.
    NotRunning,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("reading dockerd pid file {path}")]
    ReadPidfile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("dockerd pid file {path} holds {content:?}, not a pid")]
    BadPidfile { path: PathBuf, content: String },
    #[error("sending SIGHUP to dockerd (pid {pid})")]
    Signal {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
}

/// Sends SIGHUP to the dockerd named by `pidfile`, if one runs.
pub fn reload_dockerd(pidfile: &Path) -> Result<Reload, ReloadError> {
    let Some(pid) = read_pid(pidfile)? else {
        return Ok(Reload::NotRunning);
    };
    // A pid file outlives a crashed dockerd and its pid may be reused: signal only a
    // process that is dockerd.
    if !is_dockerd(pid) {
        return Ok(Reload::NotRunning);
    }
    let target = rustix::process::Pid::from_raw(pid).expect("read_pid returns positive pids");
    rustix::process::kill_process(target, rustix::process::Signal::HUP).map_err(|err| {
        ReloadError::Signal {
            pid,
            source: err.into(),
        }
    })?;
    Ok(Reload::Signalled(pid))
}

fn read_pid(pidfile: &Path) -> Result<Option<i32>, ReloadError> {
    let content = match std::fs::read_to_string(pidfile) {
        Ok(c) => c,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ReloadError::ReadPidfile {
                path: pidfile.to_owned(),
                source,
            });
        }
    };
    match content.trim().parse::<i32>() {
        Ok(pid) if pid > 0 => Ok(Some(pid)),
        _ => Err(ReloadError::BadPidfile {
            path: pidfile.to_owned(),
            content,
        }),
    }
}

fn is_dockerd(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "dockerd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_pidfile_means_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let got = reload_dockerd(&dir.path().join("docker.pid")).unwrap();
        assert_eq!(got, Reload::NotRunning);
    }

    #[test]
    fn pid_of_another_process_is_not_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("docker.pid");
        // This test process is alive and is not dockerd.
        std::fs::write(&pidfile, std::process::id().to_string()).unwrap();
        assert_eq!(reload_dockerd(&pidfile).unwrap(), Reload::NotRunning);
    }

    #[test]
    fn garbage_in_the_pidfile_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("docker.pid");
        std::fs::write(&pidfile, "dockerd\n").unwrap();
        assert!(matches!(
            reload_dockerd(&pidfile),
            Err(ReloadError::BadPidfile { .. })
        ));
    }
}
