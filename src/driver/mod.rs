//! The driver side of a GPU container: what NVIDIA's stack put into a spec besides gpupin.

pub mod foreign;
