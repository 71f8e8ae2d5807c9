//! `key`: the key to one of the caller's holders (`gpupin key`), `HOLDER:KEY`, for its
//! owner or root only.

use super::super::authorize;
use super::super::error::ServeError;
use super::super::peer::Peer;
use super::super::protocol::Reply;
use super::granted;
use crate::input::config::Config;
use crate::model::holder::HolderId;
use crate::state::ledger::Record;

/// The reply to a key request: the holder, its GPUs and its key.
pub(in crate::jobs::serve) fn answer(
    config: &Config,
    peer: Peer,
    id: &str,
) -> Result<Reply, ServeError> {
    let (record, key) = key_for(config, peer, id)?;
    Ok(Reply {
        key: Some(key),
        ..granted(&record)
    })
}

/// The key to `id`, `HOLDER:KEY`, for its owner or root: whoever holds it may let others
/// in (a container of theirs, a colleague's job), and no one else may.
fn key_for(config: &Config, peer: Peer, id: &str) -> Result<(Record, String), ServeError> {
    let holder = HolderId::new(id)?;
    let ledger = crate::state::open_ledger(config)?;
    match ledger.key(&holder)? {
        Some((record, key)) => {
            authorize::may_have_key(peer, &record).map_err(ServeError::Denied)?;
            let key = format!("{}:{key}", record.id);
            Ok((record, key))
        }
        None => Err(ServeError::NoRunningHolder { id: id.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::{alices_hold, caller, daemon, denied, failed};

    #[test]
    fn only_a_holders_owner_or_root_has_its_key() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        let config = &*config;
        alices_hold(config, "res", "0");
        let (record, key) = key_for(config, caller(1001), "res").unwrap();
        assert_eq!(record.id, "res");
        assert_eq!(key.len(), "res:".len() + 32, "{key}");
        assert!(key.starts_with("res:"), "{key}");
        assert_eq!(key_for(config, caller(0), "res").unwrap().1, key);
        assert_eq!(
            denied(key_for(config, caller(1002), "res")),
            "holder res is alice's: only its owner or root may have its key"
        );
        assert_eq!(
            failed(key_for(config, caller(1001), "gone")),
            "no running holder gone (see gpupin status)"
        );
    }
}
