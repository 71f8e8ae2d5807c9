//! Holders beyond containers: bare-metal jobs, holds, the daemon, the Kubernetes device
//! plugin; and GPUs an admin takes out of allocation (`drain`).

pub(crate) mod drain;
pub(crate) mod evict;
pub(crate) mod exec;
pub(crate) mod hold;
pub(crate) mod kube;
pub(crate) mod reset;
pub(crate) mod serve;
