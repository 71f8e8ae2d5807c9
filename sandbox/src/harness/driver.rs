//! The fake NVIDIA driver root (`crate::driver`) with its hand-written spec and stand-in
//! hook: `gpupin demo`'s, which cannot depend on the Go peers. The end-to-end suites use
//! NVIDIA's own nvidia-ctk and nvidia-cdi-hook instead (`harness::toolkit`).

pub use crate::driver::*;
