//! Who may do what through `gpupin serve`, decided from what the kernel says of the caller
//! (its uid and pid from SO_PEERCRED, a pinned process's parent and uid from /proc) and
//! never from what the caller sends. Each answer is pure, so that every rule is shown by
//! a test here; `server` asks and acts.
//!
//! Releasing and ending holders is decided in the ledger (`Ledger::release_named`,
//! `Ledger::cancel_waiting`) and in `jobs::evict`, for root's CLI and the daemon alike.

use super::peer::Peer;
use crate::state::ledger::{LedgerError, Record};

/// For whom a hold is: the caller, or (root only) the user it names. A user may name
/// themselves by name or uid.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HoldFor<'a> {
    Caller,
    Named(&'a str),
}

/// Whom `asked_user` makes the holder of a hold the caller (`me`, `peer`) asks for.
pub(super) fn hold_for<'a>(
    peer: Peer,
    me: &str,
    asked_user: Option<&'a str>,
) -> Result<HoldFor<'a>, String> {
    match asked_user {
        Some(name) if peer.uid == 0 => Ok(HoldFor::Named(name)),
        Some(name) if name != me && name != peer.uid.to_string() => {
            Err(format!("only root may hold GPUs for another user ({name})"))
        }
        _ => Ok(HoldFor::Caller),
    }
}

/// A user's hold ends with a process of theirs; only root holds until released.
pub(super) fn may_hold_without_process(
    peer: Peer,
    until_release: bool,
    pid: Option<i32>,
) -> Result<(), String> {
    match (until_release || pid.is_none()) && peer.uid != 0 {
        true => {
            Err("only root may hold GPUs until released: give --pid with a process of yours".into())
        }
        false => Ok(()),
    }
}

/// Whether a hold may be bound to the process `pid`, whose parent and uid are `found`
/// (`None`: it is gone): a process of the caller's own uid, any for root.
pub(super) fn may_pin(peer: Peer, pid: i32, found: Option<(i32, u32)>) -> Result<(), String> {
    match found {
        Some((_, uid)) if peer.uid == 0 || uid == peer.uid => Ok(()),
        _ => Err(format!("pid {pid} is not a process of uid {}", peer.uid)),
    }
}

/// Whether the caller's requests are held to `[limits]`: everyone's but root's.
pub(super) fn limited(peer: Peer) -> bool {
    peer.uid != 0
}

/// Whether a process whose parent pid and uid are `found` (from /proc, while it is pinned)
/// is a child the caller started as itself: a job takes its caller's GPUs, so it must be
/// the caller's own child, not any process of the same user, nor one running as another.
pub(super) fn started_by(peer: Peer, found: Option<(i32, u32)>) -> bool {
    matches!(found, Some((parent, uid)) if parent == peer.pid && uid == peer.uid)
}

/// Whether the caller may have the key to `record`: whoever holds it may let others in
/// (a container of theirs, a colleague's job), and no one else but root may.
pub(super) fn may_have_key(peer: Peer, record: &Record) -> Result<(), String> {
    let owners = record.owner.as_ref().is_some_and(|o| o.uid == peer.uid);
    if peer.uid == 0 || owners {
        return Ok(());
    }
    let whose = record
        .owner
        .as_ref()
        .map_or_else(|| format!("a {}", record.kind.as_str()), |o| o.user.clone());
    Err(format!(
        "holder {} is {whose}'s: only its owner or root may have its key",
        record.id
    ))
}

/// Whether the process a hold was asked for is the one its record names: its start time
/// when the record was written (`recorded`) is the one /proc gives now (`now`), and its
/// pidfd says it runs (`alive`). A pid ended and taken by another process in between
/// must not get the hold.
pub(super) fn still_the_process(recorded: Option<u64>, now: Option<u64>, alive: bool) -> bool {
    recorded.is_some() && recorded == now && alive
}

