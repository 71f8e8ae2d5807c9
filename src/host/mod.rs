//! The machine as it is: GPUs, processes and users, device nodes and cgroups, Slurm.

pub(crate) mod confine;
pub(crate) mod container_devices;
pub(crate) mod inventory;
pub(crate) mod node_acl;
pub(crate) mod slurm;
pub(crate) mod users;
pub(crate) mod whose;
