use super::Confine;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("invalid confine value {value:?}: {}", Confine::EXPECTED)]
    InvalidMode { value: String },
    #[error(
        "invalid job cgroup name {name:?}: expected a holder id of letters, digits, '_', '.' and '-'"
    )]
    InvalidName { name: String },
    #[error(
        "cannot confine pid {pid} to its GPUs: neither a cgroup v1 devices hierarchy nor a cgroup2 hierarchy is mounted (see /proc/self/mountinfo); set confine = false to run unconfined"
    )]
    NoMechanism { pid: i32 },
    #[error(
        "confine = \"{mode}\" needs a {hierarchy} hierarchy mounted, and /proc/self/mountinfo shows none; expected confine = \"auto\" or false on this machine"
    )]
    Unavailable {
        mode: Confine,
        hierarchy: &'static str,
    },
    #[error(
        "pid {pid} ended before it was confined to its GPUs; expected the job waiting at its gate"
    )]
    Gone { pid: i32 },
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "pid {pid} has no {hierarchy} cgroup in /proc/{pid}/cgroup; expected one since that hierarchy is mounted"
    )]
    NoCgroup { pid: i32, hierarchy: &'static str },
    #[error(
        "{hierarchy} cgroup {cgroup} of pid {pid} is under no mount of that hierarchy in /proc/self/mountinfo"
    )]
    NotMounted {
        pid: i32,
        hierarchy: &'static str,
        cgroup: String,
    },
    #[error(
        "cgroup {path} is owned by uid {uid}, who could move the job out of its device cgroup; expected a root-owned cgroup: run gpupin from a root session or service, or through `gpupin serve`"
    )]
    Delegated { path: PathBuf, uid: u32 },
    #[error("creating cgroup {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cgroup {path} already exists with processes or cgroups in it; expected none left by an earlier job of this holder"
    )]
    InUse { path: PathBuf },
    #[error("writing {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} still lets the job open c {major}:{minor} through entry {entry:?}; expected that GPU denied"
    )]
    RuleNotTaken {
        path: PathBuf,
        entry: String,
        major: u32,
        minor: u32,
    },
    #[error("loading the BPF device program for {path}: bpf(BPF_PROG_LOAD) failed: {error}")]
    BpfLoad {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("attaching the BPF device program to {path}: bpf(BPF_PROG_ATTACH) failed: {error}")]
    BpfAttach {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("opening cgroup {path}")]
    OpenCgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("removing cgroup {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "confining jobs to their GPUs needs {cap}, which this gpupin lacks; run it as root or go through `gpupin serve`"
    )]
    MissingCap { cap: &'static str },
    #[error("reading this process's capabilities")]
    ReadCaps {
        #[source]
        source: ::caps::errors::CapsError,
    },
}
