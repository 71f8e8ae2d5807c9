//! `evict`: a user's `gpupin evict` of one of their own holders that still runs (root:
//! anyone's), stopped by the daemon as root (`jobs::evict`) and released once gone, or a
//! queued request of theirs, cancelled; naming another's is a refusal the audit log keeps.

use super::super::error::ServeError;
use super::super::peer::Peer;
use super::super::protocol::Reply;
use super::{cancelled, granted};
use crate::host::users;
use crate::input::config::Config;
use crate::jobs::evict::{self, EvictError, Evictor};
use crate::state::ledger::LedgerError;
use crate::state::ledger::lookup::Match;
use std::time::Duration;

/// A user's `gpupin evict`: one of their own holders, stopped by the daemon as root
/// (`jobs::evict`), or a queued request of theirs, cancelled; naming another's is a
/// refusal the audit log keeps.
pub(in crate::jobs::serve) fn answer(
    config: &Config,
    peer: Peer,
    id: &str,
    reason: Option<String>,
    grace_secs: Option<u64>,
) -> Result<Reply, ServeError> {
    let user = users::owner_of(peer.uid)
        .map(|o| o.user)
        .unwrap_or_else(|_| format!("uid {}", peer.uid));
    let grace = Duration::from_secs(grace_secs.unwrap_or(10)).min(evict::MAX_USER_GRACE);
    let by = Evictor {
        uid: peer.uid,
        user,
        reason,
        how: Match::Shown,
    };
    let outcome = match evict::evict(config, id, &by, grace) {
        Ok(eviction) => Ok(Reply {
            stopped: Some(eviction.how(grace)),
            ..granted(&eviction.record)
        }),
        Err(EvictError::Ledger(LedgerError::NoSuchHolder { .. })) => {
            evict::cancel_queued(config, id, &by).map(|w| cancelled(&w))
        }
        Err(e) => Err(e),
    };
    // Naming another's holder or request is a denial (`ServeError::is_denial`).
    Ok(outcome?)
}
