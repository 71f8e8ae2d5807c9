//! The machine as it is: GPUs, processes and users, device nodes and cgroups, Slurm.

pub mod confine;
pub(crate) mod container_devices;
pub mod inventory;
pub(crate) mod node_acl;
pub mod slurm;
pub mod users;
pub(crate) mod whose;
