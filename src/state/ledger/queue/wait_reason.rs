//! Why a request still waits in the queue, as its waiter found at its last look: what
//! `gpupin queue`, `status`, `exec`'s progress line and the daemon's log show, so that a
//! user held back by their own limit is not told "1 ahead in the queue" with GPUs free.

use crate::input::request::{GpuRequest, Selection};
use crate::state::ledger::LedgerError;
use crate::state::ledger::decide::DecideError;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "why")]
pub enum WaitReason {
    /// Waiters ahead of it could use the GPUs it would take: their turn comes first.
    Ahead { waiters: usize },
    /// Its user holds as many GPUs as their limit allows (it is parked).
    OwnLimit,
    /// A group of its user's holds as many GPUs as the group's limit allows (parked).
    GroupLimit { group: String },
    /// Fewer GPUs are free than it asks for (a plain count: any GPU would do).
    TooFewFree,
    /// Too few of the GPUs it could take are free: those it names, of its model or
    /// memory, of its MIG profile, inside its holder.
    NotFreeOfItsKind,
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitReason::Ahead { waiters } => write!(f, "{waiters} ahead of it"),
            WaitReason::OwnLimit => f.write_str("own limit"),
            WaitReason::GroupLimit { group } => write!(f, "group limit ({group})"),
            WaitReason::TooFewFree => f.write_str("too few GPUs free"),
            WaitReason::NotFreeOfItsKind => f.write_str("no free GPU of its kind"),
        }
    }
}

impl WaitReason {
    /// Held back by a limit: the waiter is parked, in no one's way.
    pub fn is_limit(&self) -> bool {
        matches!(self, WaitReason::OwnLimit | WaitReason::GroupLimit { .. })
    }

    /// The reason a refusal by the limits gives: the user's own, or a group's.
    pub(in crate::state::ledger) fn of_limit(err: &DecideError) -> Option<WaitReason> {
        match err {
            DecideError::LimitReached(reached) => Some(match &reached.group {
                Some(group) => WaitReason::GroupLimit {
                    group: group.clone(),
                },
                None => WaitReason::OwnLimit,
            }),
            _ => None,
        }
    }

    /// Why a look at `request` found it cannot be served yet (`err`); `None` where the
    /// refusal is no reason to wait (the waiter ends with it, or retries it as it was).
    pub(in crate::state::ledger) fn of_refusal(
        err: &LedgerError,
        request: &GpuRequest,
    ) -> Option<WaitReason> {
        match err {
            LedgerError::QueueAhead { waiting, .. } => {
                Some(WaitReason::Ahead { waiters: *waiting })
            }
            LedgerError::Decide(refused) => match refused {
                DecideError::LimitReached(_) => Self::of_limit(refused),
                DecideError::NotEnoughFree { .. } if any_gpu_would_do(request) => {
                    Some(WaitReason::TooFewFree)
                }
                DecideError::NotEnoughFree { .. }
                | DecideError::DeviceUnavailable { .. }
                | DecideError::NotEnoughMig(_)
                | DecideError::MigUnavailable(_) => Some(WaitReason::NotFreeOfItsKind),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A plain count with nothing that narrows which GPUs: any free one would do.
fn any_gpu_would_do(request: &GpuRequest) -> bool {
    matches!(request.selection, Selection::Count(_))
        && request.model.is_none()
        && request.memory.is_none()
        && request.mig.is_none()
        && request.within.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::request::Origin;

    fn request(pairs: &[(&str, &str)]) -> GpuRequest {
        crate::input::request::from_pairs(pairs, Origin::Cli)
            .unwrap()
            .unwrap()
    }

    fn not_enough() -> LedgerError {
        LedgerError::Decide(DecideError::NotEnoughFree {
            id: "a".into(),
            wanted: 2,
            held: 8,
            total: 8,
            busy: 0,
            fenced: 0,
            ever: 8,
            detail: String::new(),
        })
    }

    fn limit(group: Option<&str>) -> LedgerError {
        LedgerError::Decide(DecideError::LimitReached(Box::new(
            crate::state::ledger::decide::LimitReached {
                user: "alice".into(),
                group: group.map(str::to_string),
                held: 2,
                wanted: 1,
                limit: 2,
                key: "limits.max_gpus_per_user".into(),
            },
        )))
    }

    #[test]
    fn each_refusal_gives_the_reason_people_read() {
        let count = request(&[("gpupin.count", "2")]);
        let why = |err: &LedgerError, r: &GpuRequest| {
            WaitReason::of_refusal(err, r).map(|w| w.to_string())
        };
        assert_eq!(
            why(&not_enough(), &count).as_deref(),
            Some("too few GPUs free")
        );
        let ahead = LedgerError::QueueAhead {
            id: "a".into(),
            waiting: 3,
        };
        assert_eq!(why(&ahead, &count).as_deref(), Some("3 ahead of it"));
        assert_eq!(why(&limit(None), &count).as_deref(), Some("own limit"));
        assert_eq!(
            why(&limit(Some("ml")), &count).as_deref(),
            Some("group limit (ml)")
        );
        for narrowed in [
            request(&[("gpupin.count", "2"), ("gpupin.model", "A100")]),
            request(&[("gpupin.count", "2"), ("gpupin.memory", "40GiB")]),
            request(&[("gpupin.devices", "3")]),
        ] {
            assert_eq!(
                why(&not_enough(), &narrowed).as_deref(),
                Some("no free GPU of its kind"),
                "{narrowed:?}"
            );
        }
        let gone = LedgerError::NoSuchHolder { given: "a".into() };
        assert_eq!(why(&gone, &count), None);
    }

    #[test]
    fn only_a_limit_parks() {
        assert!(WaitReason::OwnLimit.is_limit());
        assert!(WaitReason::GroupLimit { group: "ml".into() }.is_limit());
        assert!(!WaitReason::TooFewFree.is_limit());
        assert!(!WaitReason::NotFreeOfItsKind.is_limit());
        assert!(!WaitReason::Ahead { waiters: 1 }.is_limit());
        let LedgerError::Decide(refused) = not_enough() else {
            unreachable!("not_enough is a refusal of decide's")
        };
        assert_eq!(WaitReason::of_limit(&refused), None);
    }
}
