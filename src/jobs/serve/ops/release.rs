//! `release`: a user's `gpupin release` of one of their own holders, by the name status
//! shows (whole ids only with `exact`); a queued request of theirs is cancelled. Taking
//! another's is a refusal the audit log keeps.

use super::super::error::ServeError;
use super::super::peer::Peer;
use super::super::protocol::Reply;
use super::{cancelled, granted};
use crate::input::config::Config;
use crate::state::ledger::lookup::Match;
use crate::state::ledger::{LedgerError, Record, Released, Releaser};

/// The reply to a release: the holder released and its GPUs, the request cancelled, or
/// no holder at all (`ignore_missing`, none of that name).
pub(in crate::jobs::serve) fn answer(
    config: &Config,
    peer: Peer,
    id: &str,
    force: bool,
    exact: bool,
    ignore_missing: bool,
) -> Result<Reply, ServeError> {
    let how = if exact { Match::Exact } else { Match::Shown };
    match release_named_for(config, peer, id, force, how) {
        Err(LedgerError::NoSuchHolder { .. }) if ignore_missing => Ok(Reply::default()),
        Ok(Released::Request(waiting)) => Ok(cancelled(&waiting)),
        released => refusal_of(id, released).map(|record| granted(&record)),
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

/// The holder a release released; taking another's holder is a refusal the audit log
/// keeps (`ServeError::is_denial`), anything else a failure.
fn refusal_of(id: &str, released: Result<Released, LedgerError>) -> Result<Record, ServeError> {
    match released? {
        Released::Holder(record) => Ok(*record),
        _ => Err(ServeError::HoldsNothing { id: id.to_string() }),
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
    ) -> Result<Record, ServeError> {
        refusal_of(id, release_named_for(config, peer, id, force, how))
    }

    /// The reply to a release's outcome, a denial audited, as the daemon sends it.
    fn reply_for(
        config: &Config,
        peer: Peer,
        id: &str,
        outcome: Result<Record, ServeError>,
    ) -> Reply {
        outcome.map_or_else(|e| e.reply(config, peer, id), |record| granted(&record))
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
