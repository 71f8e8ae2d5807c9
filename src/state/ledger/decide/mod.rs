//! What an allocation gets, decided without I/O: the machine it is decided against
//! (`machine`), what narrows it (`scope`: `within`, a group's GPUs, the limits), a
//! request to GPUs (`plan`) and to MIG instances (`mig`). Pure functions of the machine,
//! what the live records hold (`occupancy`) and the request; the ledger calls them under
//! its lock.

mod error;
mod machine;
pub(crate) mod mig;
pub(crate) mod occupancy;
pub(crate) mod plan;
pub(crate) mod scope;

pub(crate) use error::DecideError;
pub(crate) use error::{LimitReached, MigUnavailable, NotEnoughMig, NotYourHolder};
pub use machine::Machine;
pub(crate) use plan::Allocation;
pub(crate) use plan::resolve_devices;

#[cfg(test)]
mod tests;
