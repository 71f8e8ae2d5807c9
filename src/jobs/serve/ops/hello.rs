//! `hello`: the daemon's protocol version (every reply says it) and gpupin version,
//! changing nothing.

use super::super::error::ServeError;
use super::super::protocol::Reply;

/// The reply to a hello: it is never refused.
pub(in crate::jobs::serve) fn answer() -> Result<Reply, ServeError> {
    Ok(Reply {
        version: Some(env!("CARGO_PKG_VERSION").to_string()),
        ..Reply::default()
    })
}
