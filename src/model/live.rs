//! What a GPU is doing now, as plain data: its utilization, free memory, temperature,
//! power and the processes on it. `host/inventory` reads it (NVML, the live file, the
//! snapshot cache); policies, `gpupin status` and the idle watch read the figures.

use serde::{Deserialize, Serialize};

/// What a GPU is doing now: NVML on a real machine, the `live_file` for simulated ones.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Live {
    /// GPU utilization, percent, where the source tells: NVML answers NotSupported for a
    /// GPU in MIG mode (and NVIDIA's mock NVML for every GPU), and that GPU's memory and
    /// the other GPUs' figures still count.
    pub utilization: Option<u32>,
    /// Free memory in bytes.
    pub memory_free: u64,
    /// Degrees Celsius, where the source tells.
    pub temperature: Option<u32>,
    /// Watts drawn, where the source tells.
    pub power: Option<u32>,
    /// The processes using the GPU; `None` where the source cannot list them (an NVML
    /// too old for the query, a live file without `processes`).
    pub processes: Option<Vec<GpuProcess>>,
}

/// A process using a GPU, as NVML (or the live file) lists it: a pid of the host's pid
/// namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: i32,
    /// GPU memory it uses, in bytes, where the source tells.
    pub used_memory: Option<u64>,
}
