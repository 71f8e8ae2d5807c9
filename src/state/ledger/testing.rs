//! Test fixtures of the ledger's types, for the crate's unit tests.

use super::{Mode, Record};
use crate::input::request::{GpuRequest, Origin, Selection};

/// A container's record holding `gpus`, bound to this test process (so it counts as
/// running), made after this boot.
pub(crate) fn record(id: &str, gpus: &[&str]) -> Record {
    Record {
        id: id.into(),
        gpus: gpus.iter().map(|s| s.to_string()).collect(),
        mode: Mode::Exclusive,
        request: GpuRequest::new(Selection::Count(gpus.len() as u32), Origin::Annotations),
        source: "hook".into(),
        pid: Some(std::process::id() as i32),
        start_time: crate::base::procinfo::start_time(std::process::id() as i32),
        bundle: None,
        claim_digest: None,
        indices: Vec::new(),
        kind: Default::default(),
        owner: None,
        container: None,
        until_release: false,
        salt: String::new(),
        cgroups: Vec::new(),
        expires_at: None,
        reason: None,
        memory_limit: None,
        // After this boot (2100-01-01), so that the holder counts as running.
        created_at: 4_102_444_800,
    }
}