/// Whether a ledger's refusal means the caller asked for what is not theirs (a denial,
/// which the audit log keeps), rather than for what could not be done.
pub(super) fn is_denial(error: &LedgerError) -> bool {
    matches!(
        error,
        LedgerError::NotYours { .. } | LedgerError::NotYourRequest { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::holder::Owner;
    use crate::state::ledger::testing;

    const ALICE: Peer = Peer {
        pid: 4242,
        uid: 1001,
    };
    const ROOT: Peer = Peer { pid: 77, uid: 0 };

    fn owned_by(uid: Option<u32>) -> Record {
        let mut record = testing::record("train", &["GPU-0"]);
        record.owner = uid.map(|uid| Owner {
            uid,
            user: format!("user{uid}"),
            groups: vec![],
        });
        record
    }

    #[test]
    fn a_user_holds_for_themselves_and_only_root_for_another() {
        assert_eq!(hold_for(ALICE, "alice", None), Ok(HoldFor::Caller));
        assert_eq!(hold_for(ALICE, "alice", Some("alice")), Ok(HoldFor::Caller));
        assert_eq!(hold_for(ALICE, "alice", Some("1001")), Ok(HoldFor::Caller));
        assert_eq!(
            hold_for(ALICE, "alice", Some("bob")),
            Err("only root may hold GPUs for another user (bob)".into())
        );
        assert_eq!(
            hold_for(ALICE, "alice", Some("1002")),
            Err("only root may hold GPUs for another user (1002)".into())
        );
        assert_eq!(
            hold_for(ROOT, "root", Some("bob")),
            Ok(HoldFor::Named("bob"))
        );
        assert_eq!(hold_for(ROOT, "root", None), Ok(HoldFor::Caller));
    }

    #[test]
    fn only_root_holds_without_a_process_or_until_released() {
        let refused = Err(
            "only root may hold GPUs until released: give --pid with a process of yours"
                .to_string(),
        );
        assert_eq!(may_hold_without_process(ALICE, false, Some(9)), Ok(()));
        assert_eq!(may_hold_without_process(ALICE, false, None), refused);
        assert_eq!(may_hold_without_process(ALICE, true, Some(9)), refused);
        assert_eq!(may_hold_without_process(ROOT, true, None), Ok(()));
        assert_eq!(may_hold_without_process(ROOT, false, None), Ok(()));
    }

    #[test]
    fn a_hold_binds_a_process_of_the_callers_uid_and_root_any() {
        assert_eq!(may_pin(ALICE, 9, Some((1, 1001))), Ok(()));
        assert_eq!(
            may_pin(ALICE, 9, Some((1, 1002))),
            Err("pid 9 is not a process of uid 1001".into())
        );
        assert!(may_pin(ALICE, 9, None).is_err(), "gone meanwhile");
        assert_eq!(may_pin(ROOT, 9, Some((1, 1002))), Ok(()));
        assert!(
            may_pin(ROOT, 9, None).is_err(),
            "gone meanwhile, for root too"
        );
    }

    #[test]
    fn limits_hold_everyone_but_root() {
        assert!(limited(ALICE));
        assert!(!limited(ROOT));
        assert!(limited(Peer { pid: 1, uid: 65534 }));
    }

    #[test]
    fn a_job_is_only_a_child_the_caller_started_as_itself() {
        assert!(started_by(ALICE, Some((4242, 1001))));
        assert!(!started_by(ALICE, Some((4242, 0))), "a setuid child");
        assert!(
            !started_by(ALICE, Some((1, 1001))),
            "another process of alice's"
        );
        assert!(!started_by(ALICE, None), "gone meanwhile");
    }

    #[test]
    fn the_key_is_its_owners_and_roots() {
        assert_eq!(may_have_key(ALICE, &owned_by(Some(1001))), Ok(()));
        assert_eq!(
            may_have_key(ALICE, &owned_by(Some(1002))),
            Err("holder train is user1002's: only its owner or root may have its key".into())
        );
        let ownerless = may_have_key(ALICE, &owned_by(None)).unwrap_err();
        assert!(
            ownerless.starts_with("holder train is a ")
                && ownerless.ends_with("'s: only its owner or root may have its key"),
            "{ownerless}"
        );
        assert_eq!(may_have_key(ROOT, &owned_by(Some(1002))), Ok(()));
        assert_eq!(may_have_key(ROOT, &owned_by(None)), Ok(()));
    }

    #[test]
    fn a_hold_goes_to_the_process_asked_for_and_not_to_one_that_took_its_pid() {
        assert!(still_the_process(Some(100), Some(100), true));
        assert!(!still_the_process(Some(100), Some(200), true), "pid reused");
        assert!(!still_the_process(Some(100), Some(100), false), "ended");
        assert!(!still_the_process(None, None, true), "never seen");
        assert!(!still_the_process(Some(100), None, true), "gone from /proc");
    }

    #[test]
    fn taking_anothers_holder_or_request_is_a_denial_and_nothing_else_is() {
        let not_yours = LedgerError::NotYours {
            id: "a".into(),
            owner: "alice".into(),
            by: "bob".into(),
        };
        assert!(is_denial(&not_yours));
        let not_your_request = LedgerError::NotYourRequest {
            name: "q".into(),
            owner: "alice".into(),
        };
        assert!(is_denial(&not_your_request));
        let missing = LedgerError::NoSuchHolder { given: "a".into() };
        assert!(!is_denial(&missing));
    }
}
