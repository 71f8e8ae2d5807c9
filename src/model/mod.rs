//! Plain data every layer above shares: who holds GPUs, the limits on users, the MIG
//! instances a GPU is cut into, and NVIDIA's names.

pub mod holder;
pub mod limits;
pub mod mig;
pub mod nvidia;
