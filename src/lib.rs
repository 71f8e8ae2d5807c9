//! gpupin: pins NVIDIA GPUs to containers on one shared machine.
//!
//! Data flows one way, through `admission::admit` for every container: a request is found
//! (`input::request::find`), the inventory says which GPUs exist, the ledger allocates
//! under its lock with a policy, `admission::edits` describes what the container must get
//! and one consumer gives it (the spec writer before create, the injector at prestart).
//! docs/ARCHITECTURE.md draws the whole path. Nothing in this library prints or exits;
//! the binaries do.

// The layers, bottom first: each imports only from those above it in this list
// (tests/layering.rs checks it, and that no folder has a cycle). A blank line between
// them keeps rustfmt from sorting them.

/// Building blocks: files others could replace (`safe_open`), atomic writes, one-line
/// messages, sizes, pid identity, log levels, the binaries' names.
pub mod base;

/// Plain data every layer above names: who holds GPUs (`holder`), the limits on users.
pub mod model;

/// The machine as it is: GPUs (`inventory`), whose processes run on them, users, device
/// nodes and cgroups of a running container, a job's own cgroup, Slurm.
pub mod host;

/// Pure selection of GPUs (topology, pack, spread, least-loaded, most-free).
pub mod policy;

/// What operators and requesters say: the configuration, and requests from every source.
pub mod input;

/// What is held and what happened: the audit trail, the ledger, metrics and usage.
pub mod state;

/// A container's request to what it is given: the runtime spec, GPUs it brought, the
/// driver's files, the edits and their consumers, `admit` (the pipeline).
pub mod admission;

/// The engines' ways in: the OCI hook, the runc shim, Docker's folder, which engine
/// started a container, the engines' install files.
pub mod engines;

/// Holders beyond containers: bare-metal jobs, holds, `gpupin serve`, the device plugin.
pub mod jobs;

/// `gpupin status`: tables and JSON of the inventory, the ledger and live figures.
pub mod report;

/// `gpupin doctor`: the host's checks as data.
pub mod doctor;
