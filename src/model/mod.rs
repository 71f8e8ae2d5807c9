//! Plain data every layer above shares: the machine's GPUs and their links (`gpu`,
//! `link`), what they are doing now (`live`), who holds GPUs, the limits on users, the
//! MIG instances a GPU is cut into, the GPUs out of allocation (`fence`), gpupin's own
//! names and NVIDIA's.

pub(crate) mod fence;
pub(crate) mod gpu;
pub(crate) mod health;
pub(crate) mod holder;
pub(crate) mod limits;
pub(crate) mod link;
pub(crate) mod live;
pub(crate) mod mig;
pub(crate) mod names;
pub(crate) mod nvidia;
