//! What `gpupin exec`, `hold` and `release` say to `gpupin serve`, and its answers: one
//! JSON object a line, each way. The daemon reads a request's keys as `gpupin pick`'s
//! (`gpupin.count` ...), so that all validation stays in `request`.

use crate::state::audit::GpuRef;
use serde::{Deserialize, Serialize};

/// The most one message may take: requests are a few hundred bytes.
pub const MAX_MESSAGE: u64 = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// GPUs for a job the caller is about to start; `Bind` follows on the same connection.
    Exec {
        /// Request keys as annotations name them, with their values.
        request: Vec<(String, String)>,
        #[serde(default)]
        name: Option<String>,
    },
    /// The job the caller started and holds at its gate: the GPUs move to it.
    Bind { pid: i32 },
    /// GPUs set aside for `pid` (a process of the caller's), or, for root only, until
    /// released.
    Hold {
        id: String,
        /// GPU indices, UUIDs or bus ids, comma-separated; device minors with `by_minor`.
        devices: String,
        #[serde(default)]
        by_minor: bool,
        #[serde(default)]
        pid: Option<i32>,
        #[serde(default)]
        until_release: bool,
        /// Root only: whose hold it is.
        #[serde(default)]
        user: Option<String>,
        /// The holder it nests in.
        #[serde(default)]
        within: Option<String>,
        /// How many GPUs the policy chooses, instead of `devices` (then empty).
        #[serde(default)]
        count: Option<u32>,
        /// MIG instances of this profile (or `any`), `count` of them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mig: Option<String>,
        /// Why, for status and the audit log.
        #[serde(default)]
        reason: Option<String>,
        /// How long it lasts at most, in seconds (the daemon's clock starts it).
        #[serde(default)]
        for_secs: Option<u64>,
    },
    /// Releases one of the caller's holders, named as `gpupin status` shows it; one that
    /// still runs only with `force`.
    Release {
        id: String,
        #[serde(default)]
        force: bool,
        /// `id` is a whole holder id, never a name or prefix.
        #[serde(default)]
        exact: bool,
        /// No such holder is no refusal: the reply names no holder.
        #[serde(default)]
        ignore_missing: bool,
    },
    /// The key to one of the caller's holders (`gpupin key`).
    Key { id: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// One line, when the request was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuRef>,
    /// For `Exec`: the job's environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    /// For `Key`: `HOLDER:KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl Reply {
    pub fn refused(error: impl Into<String>) -> Reply {
        Reply {
            error: Some(error.into()),
            ..Reply::default()
        }
    }
}

/// Writes `message` as one line.
pub fn send<T: Serialize>(out: &mut impl std::io::Write, message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Reads one line (at most `MAX_MESSAGE` bytes) as a `T`. `Ok(None)`: the peer closed the
/// connection.
pub fn receive<T: for<'de> Deserialize<'de>>(
    input: &mut impl std::io::BufRead,
) -> std::io::Result<Option<T>> {
    use std::io::{BufRead, Read};
    let mut line = Vec::new();
    input
        .by_ref()
        .take(MAX_MESSAGE + 1)
        .read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.len() as u64 > MAX_MESSAGE || !line.ends_with(b"\n") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message longer than {MAX_MESSAGE} bytes, or cut off"),
        ));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_each_way() {
        let mut buf = Vec::new();
        let req = Request::Exec {
            request: vec![("gpupin.count".into(), "2".into())],
            name: Some("train\nx".into()),
        };
        send(&mut buf, &req).unwrap();
        send(&mut buf, &Request::Bind { pid: 7 }).unwrap();
        assert_eq!(buf.iter().filter(|&&b| b == b'\n').count(), 2);
        let mut input = std::io::BufReader::new(&buf[..]);
        assert_eq!(receive::<Request>(&mut input).unwrap(), Some(req));
        assert_eq!(
            receive::<Request>(&mut input).unwrap(),
            Some(Request::Bind { pid: 7 })
        );
        assert_eq!(receive::<Request>(&mut input).unwrap(), None);
    }

    #[test]
    fn an_oversized_or_unknown_message_is_an_error() {
        let big = vec![b'x'; MAX_MESSAGE as usize + 10];
        assert!(receive::<Request>(&mut std::io::BufReader::new(&big[..])).is_err());
        let odd = b"{\"op\":\"format_disk\"}\n";
        assert!(receive::<Request>(&mut std::io::BufReader::new(&odd[..])).is_err());
    }
}
