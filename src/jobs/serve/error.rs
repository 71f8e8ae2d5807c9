//! Why the daemon said no, as one type: the caller may not do this (a denial: who may do
//! what, decided by `authorize`, the ledger or `jobs::evict`), or it could not be done (a
//! bad value, a refused allocation, which `grant::allocate` audits itself). `reply` makes
//! either the reply's `error`, and writes a denial's audit line, in this one place.

use super::authorize;
use super::peer::Peer;
use super::protocol::Reply;
use super::watch::WatchError;
use crate::base::message::one_line;
use crate::host::users::{self, UserError};
use crate::input::config::Config;
use crate::jobs::evict::EvictError;
use crate::jobs::exec::{JobError, JobRequestError};
use crate::jobs::hold::HoldError;
use crate::model::holder::BadHolderId;
use crate::state::ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub(super) enum ServeError {
    /// `authorize`'s answer: the caller may not do this.
    #[error("{0}")]
    Denied(String),
    /// The request line is none this daemon reads (`protocol::receive_request`'s line).
    #[error("{0}")]
    Unreadable(String),
    #[error("bind without an exec first")]
    BindFirst,
    /// The caller's uid, or the user a hold names, is no user of this host.
    #[error(transparent)]
    User(#[from] UserError),
    #[error(transparent)]
    Holder(#[from] BadHolderId),
    /// The process a hold or job names could not be pinned (gone, or not ours to see).
    #[error("pid {pid}")]
    Pin {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    /// A second handle on a pinned process's pidfd.
    #[error(transparent)]
    Pidfd(std::io::Error),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Hold(#[from] HoldError),
    #[error(
        "pid {pid} ended before its hold was recorded: nothing is held (hold again with a running process)"
    )]
    EndedBeforeRecorded { pid: i32 },
    #[error(transparent)]
    JobRequest(#[from] JobRequestError),
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("pid {pid} is not a process the caller (pid {caller}) started as uid {uid}")]
    NotStartedByCaller { pid: i32, caller: i32, uid: u32 },
    /// A job that could not take its GPUs, whatever the cause: a refusal the audit log
    /// keeps, as it always was.
    #[error(transparent)]
    NotBound(Box<ServeError>),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("no running holder {id} (see gpupin status)")]
    NoRunningHolder { id: String },
    #[error("{id} holds nothing")]
    HoldsNothing { id: String },
    #[error(transparent)]
    Evict(#[from] EvictError),
    /// Why the status could not be read (`report::status::served`), on one line.
    #[error("{0}")]
    Status(String),
    #[error(
        "the GPU health watch did not let go of NVML within {secs}s; nothing was paused: try again, or stop gpupin serve for the reset"
    )]
    HealthWatchHeld { secs: u64 },
}

impl ServeError {
    /// Whether the caller asked for what is not theirs (audited here), rather than for
    /// what could not be done.
    pub(super) fn is_denial(&self) -> bool {
        match self {
            ServeError::Denied(_) | ServeError::NotBound(_) => true,
            ServeError::Ledger(e) => authorize::is_denial(e),
            ServeError::Evict(e) => matches!(
                e,
                EvictError::NotYours { .. }
                    | EvictError::Ledger(LedgerError::NotYourRequest { .. })
            ),
            _ => false,
        }
    }

    /// The reply's `error`: an error with causes on one line (`one_line`); the text the
    /// daemon was handed whole (`authorize`'s answers, the status reader's and the
    /// protocol's lines) and a name as the caller sent it, as they are.
    pub(super) fn message(&self) -> String {
        match self {
            ServeError::Denied(why) | ServeError::Unreadable(why) | ServeError::Status(why) => {
                why.clone()
            }
            ServeError::HoldsNothing { .. } => self.to_string(),
            ServeError::NotBound(inner) => inner.message(),
            other => one_line(other),
        }
    }

    /// The reply that says why; a denial is audited first, as `peer`'s refused request
    /// for `holder`.
    pub(super) fn reply(&self, config: &Config, peer: Peer, holder: &str) -> Reply {
        let why = self.message();
        if self.is_denial() {
            audit_refusal(config, peer, holder, &why);
        }
        Reply::refused(why)
    }
}

/// An audit line for a request the daemon itself refused (who may do what); refusals of
/// the allocation are written by `grant::allocate`.
fn audit_refusal(config: &Config, peer: Peer, holder: &str, reason: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::{caller, daemon, refusals};

    /// The reply says a denial as `authorize` wrote it and audits it under the holder the
    /// request named; a failure is said with its causes on one line and audited nowhere
    /// here; a job that could not be bound is a denial whatever kept it.
    #[test]
    fn a_denial_is_audited_where_it_is_said_and_a_failure_only_said() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        let alice = caller(1001);
        let why = "only root may hold GPUs for another user (a\nb)";
        let reply = ServeError::Denied(why.into()).reply(&config, alice, "h1");
        assert_eq!(reply.error.as_deref(), Some(why));
        let failed = ServeError::Pin {
            pid: 7,
            source: std::io::Error::other("gone\nnow"),
        };
        assert!(!failed.is_denial());
        let reply = failed.reply(&config, alice, "h2");
        assert_eq!(reply.error.as_deref(), Some(r"pid 7: gone\nnow"));
        let not_bound = ServeError::NotBound(Box::new(ServeError::NotStartedByCaller {
            pid: 9,
            caller: 8,
            uid: 1001,
        }));
        let reply = not_bound.reply(&config, alice, "exec-8");
        assert_eq!(
            reply.error.as_deref(),
            Some("pid 9 is not a process the caller (pid 8) started as uid 1001")
        );
        let audited: Vec<String> = refusals(tmp.path())
            .iter()
            .map(|line| line["holder"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(audited, ["h1", "exec-8"]);
    }
}
