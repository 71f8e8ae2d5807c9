//! What `gpupin exec`, `hold` and `release` (and the Python client) say to `gpupin serve`,
//! and its answers: one JSON object a line, each way. The daemon reads a request's keys as
//! `gpupin pick`'s (`gpupin.count` ...), so that all validation stays in `request`.
//!
//! The protocol is versioned (docs/protocol.md): a request may say `"v": N` (absent: 1);
//! a version the daemon does not speak is refused in one line before anything else is
//! read, and every reply says the daemon's `v`. New fields and ops keep the version;
//! only a change an old client or daemon would misread takes a new one.

use crate::jobs::hold::HoldRequest;
use crate::state::audit::GpuRef;
use serde::{Deserialize, Serialize};

/// The most one message may take: requests are a few hundred bytes.
pub(super) const MAX_MESSAGE: u64 = 64 << 10;

/// The protocol version this daemon and its clients speak.
pub(super) const VERSION: u32 = 1;

/// The version a request that names none speaks: every client before versions did.
fn first_version() -> u32 {
    1
}

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
    /// released: the request's fields are `HoldRequest`'s, beside `op`.
    Hold(HoldRequest),
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
    /// Ends one of the caller's holders that still runs (root: anyone's) and releases its
    /// GPUs once it is gone (`gpupin evict`); a queued request of theirs is cancelled.
    Evict {
        id: String,
        /// Why, for the audit line and the evicted job's stderr.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// How long it may take to stop before it is killed, in seconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_secs: Option<u64>,
    },
    /// The key to one of the caller's holders (`gpupin key`).
    Key { id: String },
    /// The daemon's protocol version and gpupin version, changing nothing.
    Hello,
    /// The ledger as `gpupin status --json` shows it, without the GPUs' processes.
    Status,
    /// For root (`gpupin reset`): the GPU health watch lets go of NVML for `secs` (at
    /// most 600), answered once it has.
    PauseHealth { secs: u64 },
    /// For root: the health watch takes NVML again.
    ResumeHealth,
}

impl Request {
    /// The request with every holder key hidden (`HOLDER:(key)`), for log lines: a key
    /// lets anyone take that holder's GPUs, and `log = debug` logs requests whole.
    pub fn without_keys(&self) -> Request {
        let within = crate::input::request::Key::Within.as_str();
        let hide_pairs = |pairs: &[(String, String)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| {
                    match k == within
                        || k.eq_ignore_ascii_case(crate::input::request::Key::Within.env())
                    {
                        true => (k.clone(), hide_key(v)),
                        false => (k.clone(), v.clone()),
                    }
                })
                .collect()
        };
        let mut shown = self.clone();
        match &mut shown {
            Request::Exec { request, .. } => *request = hide_pairs(request),
            Request::Hold(hold) => {
                hold.within = hold.within.as_deref().map(hide_key);
                hold.request = hide_pairs(&hold.request);
            }
            _ => {}
        }
        shown
    }
}

/// `res-7:(key)` for `res-7:0f3c...`; a value without a key as it is.
fn hide_key(within: &str) -> String {
    match within.split_once(':') {
        Some((holder, _)) => format!("{holder}:(key)"),
        None => within.to_string(),
    }
}

/// A request with its protocol version, as it travels: `{"v":1,"op":"hold",...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Envelope {
    #[serde(default = "first_version")]
    pub v: u32,
    #[serde(flatten)]
    pub request: Request,
}

