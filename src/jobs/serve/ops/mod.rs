//! The daemon's operations, one file each: what it does for the caller (`peer`, as the
//! kernel says it is) and the reply it sends. `dispatch` hands each request to its op.
//! Each answers with its reply or a `ServeError`, which `dispatch` makes the reply; the
//! replies of a grant and a cancel, which several ops send, are here.

pub(super) mod evict;
pub(super) mod exec;
pub(super) mod health;
pub(super) mod hello;
pub(super) mod hold;
pub(super) mod key;
pub(super) mod release;
pub(super) mod status;

use super::protocol::Reply;
use crate::state::audit::GpuRef;
use crate::state::ledger::Record;

/// The reply to a release or evict that cancelled a queued request.
pub(super) fn cancelled(waiting: &crate::state::ledger::Waiting) -> Reply {
    Reply {
        holder: Some(waiting.holder.clone()),
        cancelled: true,
        ..Reply::default()
    }
}

pub(super) fn granted(record: &Record) -> Reply {
    Reply {
        holder: Some(record.id.clone()),
        gpus: GpuRef::of_record(record),
        ..Reply::default()
    }
}
