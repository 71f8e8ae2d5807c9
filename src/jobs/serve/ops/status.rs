//! `status`: the ledger as `gpupin status --json` shows it, as the status reader the
//! daemon was started with makes it (the report layer sits above this one).

use super::super::connections::StatusReader;
use super::super::protocol::Reply;
use crate::input::config::Config;

/// The reply to a status request: the status JSON, or why there is none.
pub(in crate::jobs::serve) fn answer(status: StatusReader, config: &Config) -> Reply {
    match status(config) {
        Ok(status) => Reply {
            status: Some(status),
            ..Reply::default()
        },
        Err(why) => Reply::refused(why),
    }
}
