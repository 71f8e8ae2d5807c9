//! Plain data every layer above shares: who holds GPUs, and the limits on users.

pub mod holder;
pub mod limits;
