//! Plain data every layer above shares: who holds GPUs, the limits on users, and the
//! MIG instances a GPU is cut into.

pub mod holder;
pub mod limits;
pub mod mig;
