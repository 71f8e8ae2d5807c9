//! The bytes on NRI's socket: ttrpc messages, carried over NRI's multiplexer.
//!
//! - Multiplexer: frames of an 8-byte header (connection id, payload length; big-endian
//!   u32 each) and the payload, a piece of that connection's byte stream. The plugin
//!   serves the Plugin service on connection 1 and calls the Runtime service on
//!   connection 2. The runtime's reader takes a frame of at most 4096 bytes at a time (a
//!   longer one breaks the connection), so messages go out in pieces of 4096.
//! - ttrpc: a 10-byte header (data length, stream id: big-endian u32; type: 1 request,
//!   2 response; flags, 0 for unary calls) and the data: a `Request` or a `Response`.
//!   A caller numbers its calls 1, 3, 5, ...; the answer comes on the same stream id.

use prost::Message;
use std::collections::HashMap;
use std::io::{self, Read, Write};

/// The connection on which the runtime calls the plugin.
pub const PLUGIN_CONN: u32 = 1;
/// The connection on which the plugin calls the runtime.
pub const RUNTIME_CONN: u32 = 2;

pub const REQUEST: u8 = 1;
pub const RESPONSE: u8 = 2;

/// The largest ttrpc message either side takes.
pub const MAX_MESSAGE: usize = 4 << 20;
/// The largest multiplexer frame the runtime's reader takes whole.
pub const MAX_FRAME: usize = 4096;

/// gRPC status codes a plugin answers with.
pub mod code {
    pub const INVALID_ARGUMENT: i32 = 3;
    /// An unknown method: a runtime of NRI 0.12 then sends the event as `StateChange`.
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
}

/// ttrpc's request envelope.
#[derive(Clone, PartialEq, Message)]
pub struct Request {
    #[prost(string, tag = "1")]
    pub service: String,
    #[prost(string, tag = "2")]
    pub method: String,
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
}

/// ttrpc's response envelope: no status is success.
#[derive(Clone, PartialEq, Message)]
pub struct Response {
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// `google.rpc.Status`, what ttrpc carries for an error.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// One ttrpc message as read: which connection, which stream, request or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub conn: u32,
    pub stream: u32,
    pub kind: u8,
    pub data: Vec<u8>,
}

/// Reads ttrpc messages off a multiplexed socket: the pieces of each connection are
/// joined, and messages cut from them as they complete.
pub struct Reader<R> {
    inner: R,
    pending: HashMap<u32, Vec<u8>>,
}

impl<R: Read> Reader<R> {
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            pending: HashMap::new(),
        }
    }

    /// The next whole message; `None` at the end of the socket.
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if let Some(frame) = self.complete()? {
                return Ok(Some(frame));
            }
            let mut header = [0u8; 8];
            match self.inner.read_exact(&mut header) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(e),
            }
            let conn = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(header[4..].try_into().expect("4 bytes")) as usize;
            if len > MAX_MESSAGE + 10 {
                return Err(invalid(format!(
                    "a frame of {len} bytes, more than any message"
                )));
            }
            let mut piece = vec![0; len];
            self.inner.read_exact(&mut piece)?;
            let buffer = self.pending.entry(conn).or_default();
            buffer.extend_from_slice(&piece);
            if buffer.len() > 2 * (MAX_MESSAGE + 10) {
                return Err(invalid(format!(
                    "connection {conn} sent more than a message"
                )));
            }
        }
    }

    /// A message whole in one connection's buffer, cut from it.
    fn complete(&mut self) -> io::Result<Option<Frame>> {
        for (&conn, buffer) in &mut self.pending {
            if buffer.len() < 10 {
                continue;
            }
            let len = u32::from_be_bytes(buffer[..4].try_into().expect("4 bytes")) as usize;
            if len > MAX_MESSAGE {
                return Err(invalid(format!(
                    "a message of {len} bytes, past ttrpc's 4 MiB"
                )));
            }
            if buffer.len() < 10 + len {
                continue;
            }
            let stream = u32::from_be_bytes(buffer[4..8].try_into().expect("4 bytes"));
            let kind = buffer[8];
            let data = buffer[10..10 + len].to_vec();
            buffer.drain(..10 + len);
            return Ok(Some(Frame {
                conn,
                stream,
                kind,
                data,
            }));
        }
        Ok(None)
    }
}

