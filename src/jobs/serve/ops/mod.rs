//! The daemon's operations, one file each: what it does for the caller (`peer`, as the
//! kernel says it is) and the reply it sends. `dispatch` hands each request to its op.
//! What is shared among them: the replies of a grant and a cancel, and why the daemon
//! said no (`Refusal`), which becomes the reply, and an audit line for a denial, here.

pub(super) mod evict;
pub(super) mod exec;
pub(super) mod hello;
pub(super) mod hold;
pub(super) mod key;
pub(super) mod release;
pub(super) mod status;

use super::peer::Peer;
use super::protocol::Reply;
use crate::host::users;
use crate::input::config::Config;
use crate::state::audit::GpuRef;
use crate::state::ledger::Record;

/// The reply to a release or evict that cancelled a queued request.
pub(super) fn cancelled(waiting: &crate::state::ledger::Waiting) -> Reply {
    Reply {
        holder: Some(waiting.holder.clone()),
        cancelled: true,
        ..Reply::default()
    }
}

pub(super) fn granted(record: &Record) -> Reply {
    Reply {
        holder: Some(record.id.clone()),
        gpus: GpuRef::of_record(record),
        ..Reply::default()
    }
}

/// The reply to a hold or release: what it did, or why not (a refusal of who may do what
/// is audited here).
pub(super) fn reply_for(
    config: &Config,
    peer: Peer,
    id: &str,
    outcome: Result<Record, Refusal>,
) -> Reply {
    match outcome {
        Ok(record) => granted(&record),
        Err(Refusal::Denied(e)) => {
            audit_refusal(config, peer, id, &e);
            Reply::refused(e)
        }
        Err(Refusal::Failed(e)) => Reply::refused(e),
    }
}

/// An audit line for a request the daemon itself refused (who may do what); refusals of
/// the allocation are written by `grant::allocate`.
pub(super) fn audit_refusal(config: &Config, peer: Peer, holder: &str, reason: &str) {
    if let Ok(ledger) = crate::state::open_ledger(config) {
        let user = users::owner_of(peer.uid).ok().map(|o| o.user);
        ledger.audit(&crate::state::audit::Event {
            uid: Some(peer.uid),
            user,
            pid: Some(peer.pid),
            code: Some("not_yours".into()),
            ..crate::state::audit::Event::new(crate::state::audit::EventKind::Refuse, holder)
                .because(reason)
        });
    }
}

/// Why the daemon said no: the caller may not do this (audited here), or it could not be
/// done (a bad value, a refused allocation, which grant audits).
#[derive(Debug)]
pub(super) enum Refusal {
    Denied(String),
    Failed(String),
}
