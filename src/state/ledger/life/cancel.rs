//! Cancelling a queued request (`gpupin release NAME` or `gpupin evict NAME` with the
//! name `gpupin queue` shows): its owner or root removes its ticket and leaves a note
//! (`ended`) saying who; the waiter, at its next look under the lock, finds its ticket
//! gone and ends with one line naming who cancelled it.

use super::release::Releaser;
use crate::state::audit::{Event, EventKind};
use crate::state::ledger::queue::{self, QUEUE_DIR, Waiting};
use crate::state::ledger::store;
use crate::state::ledger::{Ledger, LedgerError};

impl Ledger {
    /// Cancels the queued request `given` names, taking the lock.
    pub fn cancel_waiting(&self, given: &str, by: &Releaser) -> Result<Waiting, LedgerError> {
        let _lock = store::lock(&self.dir)?;
        self.cancel_locked(given, by)
    }

    /// Cancels the queued request `given` names (its holder id, or the name `gpupin
    /// queue` shows): `by`'s own, or any for root; another's is refused naming its owner.
    /// `NoSuchHolder` when no request waits under that name. Caller holds the lock.
    pub(in crate::state::ledger) fn cancel_locked(
        &self,
        given: &str,
        by: &Releaser,
    ) -> Result<Waiting, LedgerError> {
        let tickets = queue::live_tickets(&self.dir)?;
        let Some(ticket) = tickets
            .into_iter()
            .find(|t| t.id == given || t.name.as_deref() == Some(given))
        else {
            return Err(LedgerError::NoSuchHolder {
                given: given.to_string(),
            });
        };
        if by.uid != 0 && ticket.uid != Some(by.uid) {
            return Err(LedgerError::NotYourRequest {
                name: given.to_string(),
                owner: ticket.user.clone().unwrap_or_else(|| "root".into()),
            });
        }
        self.note_ended(
            &ticket.id,
            &by.user,
            None,
            &format!("gpupin {}", by.command),
        )?;
        let path = self.dir.join(QUEUE_DIR).join(ticket.file_name());
        std::fs::remove_file(&path).map_err(|source| LedgerError::Io {
            action: "removing ticket",
            path,
            source,
        })?;
        let reason = format!(
            "gpupin {} by {}: cancelled while it waited",
            by.command, by.user
        );
        self.audit_done(&Event::new(EventKind::Release, &ticket.id).because(&reason));
        Ok(Waiting::from(ticket))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ledger::lookup::Match;
    use crate::state::ledger::queue::Ticket;
    use crate::state::ledger::tests::ledger;

    /// alice's request `train`, waiting (its waiter: this test's process).
    fn queued(l: &Ledger) -> Ticket {
        let pid = std::process::id() as i32;
        let ticket: Ticket = serde_json::from_value(serde_json::json!({
            "seq": 7, "id": "exec-99", "pid": pid,
            "start_time": crate::base::procinfo::start_time(pid),
            "uid": 1001, "user": "alice", "name": "train", "request": "count=1",
            "caller_pid": 99,
        }))
        .unwrap();
        let qdir = store::ensure_subdir(l.dir(), QUEUE_DIR).unwrap();
        store::write_atomic(
            &qdir,
            &ticket.file_name(),
            &serde_json::to_vec(&ticket).unwrap(),
        )
        .unwrap();
        ticket
    }

    /// What the waiter of `ticket` finds at its next look.
    fn cancelled(l: &Ledger, ticket: &Ticket) -> Result<(), LedgerError> {
        let path = l.dir().join(QUEUE_DIR).join(ticket.file_name());
        l.cancelled_while_waiting(&path, &ticket.id, ticket.queued_at)
    }

    fn by(uid: u32, user: &str) -> Releaser {
        Releaser {
            uid,
            user: user.into(),
            force: false,
            how: Match::Shown,
            command: "release",
        }
    }

    #[test]
    fn its_owner_or_root_cancels_a_request_and_its_waiter_is_told_who() {
        let (_t, l) = ledger();
        let ticket = queued(&l);
        assert_eq!(l.waiting().unwrap()[0].pid, Some(99));
        assert_eq!(
            l.cancel_waiting("train", &by(1002, "bob"))
                .unwrap_err()
                .to_string(),
            "train is alice's request: only alice or root may cancel it"
        );
        assert!(cancelled(&l, &ticket).is_ok(), "still waits");
        let gone = l.cancel_waiting("train", &by(1001, "alice")).unwrap();
        assert_eq!(gone.holder, "exec-99");
        assert!(l.waiting().unwrap().is_empty());
        assert_eq!(
            cancelled(&l, &ticket).unwrap_err().to_string(),
            "exec-99 was cancelled by alice (gpupin release) while it waited for GPUs"
        );
        let ticket = queued(&l);
        assert!(l.cancel_waiting("exec-99", &by(0, "root")).is_ok());
        assert!(
            cancelled(&l, &ticket)
                .unwrap_err()
                .to_string()
                .contains("by root")
        );
        assert!(matches!(
            l.cancel_waiting("exec-99", &by(0, "root")),
            Err(LedgerError::NoSuchHolder { .. })
        ));
    }
}
