//! `status`: the ledger as `gpupin status --json` shows it, as the status reader the
//! daemon was started with makes it (the report layer sits above this one).

use super::super::connections::StatusReader;
use super::super::error::ServeError;
use super::super::protocol::Reply;
use crate::input::config::Config;

/// The reply to a status request: the status JSON.
pub(in crate::jobs::serve) fn answer(
    status: StatusReader,
    config: &Config,
) -> Result<Reply, ServeError> {
    let status = status(config).map_err(ServeError::Status)?;
    Ok(Reply {
        status: Some(status),
        ..Reply::default()
    })
}
