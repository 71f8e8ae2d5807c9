//! A holder's life in the ledger, after its allocation: a claim and its binding to a
//! process (`claim`, `bind`), a record moving to its job (`job`), which holder a name
//! means (`lookup`), a holder's entry given back (`remove`), a release by that name
//! (`release`) or a queued request's cancel (`cancel`), the note an eviction or a
//! cancel leaves (`ended`), idle holders (`idle`), a holder's key for nested
//! requests (`within`), and GPUs taken out of allocation and put back (`fence`).

mod bind;
mod cancel;
mod claim;
mod ended;
mod fence;
mod idle;
mod job;
pub(crate) mod lookup;
mod release;
mod remove;
pub(in crate::state::ledger) mod within;

pub(crate) use claim::{ClaimError, ClaimToken};
pub(crate) use fence::ResetEnd;
pub(crate) use fence::{HEALTH_BY, RESETTING};
pub(crate) use idle::{Idle, IdleRule};
pub use release::Releaser;
pub use remove::Released;
pub(crate) use within::SECRET_FILE as WITHIN_SECRET_FILE;
