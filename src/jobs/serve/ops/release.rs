//! `release`: a user's `gpupin release` of one of their own holders, by the name status
//! shows (whole ids only with `exact`); a queued request of theirs is cancelled. Taking
//! another's is a refusal the audit log keeps.

use super::super::authorize;
use super::super::peer::Peer;
use super::super::protocol::Reply;
use super::{Refusal, cancelled, reply_for};
use crate::base::message::one_line;
use crate::input::config::Config;
use crate::state::ledger::lookup::Match;
use crate::state::ledger::{LedgerError, Record, Released, Releaser};

/// The reply to a release: the holder released and its GPUs, the request cancelled, no
/// holder at all (`ignore_missing`, none of that name), or why not.
pub(in crate::jobs::serve) fn answer(
    config: &Config,
    peer: Peer,
    id: &str,
    force: bool,
    exact: bool,
    ignore_missing: bool,
) -> Reply {
    let how = if exact { Match::Exact } else { Match::Shown };
    match release_named_for(config, peer, id, force, how) {
        Err(LedgerError::NoSuchHolder { .. }) if ignore_missing => Reply::default(),
        Ok(Released::Request(waiting)) => cancelled(&waiting),
        released => reply_for(config, peer, id, refusal_of(id, released)),
    }
}

/// A user's `gpupin release`: `Ledger::release_named` among their own holders, by the
/// name status shows, as themselves.
fn release_named_for(
    config: &Config,
    peer: Peer,
    id: &str,
    force: bool,
    how: Match,
) -> Result<Released, LedgerError> {
    let ledger = crate::state::open_ledger(config)?;
    let user = crate::host::users::owner_of(peer.uid)
        .map(|o| o.user)
        .unwrap_or_else(|_| format!("uid {}", peer.uid));
    let by = Releaser {
        uid: peer.uid,
        user,
        force,
        how,
        command: "release",
    };
    ledger.release_named(std::ffi::OsStr::new(id), &by)
}

/// A release's outcome as the reply says it: taking another's holder is a refusal the
/// audit log keeps, anything else a failure.
fn refusal_of(id: &str, released: Result<Released, LedgerError>) -> Result<Record, Refusal> {
    match released {
        Ok(Released::Holder(record)) => Ok(*record),
        Ok(_) => Err(Refusal::Failed(format!("{id} holds nothing"))),
        Err(e) if authorize::is_denial(&e) => Err(Refusal::Denied(one_line(&e))),
        Err(e) => Err(Refusal::Failed(one_line(&e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::{NOBODY, alices_hold, caller, daemon, failed, refusals};

    /// A user's `gpupin release` as the daemon answers it: among their own holders, by the name status shows.
    fn release_for(
        config: &Config,
        peer: Peer,
        id: &str,
        force: bool,
        how: Match,
    ) -> Result<Record, Refusal> {
        refusal_of(id, release_named_for(config, peer, id, force, how))
    }

    #[test]
    fn a_user_releases_only_their_own_holder_and_a_refusal_is_audited() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        let config = &*config;
        alices_hold(config, "res", "0");
        let nobody = caller(NOBODY);
        let outcome = release_for(config, nobody, "res", false, Match::Shown);
        let reply = reply_for(config, nobody, "res", outcome);
        let why = "holder res is alice's, not nobody's: only alice or root may release it";
        assert_eq!(reply.error.as_deref(), Some(why));
        assert_eq!(reply.holder, None);
        let refusal = refusals(tmp.path())
            .into_iter()
            .find(|l| l["holder"] == "res")
            .expect("the refusal is audited");
        assert_eq!(refusal["event"], "refuse");
        assert_eq!(refusal["holder"], "res");
        assert_eq!(refusal["uid"], NOBODY);
        assert_eq!(refusal["user"], "nobody");
        assert_eq!(refusal["pid"], std::process::id());
        assert_eq!(refusal["code"], "not_yours");
        assert_eq!(refusal["reason"], why);
        // Still held; its owner releases it, and then it holds nothing.
        let reply = reply_for(
            config,
            caller(1001),
            "res",
            release_for(config, caller(1001), "res", false, Match::Shown),
        );
        assert_eq!((reply.error, reply.holder), (None, Some("res".to_string())));
        assert_eq!(reply.gpus.len(), 1);
        let gone = "no holder \"res\": give a name or id as gpupin status shows it (an id may be cut to its first 12 characters)";
        let outcome = release_for(config, caller(1001), "res", false, Match::Shown);
        assert_eq!(failed(outcome), gone);
        // A request that could not be done is no refusal of who may do what.
        let reply = reply_for(
            config,
            caller(1001),
            "res",
            release_for(config, caller(1001), "res", false, Match::Shown),
        );
        assert_eq!(reply.error.as_deref(), Some(gone));
        assert_eq!(refusals(tmp.path()).len(), 1);
    }
}
