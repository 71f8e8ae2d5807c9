//! Shared building blocks: files others could replace, atomic writes, stored times, one-line messages, sizes, pids, logging, the binaries' names, programs run within a deadline.

pub(crate) mod atomic;
pub(crate) mod binaries;
pub(crate) mod clock;
pub(crate) mod command;
pub(crate) mod log;
pub(crate) mod message;
pub(crate) mod procinfo;
pub(crate) mod safe_open;
pub(crate) mod units;
