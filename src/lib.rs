//! gpupin: pins NVIDIA GPUs to containers on one shared machine.
//!
//! What the library offers is the layers below: a module is `pub` where the binaries,
//! the tests or the benches name it, `pub(crate)` or private otherwise. The entry points:
//! - [`Config`], re-exported here: the configuration (`Config::discover`: flag,
//!   `$GPUPIN_CONFIG`, default).
//! - [`input::request::find`]: one [`input::request::GpuRequest`] from a container's
//!   sources (annotations, labels, env, Docker's `--gpus`, GPU nodes), each source an
//!   [`input::request::Sources`].
//! - [`model::gpu::Inventory`] ([`input::config::inventory::load`]) and
//!   [`input::config::PolicyName`] (pure policies, `policy`).
//! - [`state::ledger::Ledger`] ([`state::open_ledger`]): which holder has which GPU,
//!   under one lock.
//! - [`admission::admit::admit`]: a container's request to its GPUs, handed to the
//!   caller's `apply` as [`admission::edits::ContainerEdits`] (plain data: nodes, env, CDI
//!   edits), undone if `apply` fails.
//!
//! Data flows one way, through `admit` for every container: a request is found, the
//! inventory says which GPUs exist, the ledger allocates under its lock with a policy,
//! `ContainerEdits` describes what the container must get and one consumer gives it
//! (the spec writer before create, the injector at prestart). docs/ARCHITECTURE.md
//! draws the whole path. Nothing in this library prints or exits; the binaries do.

// What no code outside the library can name is `pub(crate)` or private, so that `pub`
// means "offered to the binaries, tests and benches": a `pub` item they cannot reach warns.
#![warn(unreachable_pub)]

// The one name outside code takes from the root (tests/docs_truth.rs); the binaries name
// the layers' modules.
pub use input::config::Config;

// The layers, bottom first: each imports only from those above it in this list
// (tests/layering.rs checks it, and that no folder has a cycle). A blank line between
// them keeps rustfmt from sorting them.

/// Building blocks: files others could replace (`safe_open`), atomic writes, one-line
/// messages, sizes, pid identity, log levels, the binaries' names.
pub mod base;

/// Plain data every layer above names: the GPU model (`gpu`, `link`, `live`), who holds
/// GPUs (`holder`), the limits on users.
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

/// What people and scripts read, as strings: `gpupin status` (one look at the machine,
/// its tables and JSON; what `gpupin serve`'s `status` op returns), `queue`, `inventory`,
/// `log`, `usage` and `pick --explain`. It reads only the layers above, never changes state.
pub mod report;

/// A container's request to what it is given: the runtime spec, GPUs it brought, the
/// driver's files, the edits and their consumers, `admit` (the pipeline).
pub mod admission;

/// The engines' ways in: the OCI hook, the runc shim, Docker's folder, which engine
/// started a container, the engines' install files.
pub mod engines;

/// Holders beyond containers: bare-metal jobs, holds, `gpupin serve`, the device plugin.
pub mod jobs;

/// `gpupin doctor`: the host's checks as data.
pub mod doctor;
