//! Shared building blocks: files others could replace, atomic writes, stored times, one-line messages, sizes, pids, logging, the binaries' names.

pub mod atomic;
pub mod binaries;
pub mod clock;
pub mod log;
pub mod message;
pub mod procinfo;
pub mod safe_open;
pub(crate) mod units;
