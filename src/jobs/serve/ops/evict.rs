//! `evict`: a user's `gpupin evict` of one of their own holders that still runs (root:
//! anyone's), stopped by the daemon as root (`jobs::evict`) and released once gone, or a
//! queued request of theirs, cancelled; naming another's is a refusal the audit log keeps.

use super::super::peer::Peer;
use super::super::protocol::Reply;
use super::{Refusal, cancelled, granted, reply_for};
use crate::base::message::one_line;
use crate::host::users;
use crate::input::config::Config;
use crate::jobs::evict::{self, EvictError, Evictor};
use crate::state::ledger::LedgerError;
use crate::state::ledger::lookup::Match;
use std::time::Duration;

/// The reply to an evict: the holder released, how it was stopped, and its GPUs; the
/// request cancelled; or why not.
pub(in crate::jobs::serve) fn answer(
    config: &Config,
    peer: Peer,
    id: &str,
    reason: Option<String>,
    grace_secs: Option<u64>,
) -> Reply {
    match evict_for(config, peer, id, reason, grace_secs) {
        Ok(reply) => reply,
        Err(refusal) => reply_for(config, peer, id, Err(refusal)),
    }
}

/// A user's `gpupin evict`: one of their own holders, stopped by the daemon as root
/// (`jobs::evict`), or a queued request of theirs, cancelled; naming another's is a
/// refusal the audit log keeps.
fn evict_for(
    config: &Config,
    peer: Peer,
    id: &str,
    reason: Option<String>,
    grace_secs: Option<u64>,
) -> Result<Reply, Refusal> {
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
    outcome.map_err(|e| match e {
        EvictError::NotYours { .. } | EvictError::Ledger(LedgerError::NotYourRequest { .. }) => {
            Refusal::Denied(one_line(&e))
        }
        e => Refusal::Failed(one_line(&e)),
    })
}
