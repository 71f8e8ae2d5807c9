//! The caller's side: `gpupin exec`, `hold` and `release` of a user who is not root.

use super::protocol::{self, Reply, Request};
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach gpupin serve at {path}: {source} (is the daemon running, and may you use its socket?)"
    )]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to gpupin serve: {0}")]
    Io(#[from] std::io::Error),
    #[error("gpupin serve closed the connection without an answer")]
    NoAnswer,
    #[error("{0}")]
    Refused(String),
}

/// One connection to the daemon.
pub struct Client {
    input: BufReader<UnixStream>,
    output: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Client {
            input: BufReader::new(stream.try_clone()?),
            output: stream,
        })
    }

    /// Sends `request` and returns the daemon's answer; a refusal is an error.
    pub fn ask(&mut self, request: &Request) -> Result<Reply, ClientError> {
        protocol::send(&mut self.output, request)?;
        let reply: Reply = protocol::receive(&mut self.input)?.ok_or(ClientError::NoAnswer)?;
        match reply.error {
            Some(error) => Err(ClientError::Refused(error)),
            None => Ok(reply),
        }
    }
}
