//! Holders beyond containers: bare-metal jobs, holds, the daemon, the Kubernetes device plugin.

pub(crate) mod evict;
pub(crate) mod exec;
pub(crate) mod hold;
pub(crate) mod kube;
pub(crate) mod serve;