impl Envelope {
    pub(super) fn new(request: Request) -> Envelope {
        Envelope {
            v: VERSION,
            request,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The protocol version of the daemon that answered (a daemon before versions: 1).
    #[serde(default = "first_version")]
    pub v: u32,
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
    /// For `Hello`: the daemon's gpupin version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// For `Release` and `Evict`: `holder` was a queued request, now cancelled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
    /// For `Evict`: how the holder was stopped (`stopped with SIGTERM`, `stopped with
    /// docker stop -t 10 web`, `killed: still running 10s after SIGTERM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// For `Status`: the status JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

impl Default for Reply {
    fn default() -> Reply {
        Reply {
            v: VERSION,
            error: None,
            holder: None,
            gpus: Vec::new(),
            env: Vec::new(),
            key: None,
            version: None,
            cancelled: false,
            stopped: None,
            status: None,
        }
    }
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
pub(super) fn send<T: Serialize>(
    out: &mut impl std::io::Write,
    message: &T,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Reads one request: `Ok(None)` when the peer closed the connection, `Err` when the line
/// is no request this daemon reads, with the one line that says why (a version it does
/// not speak first, whatever else the line holds).
pub(super) fn receive_request(
    input: &mut impl std::io::BufRead,
) -> Result<Option<Request>, String> {
    let unreadable = |e: &dyn std::fmt::Display| format!("unreadable request: {e}");
    let Some(line) = receive::<serde_json::Value>(input).map_err(|e| unreadable(&e))? else {
        return Ok(None);
    };
    match line.get("v") {
        None => {}
        Some(v) if v.as_u64() == Some(u64::from(VERSION)) => {}
        Some(v) => {
            return Err(format!(
                "protocol version {v} is not one this gpupin serve speaks (it speaks {VERSION}): use a client of the same gpupin release, or leave \"v\" out for version 1"
            ));
        }
    }
    serde_json::from_value::<Envelope>(line)
        .map(|e| Some(e.request))
        .map_err(|e| unreadable(&e))
}

/// Reads one line (at most `MAX_MESSAGE` bytes) as a `T`. `Ok(None)`: the peer closed the
/// connection.
pub(super) fn receive<T: for<'de> Deserialize<'de>>(
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

    /// Issue 31, finding 2: at `log = debug` the daemon logged requests whole, a
    /// holder's key included, although the docs said keys were hidden.
    #[test]
    fn a_request_shown_in_the_log_hides_every_key() {
        let key = "0123456789abcdef0123456789abcdef";
        let exec = Request::Exec {
            request: vec![
                ("gpupin.count".into(), "1".into()),
                ("gpupin.within".into(), format!("res-7:{key}")),
            ],
            name: None,
        };
        let hold = Request::Hold(HoldRequest {
            id: "h".into(),
            devices: String::new(),
            by_minor: false,
            pid: Some(42),
            until_release: false,
            user: None,
            within: Some(format!("res-7:{key}")),
            count: Some(1),
            mig: None,
            reason: None,
            for_secs: None,
            request: vec![("gpupin.within".into(), format!("res-7:{key}"))],
            wait: None,
        });
        for request in [exec, hold] {
            let shown = format!("{:?}", request.without_keys());
            assert!(!shown.contains(key), "{shown}");
            assert!(shown.contains("res-7:(key)"), "{shown}");
            assert!(
                format!("{request:?}").contains(key),
                "the request itself is unchanged"
            );
        }
        let plain = Request::Key { id: "res-7".into() };
        assert_eq!(plain.without_keys(), plain);
    }

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

    /// A request of a client before versions (no `v`) is version 1; `v` 1 is read the
    /// same; any other version is refused in one line whatever the rest says, and a reply
    /// always says the daemon's version.
    #[test]
    fn a_request_is_version_1_unless_it_names_another_which_is_refused() {
        let read = |line: &str| receive_request(&mut std::io::BufReader::new(line.as_bytes()));
        let bind = Some(Request::Bind { pid: 7 });
        assert_eq!(read("{\"op\":\"bind\",\"pid\":7}\n"), Ok(bind.clone()));
        assert_eq!(read("{\"v\":1,\"op\":\"bind\",\"pid\":7}\n"), Ok(bind));
        assert_eq!(
            read("{\"v\":1,\"op\":\"hello\"}\n"),
            Ok(Some(Request::Hello))
        );
        let refused = "protocol version 2 is not one this gpupin serve speaks (it speaks 1): use a client of the same gpupin release, or leave \"v\" out for version 1";
        assert_eq!(
            read("{\"v\":2,\"op\":\"bind\",\"pid\":7}\n"),
            Err(refused.into())
        );
        assert_eq!(read("{\"v\":2,\"op\":\"teleport\"}\n"), Err(refused.into()));
        let odd = read("{\"v\":\"1\",\"op\":\"hello\"}\n").unwrap_err();
        assert!(
            odd.starts_with("protocol version \"1\" is not one"),
            "{odd}"
        );
        let unknown = read("{\"v\":1,\"op\":\"teleport\"}\n").unwrap_err();
        assert!(
            unknown.starts_with("unreadable request: unknown variant `teleport`"),
            "{unknown}"
        );
        assert!(!unknown.contains('\n'));
        assert_eq!(read(""), Ok(None));

        // What the Rust client sends says its version; a reply too, and one without (a
        // daemon before versions) reads as 1.
        let mut buf = Vec::new();
        send(&mut buf, &Envelope::new(Request::Hello)).unwrap();
        assert_eq!(buf, b"{\"v\":1,\"op\":\"hello\"}\n");
        let mut buf = Vec::new();
        send(&mut buf, &Reply::refused("no")).unwrap();
        assert_eq!(buf, b"{\"v\":1,\"error\":\"no\"}\n");
        let old: Reply = serde_json::from_str("{\"holder\":\"h\"}").unwrap();
        assert_eq!((old.v, old.holder.as_deref()), (1, Some("h")));
    }

    /// The evict op as a client sends it, fields it leaves out defaulted; a reply says
    /// `cancelled` only when it was.
    #[test]
    fn evict_travels_as_one_line_and_cancelled_only_when_true() {
        let mut buf = Vec::new();
        let evict = Request::Evict {
            id: "exec-7".into(),
            reason: Some("wrong input".into()),
            grace_secs: Some(5),
        };
        send(&mut buf, &Envelope::new(evict.clone())).unwrap();
        assert_eq!(
            buf,
            b"{\"v\":1,\"op\":\"evict\",\"id\":\"exec-7\",\"reason\":\"wrong input\",\"grace_secs\":5}\n"
        );
        let read = |line: &str| receive_request(&mut std::io::BufReader::new(line.as_bytes()));
        assert_eq!(read(std::str::from_utf8(&buf).unwrap()), Ok(Some(evict)));
        assert_eq!(
            read("{\"op\":\"evict\",\"id\":\"h\"}\n"),
            Ok(Some(Request::Evict {
                id: "h".into(),
                reason: None,
                grace_secs: None
            }))
        );
        let reply = Reply {
            holder: Some("bob-q".into()),
            cancelled: true,
            ..Reply::default()
        };
        let mut buf = Vec::new();
        send(&mut buf, &reply).unwrap();
        assert_eq!(buf, b"{\"v\":1,\"holder\":\"bob-q\",\"cancelled\":true}\n");
        let mut buf = Vec::new();
        send(&mut buf, &Reply::default()).unwrap();
        assert_eq!(buf, b"{\"v\":1}\n");
    }

    /// A hold travels as it did when its fields were the `Hold` variant's own: `op`
    /// first, every field by its name, `mig` and `request` left out when empty, a wait
    /// for root's own hold never sent.
    #[test]
    fn a_hold_request_keeps_its_wire_format() {
        let hold = Request::Hold(HoldRequest {
            id: "h".into(),
            devices: "0,1".into(),
            pid: Some(42),
            count: None,
            wait: Some(std::time::Duration::from_secs(60)),
            ..HoldRequest::default()
        });
        let mut buf = Vec::new();
        send(&mut buf, &Envelope::new(hold.clone())).unwrap();
        assert_eq!(
            std::str::from_utf8(&buf).unwrap(),
            "{\"v\":1,\"op\":\"hold\",\"id\":\"h\",\"devices\":\"0,1\",\"by_minor\":false,\"pid\":42,\"until_release\":false,\"user\":null,\"within\":null,\"count\":null,\"reason\":null,\"for_secs\":null}\n"
        );
        let read = |line: &str| receive_request(&mut std::io::BufReader::new(line.as_bytes()));
        let Ok(Some(Request::Hold(back))) = read(std::str::from_utf8(&buf).unwrap()) else {
            panic!("no hold read back");
        };
        let Request::Hold(sent) = hold else {
            unreachable!()
        };
        assert_eq!(back, HoldRequest { wait: None, ..sent });
        // What the Python client sends: only what it needs, the rest by default.
        let keys = read(
            "{\"op\":\"hold\",\"id\":\"py\",\"devices\":\"\",\"pid\":7,\"mig\":\"1g.10gb\",\"request\":[[\"gpupin.count\",\"1\"]]}\n",
        );
        assert_eq!(
            keys,
            Ok(Some(Request::Hold(HoldRequest {
                id: "py".into(),
                pid: Some(7),
                mig: Some("1g.10gb".into()),
                request: vec![("gpupin.count".into(), "1".into())],
                ..HoldRequest::default()
            })))
        );
    }

    #[test]
    fn an_oversized_or_unknown_message_is_an_error() {
        let big = vec![b'x'; MAX_MESSAGE as usize + 10];
        assert!(receive::<Request>(&mut std::io::BufReader::new(&big[..])).is_err());
        let odd = b"{\"op\":\"format_disk\"}\n";
        assert!(receive::<Request>(&mut std::io::BufReader::new(&odd[..])).is_err());
    }
}
