//! `gpupin serve`: a small root daemon on a Unix socket through which local users who are
//! not root run jobs on GPUs (`gpupin exec`), hold and release them. It allocates in the
//! same ledger as every container, confines each job to its GPUs, and releases them the
//! moment the job's process ends (pidfd).
//!
//! What a caller may do is decided by who the kernel says it is (SO_PEERCRED), never by
//! what it sends: a job is bound only to a child of the caller that runs as the caller's
//! uid; a hold names only a process of the caller's; only root holds until release or for
//! someone else; a user releases only their own holders (`Ledger::release_for`).
//!
//! The daemon, bottom up: `connections` (what every connection shares, its slot, its
//! deadline), `error` (why the daemon said no, and the reply and audit line that say
//! it), `ops` (one file per operation), `dispatch` (a request to its op and its answer
//! to the reply), `accept` (the loop that admits connections, `run`).

mod accept;
mod authorize;
mod client;
mod connections;
mod dispatch;
mod error;
mod health;
mod health_pause;
mod idle;
pub(crate) mod listen;
mod ops;
mod peer;
mod protocol;
mod signals;
#[cfg(test)]
mod testing;
mod watch;

pub use accept::run;
pub use client::Client;
pub(crate) use client::ClientError;
pub use connections::Reloaded;
pub use protocol::{Reply, Request};
