//! `hello`: the daemon's protocol version (every reply says it) and gpupin version,
//! changing nothing.

use super::super::protocol::Reply;

/// The reply to a hello.
pub(in crate::jobs::serve) fn answer() -> Reply {
    Reply {
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        ..Reply::default()
    }
}
