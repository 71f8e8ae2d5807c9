//! Binding a claim to its container: the prestart hook of a container whose spec gpupin
//! edited before create (the Docker shim, podman's precreate) records the container's pid
//! in the record held under the claim. Only the container the claim was made for can do
//! that: its spec carries the claim's secret, which no one else has seen.

use super::claim::ClaimToken;
use crate::model::holder::HolderId;
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::record::Record;
use crate::state::ledger::store;
use crate::state::ledger::{Ledger, LedgerError};

/// Why a bind was refused. Every message names the claim's holder id, never its secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No record under the claim's id (it was released, reaped, or never existed).
    Unknown,
    /// A record exists, but the secret in the spec is not the one it was made with.
    WrongSecret,
    /// The claim is already bound to another live process.
    BoundElsewhere,
    /// The container holds GPUs of its own under another claim.
    HoldsOther,
}

impl Refusal {
    pub(super) fn reason(self) -> &'static str {
        match self {
            Refusal::Unknown => "no such claim is held",
            Refusal::WrongSecret => "gpupin did not make that claim for this container",
            Refusal::BoundElsewhere => "that claim is bound to another process",
            Refusal::HoldsOther => "the container already holds GPUs under another claim",
        }
    }
}

impl Ledger {
    /// Records `pid` as the process of `container`, whose spec carried `token` and
    /// `assigned` (the UUIDs gpupin wrote next to it). The claim's record becomes the
    /// container's. It must be unbound, or bound to this very process already (a prestart
    /// hook from the spec and another from hooks.d both bind: the second is a no-op), its
    /// secret must match, and it must hold exactly `assigned`.
    pub fn bind(
        &self,
        container: &HolderId,
        token: &ClaimToken,
        pid: i32,
        assigned: &[String],
    ) -> Result<Record, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        // The claim's record and the container's, read alone: binding hands out nothing,
        // so it has no reason to read the thousands of other holders' records.
        let claim = store::read_holder(&self.dir, token.holder())?;
        let refuse = |refusal: Refusal| LedgerError::ClaimRefused {
            id: container.to_string(),
            claim: token.holder().to_string(),
            reason: refusal.reason(),
        };
        let start_time = crate::base::procinfo::start_time(pid);
        let bound_here = |r: &Record| r.pid == Some(pid) && r.start_time == start_time;
        let Some(found) = claim.as_ref() else {
            // Already bound and renamed by an earlier hook of this same container.
            return match store::read_holder(&self.dir, container)? {
                Some(r) if token.matches(r.claim_digest.as_deref()) => match bound_here(&r) {
                    true => {
                        tracing::debug!(container = %container, pid, "already bound by an earlier hook");
                        Ok(r)
                    }
                    false => Err(refuse(Refusal::BoundElsewhere)),
                },
                _ => Err(refuse(Refusal::Unknown)),
            };
        };
        if !token.matches(found.claim_digest.as_deref()) {
            return Err(refuse(Refusal::WrongSecret));
        }
        if found.pid.is_some() && !bound_here(found) {
            return Err(refuse(Refusal::BoundElsewhere));
        }
        if token.holder() != container && store::read_holder(&self.dir, container)?.is_some() {
            return Err(refuse(Refusal::HoldsOther));
        }
        if !crate::state::ledger::same_set(&found.gpus, assigned) {
            return Err(crate::state::ledger::not_assigned(
                container,
                assigned,
                Some(found),
            ));
        }
        let mut record = found.clone();
        record.id = container.to_string();
        record.pid = Some(pid);
        record.start_time = start_time;
        // Write the container's record before removing the claim: a crash in between
        // leaves the GPUs held twice by one container (reaped with the claim's grace),
        // never free while it runs.
        store::write_record(&self.dir, &container.file_name(), &record)?;
        if token.holder() != container {
            store::remove_record(&self.dir, &token.holder().file_name())?;
        }
        let mut event = Event::for_record(EventKind::Bind, &record);
        if token.holder() != container {
            event = event.because(format!("claim {}", token.holder()));
        }
        self.audit_done(&event);
        self.changed();
        tracing::debug!(
            claim = %token.holder(),
            container = %container,
            pid,
            gpus = ?record.gpus,
            "bound"
        );
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::policy::testing::machine;
    use crate::state::ledger::{HolderMeta, Machine};

