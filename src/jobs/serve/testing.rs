//! Test fixtures for the daemon's modules: its shared state without a socket, callers as
//! SO_PEERCRED gives them, and what an op's refusal says (a denial or a failure).

use super::connections::Shared;
use super::error::ServeError;
use super::peer::Peer;
use super::watch::Watcher;
use crate::input::config::{Config, ServeSettings};
use crate::model::holder::Owner;
use crate::state::ledger::Record;
use std::os::unix::process::CommandExt;
use std::sync::Arc;

/// nobody, a user every Debian system has: `users::owner_of` must find the caller.
pub(crate) const NOBODY: u32 = 65534;

/// A daemon's shared state on a ledger of 8 simulated GPUs in `dir`, without a socket.
pub(crate) fn daemon(dir: &std::path::Path, serve: ServeSettings) -> Arc<Shared> {
    let config = Config {
        serve,
        ..crate::input::config::testing::sim8_in(dir)
    };
    let watcher = Watcher::start(Arc::new(config.clone()), serve.max_watched_per_user).unwrap();
    Arc::new(Shared::new(config, watcher))
}

/// A caller as SO_PEERCRED gives it: this process, as `uid`.
pub(crate) fn caller(uid: u32) -> Peer {
    Peer {
        pid: std::process::id() as i32,
        uid,
    }
}

/// Root's hold of GPU `devices` for alice (uid 1001), until released.
pub(crate) fn alices_hold(config: &Config, id: &str, devices: &str) -> Record {
    let alice = Owner {
        uid: 1001,
        user: "alice".into(),
        groups: vec![],
    };
    crate::jobs::hold::testing::for_owner(config, id, devices, alice, None)
}

#[track_caller]
pub(crate) fn denied<T: std::fmt::Debug>(outcome: Result<T, ServeError>) -> String {
    match outcome {
        Err(e) if e.is_denial() => e.message(),
        other => panic!("not denied: {other:?}"),
    }
}

#[track_caller]
pub(crate) fn failed<T: std::fmt::Debug>(outcome: Result<T, ServeError>) -> String {
    match outcome {
        Err(e) if !e.is_denial() => e.message(),
        other => panic!("not failed: {other:?}"),
    }
}

/// The refusals audited so far (in their own log beside audit.log), as JSON.
pub(crate) fn refusals(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("audit.refusals.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A process running as nobody, for as long as the test needs it.
pub(crate) fn nobodys_process() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .uid(NOBODY)
        .gid(NOBODY)
        .spawn()
        .unwrap()
}
