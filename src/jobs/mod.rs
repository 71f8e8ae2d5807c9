//! Holders beyond containers: bare-metal jobs, holds, the daemon, the Kubernetes device plugin.

pub mod evict;
pub mod exec;
pub mod hold;
pub mod kube;
pub mod serve;