    fn id(s: &str) -> HolderId {
        HolderId::new(s).unwrap()
    }

    /// A ledger in a temp dir with one unbound claim under `holder`, made with `token`.
    fn claimed(holder: &str) -> (tempfile::TempDir, Ledger, ClaimToken, Vec<String>) {
        let tmp = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&crate::input::config::LedgerSettings::at(
            &tmp.path().join("state"),
        ))
        .unwrap();
        let token = ClaimToken::new(id(holder)).unwrap();
        let inv = machine(4);
        let meta = HolderMeta {
            source: "test".into(),
            claim_digest: Some(token.digest()),
            ..HolderMeta::default()
        };
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let record = ledger
            .allocate(
                &id(holder),
                &request,
                &Machine::new(&inv, PolicyName::Pack),
                meta,
            )
            .unwrap()
            .record;
        (tmp, ledger, token, record.gpus)
    }

    fn me() -> i32 {
        std::process::id() as i32
    }

    fn err_text(result: Result<Record, LedgerError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn the_shims_container_binds_its_own_claim_once_or_twice() {
        let (_t, l, token, gpus) = claimed("ctr");
        let bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        assert_eq!((bound.id.as_str(), bound.pid), ("ctr", Some(me())));
        assert!(bound.start_time.is_some());
        assert_eq!(l.bind(&id("ctr"), &token, me(), &gpus).unwrap(), bound);
        assert_eq!(l.records().unwrap(), [bound]);
    }

    #[test]
    fn a_precreate_claim_becomes_the_containers_record() {
        let (_t, l, token, gpus) = claimed("claim-0123abcd");
        let bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        assert_eq!(bound.id, "ctr");
        // A second prestart hook (hooks.d and the spec's own) binds again without harm.
        assert_eq!(l.bind(&id("ctr"), &token, me(), &gpus).unwrap(), bound);
        assert_eq!(l.records().unwrap(), [bound]);
    }

    #[test]
    fn a_thief_who_knows_only_the_holder_id_is_refused() {
        let (_t, l, token, gpus) = claimed("victim");
        let before = l.records().unwrap();
        let forged = ClaimToken::new(id("victim")).unwrap();
        let e = err_text(l.bind(&id("thief"), &forged, me(), &gpus));
        assert!(
            e.contains("container thief") && e.contains("victim") && e.contains("did not make"),
            "{e}"
        );
        assert!(!e.contains(&token.annotation()), "{e}");
        assert_eq!(l.records().unwrap(), before);
    }

    #[test]
    fn a_bound_claim_cannot_be_bound_again_by_another_process() {
        let (_t, l, token, gpus) = claimed("claim-0123abcd");
        let bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        // Even with the secret (a copied spec), the claim is gone and the container's
        // record belongs to another process.
        let e = err_text(l.bind(&id("ctr"), &token, 1, &gpus));
        assert!(e.contains("bound to another process"), "{e}");
        let e = err_text(l.bind(&id("other"), &token, me(), &gpus));
        assert!(e.contains("no such claim"), "{e}");
        assert_eq!(l.records().unwrap(), [bound]);
    }

    #[test]
    fn the_shims_record_bound_to_one_pid_refuses_another() {
        let (_t, l, token, gpus) = claimed("ctr");
        let bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        let e = err_text(l.bind(&id("ctr"), &token, 1, &gpus));
        assert!(e.contains("bound to another process"), "{e}");
        assert_eq!(l.records().unwrap(), [bound]);
    }

    #[test]
    fn gpus_other_than_the_claims_are_refused() {
        let (_t, l, token, _gpus) = claimed("ctr");
        let before = l.records().unwrap();
        let e = err_text(l.bind(&id("ctr"), &token, me(), &["GPU-test-3".into()]));
        assert!(e.contains("gpupin.assigned=GPU-test-3"), "{e}");
        assert_eq!(l.records().unwrap(), before);
    }

    #[test]
    fn a_container_holding_gpus_cannot_take_a_claim_on_top() {
        let (_t, l, token, gpus) = claimed("claim-0123abcd");
        let inv = machine(4);
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let meta = HolderMeta {
            source: "test".into(),
            pid: Some(me()),
            ..HolderMeta::default()
        };
        l.allocate(
            &id("ctr"),
            &request,
            &Machine::new(&inv, PolicyName::Pack),
            meta,
        )
        .unwrap();
        let before = l.records().unwrap();
        let e = err_text(l.bind(&id("ctr"), &token, me(), &gpus));
        assert!(e.contains("another claim"), "{e}");
        assert_eq!(l.records().unwrap(), before);
    }

    /// A record naming this very pid but another start time is a process that had the
    /// pid before: the claim is bound elsewhere, not here.
    #[test]
    fn a_record_of_an_earlier_process_with_this_pid_is_bound_elsewhere() {
        let (_t, l, token, gpus) = claimed("ctr");
        let mut bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        bound.start_time = bound.start_time.map(|s| s + 1);
        store::write_record(l.dir(), &id("ctr").file_name(), &bound).unwrap();
        let e = err_text(l.bind(&id("ctr"), &token, me(), &gpus));
        assert!(e.contains("bound to another process"), "{e}");
    }

    /// Once a claim was bound and renamed, a forged token for the same claim id opens
    /// nothing, even from the container's own process.
    #[test]
    fn a_forged_token_for_a_claim_already_bound_is_refused() {
        let (_t, l, token, gpus) = claimed("claim-0123abcd");
        let bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        let forged = ClaimToken::new(id("claim-0123abcd")).unwrap();
        let e = err_text(l.bind(&id("ctr"), &forged, me(), &gpus));
        assert!(e.contains("no such claim"), "{e}");
        assert_eq!(l.records().unwrap(), [bound]);
    }

    /// Binding reads the claim's record and the container's, nothing else: another
    /// holder's unreadable record (which stops every allocation until an operator clears
    /// it) does not stop a container whose GPUs were granted from starting with them.
    #[test]
    fn a_claim_binds_whatever_the_other_records_say() {
        let (_t, l, token, gpus) = claimed("claim-0123abcd");
        let other = l.dir().join("holders/someone-else.json");
        std::fs::write(&other, "{").unwrap();
        let bound = l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        assert_eq!((bound.id.as_str(), bound.gpus), ("ctr", gpus));
        assert!(l.dir().join("holders/ctr.json").exists());
        assert!(!l.dir().join("holders/claim-0123abcd.json").exists());
    }

    /// The audit line of a bind says which claim the container took over.
    #[test]
    fn a_bind_is_audited_with_the_claim_it_took_over() {
        let (_t, l, token, gpus) = claimed("claim-0123abcd");
        l.bind(&id("ctr"), &token, me(), &gpus).unwrap();
        let (_t2, l2, token2, gpus2) = claimed("ctr2");
        l2.bind(&id("ctr2"), &token2, me(), &gpus2).unwrap();
        let line = |l: &Ledger| {
            std::fs::read_to_string(l.dir().join("audit.log"))
                .unwrap()
                .lines()
                .find(|line| line.contains("\"event\":\"bind\""))
                .unwrap()
                .to_string()
        };
        assert!(
            line(&l).contains("\"reason\":\"claim claim-0123abcd\""),
            "{}",
            line(&l)
        );
        assert!(!line(&l2).contains("\"reason\""), "{}", line(&l2));
    }
}
