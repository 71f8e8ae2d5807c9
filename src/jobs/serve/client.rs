//! The caller's side: `gpupin exec`, `hold` and `release` of a user who is not root.
//!
//! Every step has a time limit, so that a stuck or overloaded daemon gives a clear line
//! instead of a hang: connecting, and each answer (for an exec that waits in the queue,
//! its wait and a margin).

use super::protocol::{self, Envelope, Reply, Request};
use crate::jobs::hold::HoldRequest;
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long connecting may take (the daemon's listen backlog may be full).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an answer may take, besides a wait in the queue the request asks for.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The OS error once, and what to do about it (`connect_hint`).
    #[error("cannot reach gpupin serve at {path}: {}", connect_hint(.path, .error))]
    Connect {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "gpupin serve at {path} took no connection within {after}: it is overloaded or stuck; try again, or ask an admin to look at its log"
    )]
    ConnectTimeout { path: PathBuf, after: String },
    #[error(
        "gpupin serve did not answer within {after}: it is overloaded or stuck; try again, or ask an admin to look at its log"
    )]
    ReplyTimeout { after: String },
    #[error("talking to gpupin serve: {0}")]
    Io(#[from] std::io::Error),
    #[error("gpupin serve closed the connection without an answer")]
    NoAnswer,
    #[error("{0}")]
    Refused(String),
}

/// Why a connection failed, in the words of whoever must act: a user cannot start the
/// daemon, so each says who can and how.
fn connect_hint(path: &Path, error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::NotFound => "no such socket: gpupin serve is not running (an admin starts it: systemctl enable --now gpupin.socket)".into(),
        ErrorKind::ConnectionRefused => "nothing listens there: gpupin serve stopped (an admin starts it again: systemctl restart gpupin.socket)".into(),
        ErrorKind::PermissionDenied => match socket_group(path) {
            Some(group) => format!(
                "permission denied: only members of group {group} may use it (ask an admin to add you: usermod -aG {group} {}; then log in again)",
                crate::host::users::own_name()
            ),
            None => "permission denied: the socket is for the group the config's socket_group names (ask an admin to add you to it)".into(),
        },
        _ => error.to_string(),
    }
}

/// The name of the group that owns the socket at `path` (the config's `socket_group`,
/// as `gpupin serve` made it), read from the socket itself: the client may have another
/// config than the daemon.
pub(super) fn socket_group(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::symlink_metadata(path).ok()?.gid();
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map(|g| g.name)
}

/// One connection to the daemon.
pub struct Client {
    input: BufReader<UnixStream>,
    output: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = connect_within(path, CONNECT_TIMEOUT)?;
        Ok(Client {
            input: BufReader::new(stream.try_clone()?),
            output: stream,
        })
    }

    /// Sends `request` and returns the daemon's answer; a refusal is an error.
    pub fn ask(&mut self, request: &Request) -> Result<Reply, ClientError> {
        let within = reply_timeout(request);
        self.output.set_write_timeout(Some(REPLY_TIMEOUT))?;
        self.input.get_ref().set_read_timeout(Some(within))?;
        let timed_out = |e: &std::io::Error| {
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        };
        let after = || humantime::format_duration(within).to_string();
        let message = Envelope::new(request.clone());
        protocol::send(&mut self.output, &message).map_err(|e| match timed_out(&e) {
            true => ClientError::ReplyTimeout { after: after() },
            false => ClientError::Io(e),
        })?;
        let reply: Reply = protocol::receive(&mut self.input)
            .map_err(|e| match timed_out(&e) {
                true => ClientError::ReplyTimeout { after: after() },
                false => ClientError::Io(e),
            })?
            .ok_or(ClientError::NoAnswer)?;
        match reply.error {
            Some(error) => Err(ClientError::Refused(error)),
            None => Ok(reply),
        }
    }
}

/// How long the answer to `request` may take: an exec that may wait in the queue gets
/// its wait besides.
fn reply_timeout(request: &Request) -> Duration {
    let wait = match request {
        Request::Exec { request, .. } | Request::Hold(HoldRequest { request, .. }) => request
            .iter()
            .find(|(k, _)| k == crate::input::request::Key::Wait.as_str())
            .and_then(|(_, v)| humantime::parse_duration(v.trim()).ok()),
        // An eviction waits for the holder to stop: its grace, then the settling.
        Request::Evict { grace_secs, .. } => {
            Some(Duration::from_secs(grace_secs.unwrap_or(10)) + crate::jobs::evict::SETTLE)
        }
        _ => None,
    };
    REPLY_TIMEOUT + wait.unwrap_or_default()
}

/// Connects without blocking on a full listen backlog: a Unix socket's connect says
/// EAGAIN then, and is tried again until `limit` has passed.
fn connect_within(path: &Path, limit: Duration) -> Result<UnixStream, ClientError> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let failed = |error: std::io::Error| ClientError::Connect {
        path: path.to_path_buf(),
        error,
    };
    let addr = SocketAddrUnix::new(path).map_err(|e| failed(e.into()))?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| failed(e.into()))?;
    let start = Instant::now();
    loop {
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) if start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(rustix::io::Errno::AGAIN) => {
                return Err(ClientError::ConnectTimeout {
                    path: path.to_path_buf(),
                    after: humantime::format_duration(limit).to_string(),
                });
            }
            Err(e) => return Err(failed(e.into())),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_never_answers_is_a_one_line_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut client = Client::connect(&path).unwrap();
        // No real request: the reply timeout is tested with a short one.
        client
            .input
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let err = protocol::receive::<Reply>(&mut client.input).unwrap_err();
        assert!(matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ));
        let wait = Request::Exec {
            request: vec![("gpupin.wait".into(), "10m".into())],
            name: None,
        };
        assert_eq!(
            reply_timeout(&wait),
            REPLY_TIMEOUT + Duration::from_secs(600)
        );
        let err = ClientError::ReplyTimeout { after: "1m".into() }.to_string();
        assert!(
            err.starts_with("gpupin serve did not answer within 1m"),
            "{err}"
        );
    }

    /// The line gave the OS error twice and no way out: a missing socket and a
    /// stale one each say who starts the daemon and how, once.
    #[test]
    fn a_daemon_that_is_not_there_says_who_starts_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpupin.sock");
        let text = |err: ClientError| crate::base::message::one_line(&err);
        let missing = text(Client::connect(&path).err().unwrap());
        assert_eq!(
            missing,
            format!(
                "cannot reach gpupin serve at {}: no such socket: gpupin serve is not running (an admin starts it: systemctl enable --now gpupin.socket)",
                path.display()
            )
        );
        // A socket whose daemon died: nothing listens.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let stale = text(Client::connect(&path).err().unwrap());
        assert!(
            stale.ends_with("nothing listens there: gpupin serve stopped (an admin starts it again: systemctl restart gpupin.socket)"),
            "{stale}"
        );
    }
}
