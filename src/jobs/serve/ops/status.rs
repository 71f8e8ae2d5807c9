//! `status`: the ledger as `gpupin status --json` shows it, made by the report layer
//! (below this one) without the GPUs' processes (`report::status::served`).

use super::super::error::ServeError;
use super::super::protocol::Reply;
use crate::input::config::Config;

/// The reply to a status request: the status JSON.
pub(in crate::jobs::serve) fn answer(config: &Config) -> Result<Reply, ServeError> {
    let status = crate::report::status::served(config).map_err(ServeError::Status)?;
    Ok(Reply {
        status: Some(status),
        ..Reply::default()
    })
}