/// Writes one ttrpc message on connection `conn`, in multiplexer frames of at most
/// `MAX_FRAME` bytes, with one `write_all` (the caller holds the socket for it).
pub fn write_message(
    out: &mut impl Write,
    conn: u32,
    stream: u32,
    kind: u8,
    data: &[u8],
) -> io::Result<()> {
    if data.len() > MAX_MESSAGE {
        return Err(invalid(format!(
            "a message of {} bytes, past ttrpc's 4 MiB",
            data.len()
        )));
    }
    let mut message = Vec::with_capacity(10 + data.len());
    message.extend_from_slice(&(data.len() as u32).to_be_bytes());
    message.extend_from_slice(&stream.to_be_bytes());
    message.extend_from_slice(&[kind, 0]);
    message.extend_from_slice(data);
    let mut frames = Vec::with_capacity(message.len() + 8 * (message.len() / MAX_FRAME + 1));
    for piece in message.chunks(MAX_FRAME) {
        frames.extend_from_slice(&conn.to_be_bytes());
        frames.extend_from_slice(&(piece.len() as u32).to_be_bytes());
        frames.extend_from_slice(piece);
    }
    out.write_all(&frames)?;
    out.flush()
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RegisterPluginRequest;

    /// NRI's own libraries framed this registration so (a test vector from them).
    #[test]
    fn a_registration_is_framed_as_nris_libraries_frame_it() {
        let register = RegisterPluginRequest {
            plugin_name: "gpupin".into(),
            plugin_idx: "50".into(),
            nri_version: String::new(),
        };
        let request = Request {
            service: crate::api::RUNTIME_SERVICE.into(),
            method: "RegisterPlugin".into(),
            payload: register.encode_to_vec(),
            timeout_nano: 0,
        };
        let mut out = Vec::new();
        write_message(&mut out, RUNTIME_CONN, 1, REQUEST, &request.encode_to_vec()).unwrap();
        let mut expected = vec![0, 0, 0, 2, 0, 0, 0, 0x46, 0, 0, 0, 0x3c, 0, 0, 0, 1, 1, 0];
        expected.extend_from_slice(&[0x0a, 0x1c]);
        expected.extend_from_slice(b"nri.pkg.api.v1alpha1.Runtime");
        expected.extend_from_slice(&[0x12, 0x0e]);
        expected.extend_from_slice(b"RegisterPlugin");
        expected.extend_from_slice(&[0x1a, 0x0c, 0x0a, 0x06]);
        expected.extend_from_slice(b"gpupin");
        expected.extend_from_slice(&[0x12, 0x02]);
        expected.extend_from_slice(b"50");
        assert_eq!(out, expected);
    }

    #[test]
    fn a_long_message_goes_in_frames_of_4096_and_is_read_back_whole() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        write_message(&mut out, PLUGIN_CONN, 7, RESPONSE, &data).unwrap();
        // Three frames: 4096, 4096 and the rest of 10 + 10,000 bytes.
        let lens: Vec<u32> = [0, 8 + 4096, 2 * (8 + 4096)]
            .iter()
            .map(|&at| u32::from_be_bytes(out[at + 4..at + 8].try_into().unwrap()))
            .collect();
        assert_eq!(lens, [4096, 4096, 10 + 10_000 - 2 * 4096]);
        // Another connection's message between them is read apart.
        let mut other = Vec::new();
        write_message(&mut other, RUNTIME_CONN, 1, RESPONSE, b"").unwrap();
        let mut mixed = out[..8 + 4096].to_vec();
        mixed.extend_from_slice(&other);
        mixed.extend_from_slice(&out[8 + 4096..]);
        let mut reader = Reader::new(mixed.as_slice());
        let first = reader.next_frame().unwrap().unwrap();
        assert_eq!(
            (first.conn, first.stream, first.data.len()),
            (RUNTIME_CONN, 1, 0)
        );
        let second = reader.next_frame().unwrap().unwrap();
        assert_eq!(
            (second.conn, second.stream, second.kind),
            (PLUGIN_CONN, 7, RESPONSE)
        );
        assert_eq!(second.data, data);
        assert_eq!(reader.next_frame().unwrap(), None);
    }

    #[test]
    fn an_oversized_frame_or_message_is_an_error_not_an_allocation() {
        let mut bytes = vec![0, 0, 0, 1];
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        let err = Reader::new(bytes.as_slice()).next_frame().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let mut bytes = vec![0, 0, 0, 1, 0, 0, 0, 10];
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        bytes.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        let err = Reader::new(bytes.as_slice()).next_frame().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
