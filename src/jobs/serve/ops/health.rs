//! `pause_health` and `resume_health`: `gpupin reset`'s hold on the health watch (the
//! driver resets no GPU that NVML's clients have open), for root only: anyone else
//! could keep every GPU's failures from being seen.

use super::super::connections::Shared;
use super::super::error::ServeError;
use super::super::peer::Peer;
use super::super::protocol::Reply;
use std::time::Duration;

/// How long a pause waits for the watch to let go of NVML: it looks every half second.
const PATIENCE: Duration = Duration::from_secs(10);

/// The reply to a pause for `secs`, once the watch holds no NVML.
pub(in crate::jobs::serve) fn pause(
    shared: &Shared,
    peer: Peer,
    secs: u64,
) -> Result<Reply, ServeError> {
    only_root(peer, "pause")?;
    match shared
        .health_pause
        .pause(Duration::from_secs(secs), PATIENCE)
    {
        true => Ok(Reply::default()),
        false => {
            shared.health_pause.resume();
            Err(ServeError::HealthWatchHeld {
                secs: PATIENCE.as_secs(),
            })
        }
    }
}

/// The reply to a resume: the watch takes NVML again.
pub(in crate::jobs::serve) fn resume(shared: &Shared, peer: Peer) -> Result<Reply, ServeError> {
    only_root(peer, "resume")?;
    shared.health_pause.resume();
    Ok(Reply::default())
}

fn only_root(peer: Peer, what: &str) -> Result<(), ServeError> {
    match peer.uid {
        0 => Ok(()),
        uid => Err(ServeError::Denied(format!(
            "only root may {what} the GPU health watch (uid {uid} asked)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::{caller, daemon, denied};

    #[test]
    fn only_root_pauses_and_resumes_the_health_watch() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        assert_eq!(
            denied(pause(&shared, caller(1001), 60)),
            "only root may pause the GPU health watch (uid 1001 asked)"
        );
        assert!(!shared.health_pause.paused());
        pause(&shared, caller(0), 60).unwrap();
        assert!(shared.health_pause.paused());
        assert_eq!(
            denied(resume(&shared, caller(1001))),
            "only root may resume the GPU health watch (uid 1001 asked)"
        );
        assert!(shared.health_pause.paused());
        resume(&shared, caller(0)).unwrap();
        assert!(!shared.health_pause.paused());
    }
}
