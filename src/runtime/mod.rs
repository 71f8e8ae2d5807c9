//! `gpupin-runtime`: a drop-in for runc that Docker and compose can name as a runtime.
//! On `create` it edits the bundle's spec (devices, cgroup rules, env, hooks) and then
//! runs the real runtime; every other command passes through unchanged.

pub mod argv;
