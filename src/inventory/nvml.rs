//! NVML backend.
