//! `gpupin serve`: a small root daemon on a Unix socket through which local users who are
//! not root run jobs on GPUs (`gpupin exec`), hold and release them. It allocates in the
//! same ledger as every container, confines each job to its GPUs, and releases them the
//! moment the job's process ends (pidfd).

mod authorize;
pub mod client;
mod idle;
pub mod listen;
pub mod peer;
pub mod protocol;
pub mod server;
mod signals;
mod watch;

pub use client::{Client, ClientError};
pub use protocol::{Reply, Request};
