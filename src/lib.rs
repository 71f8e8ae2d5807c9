//! gpupin: pins NVIDIA GPUs to containers on one shared machine.
//!
//! The library is eleven layers (crate-private) and a front page (public): one module
//! per binary that lists what that binary takes from the layers, and one for the
//! integration tests and benches. Nothing else is reachable from outside, so the
//! front page is the whole contract between the library and its binaries.
//! - [`command`]: the `gpupin` command (src/bin/gpupin).
//! - [`hook`]: the OCI hook `gpupin-hook`, one stage as `gpupin hook` runs it.
//! - [`shim`]: Docker's runtime `gpupin-runtime`.
//! - [`parts`]: what tests/ and benches/ drive directly (policies, inventories, `admit`).
//!
//! Data flows one way, through `admission::admit::admit` for every container: a request
//! is found (`input::request::find`, from annotations, labels, env, Docker's `--gpus`,
//! GPU nodes), the inventory says which GPUs exist, the ledger
//! (`state::ledger::Ledger`) allocates under its lock with a policy,
//! `admission::edits::ContainerEdits` describes what the container must get and one
//! consumer gives it (the spec writer before create, the injector at prestart).
//! docs/ARCHITECTURE.md draws the whole path. Nothing in this library prints or exits;
//! the binaries do.

// A `pub` item no front page module reaches warns: what only the library uses is
// `pub(crate)` or private, so that `pub` inside a layer means "the front page offers it".
#![warn(unreachable_pub)]

// The layers, bottom first: each imports only from those above it in this list
// (tests/layering.rs checks it, and that no folder has a cycle). A blank line between
// them keeps rustfmt from sorting them.

/// Building blocks: files others could replace (`safe_open`), atomic writes, one-line
/// messages, sizes, pid identity, log levels, the binaries' names.
pub(crate) mod base;

/// Plain data every layer above names: the GPU model (`gpu`, `link`, `live`), who holds
/// GPUs (`holder`), the limits on users.
pub(crate) mod model;

/// The machine as it is: GPUs (`inventory`), whose processes run on them, users, device
/// nodes and cgroups of a running container, a job's own cgroup, Slurm.
pub(crate) mod host;

/// Pure selection of GPUs (topology, pack, spread, least-loaded, most-free).
pub(crate) mod policy;

/// What operators and requesters say: the configuration, and requests from every source.
pub(crate) mod input;

/// What is held and what happened: the audit trail, the ledger, metrics and usage.
pub(crate) mod state;

/// What people and scripts read, as strings: `gpupin status` (one look at the machine,
/// its tables and JSON; what `gpupin serve`'s `status` op returns), `queue`, `inventory`,
/// `log`, `usage` and `pick --explain`. It reads only the layers above, never changes state.
pub(crate) mod report;

/// A container's request to what it is given: the runtime spec, GPUs it brought, the
/// driver's files, the edits and their consumers, `admit` (the pipeline).
pub(crate) mod admission;

/// The engines' ways in: the OCI hook, the runc shim, Docker's folder, which engine
/// started a container, the engines' install files.
pub(crate) mod engines;

/// Holders beyond containers: bare-metal jobs, holds, `gpupin serve`, the device plugin.
pub(crate) mod jobs;

/// `gpupin doctor`: the host's checks as data.
pub(crate) mod doctor;

// The front page: what each binary, and the integration tests and benches, take from
// the library, and nothing else. An item is offered by being named here; a module of
// the library that a binary calls by its name (`exec::start`) is a module here too,
// listing only what is called through it.

/// What the `gpupin` command (src/bin/gpupin) uses, by layer, bottom first.
pub mod command {
    pub use crate::base::atomic::Durability;
    pub use crate::base::log::{init_from_config, init_from_env};
    pub use crate::base::message::{escape_controls, one_line};
    pub use crate::base::safe_open::Links;

    pub use crate::model::gpu::Inventory;
    pub use crate::model::holder::{EXEC_PREFIX, HolderId};

    pub use crate::host::confine::{Confine, JobCgroup, drop_job_caps, require_caps};
    pub use crate::host::inventory::{NvmlAccess, read_live};
    pub use crate::host::slurm::{JOB_ID_ENV, job_holder};
    pub use crate::host::users::{owner_named, owner_of};

    pub use crate::input::config::{CONFIG_ENV, Config, DEFAULT_CONFIG_PATH};
    pub use crate::input::request::{Key, MAX_WAIT, Origin};

    pub use crate::state::audit::{Entry, EventKind, Filter, GpuSelector, When};
    pub use crate::state::ledger::lookup::Match;
    pub use crate::state::ledger::{
        HolderMeta, Ledger, LedgerError, Machine, Record, Released, Releaser, WaitReason, Waiting,
    };
    pub use crate::state::metrics::{cursor_of, snapshot_text};
    pub use crate::state::open_ledger;
    pub use crate::state::usage::By;

    pub use crate::report::status::{GpuFilter, Snapshot};
    pub use crate::report::{
        Status, inventory_json, inventory_table, log_row, log_table, queue_json, queue_table,
        status_table, usage_json, usage_table,
    };

    pub use crate::admission::admit::Admission;
    pub use crate::admission::edits::{ApplyError, HookCommand};

    pub use crate::engines::hook::stage::StageArgs;
    pub use crate::engines::hook::{Outcome, Stage};
    pub use crate::engines::install::containers_conf::ContainersConf;
    pub use crate::engines::install::docker::{NvidiaRuntime, RuntimeEntry};
    pub use crate::engines::install::podman::{Change, Step, Trigger};
    pub use crate::engines::install::reload::Reload;

    pub use crate::jobs::drain::{DrainError, Drained, Undrained};
    pub use crate::jobs::evict::{EvictError, Evictor};
    pub use crate::jobs::exec::{Gated, pass_gate, unblock_all_signals};
    pub use crate::jobs::hold::{HoldOwner, HoldRequest, LONGEST_DAYS, check_for};
    pub use crate::jobs::kube::allocate::Granted;
    pub use crate::jobs::kube::devices::{DeviceState, MigStrategy, Unit};
    pub use crate::jobs::kube::{DEFAULT_RESOURCE, KubeError};
    pub use crate::jobs::reset::{Outcome as ResetOutcome, ResetError};
    pub use crate::jobs::serve::{Client, Reloaded, Reply, Request};

    pub use crate::doctor::smi::Comparison;
    pub use crate::doctor::{DEFAULT_DAEMON_JSON, Finding, HooksSource, Report, Setup, examine};

    pub mod atomic {
        pub use crate::base::atomic::write;
    }
    pub mod safe_open {
        pub use crate::base::safe_open::{read, read_to_string};
    }
    pub mod binaries {
        pub use crate::base::binaries::{HOOK, beside};
    }
    pub mod clock {
        pub use crate::base::clock::unix;
    }
    pub mod inventory {
        pub use crate::host::inventory::{
            InventoryError, import, nvml_live_here, nvml_probe_here, to_json,
        };
    }
    pub mod slurm {
        pub use crate::host::slurm::{SlurmUnit, gres_conf_path, short_hostname, units};
    }
    pub mod config {
        pub use crate::input::config::effective_toml;
    }
    pub mod request {
        pub use crate::input::request::{Sources, find, from_pairs, slurm_within};
    }
    pub mod audit {
        pub use crate::state::audit::parse_user;
    }
    pub mod usage {
        pub use crate::state::usage::{
            Ended, Rows, TrailUsage, Usage, UsageRow, could_end_in, counts, usage, usage_of_trail,
        };
    }
    pub mod admit {
        pub use crate::admission::admit::admit;
    }
    pub mod edits {
        pub use crate::admission::edits::refuse_reserved;
    }
    pub mod grant {
        pub use crate::admission::grant::{load_machine, machine};
    }
    pub mod spec {
        pub use crate::admission::spec::{parse, process_env};
    }
    pub mod stage {
        pub use crate::engines::hook::stage::run;
    }
    pub mod hook {
        pub use crate::engines::hook::run;
    }
    pub mod docker {
        pub use crate::engines::install::docker::{
            RUNTIME_NAME, default_runtime, nvidia_runtime, parse, render, with_gpupin,
            without_gpupin,
        };
    }
    pub mod file {
        pub use crate::engines::install::file::{read, replace_with_backup};
    }
    pub mod podman {
        pub use crate::engines::install::podman::{
            HOOKS_DIR, hook_files, install, nvidia_hooks_before_gpupin, uninstall,
        };
    }
    pub mod reload {
        pub use crate::engines::install::reload::{DEFAULT_PIDFILE, reload_dockerd};
    }
    pub mod drain {
        pub use crate::jobs::drain::{drain, holders, undrain};
    }
    pub mod reset {
        pub use crate::jobs::reset::reset;
    }
    pub mod evict {
        pub use crate::jobs::evict::{cancel_queued, check_reason, evict};
    }
    pub mod exec {
        pub use crate::jobs::exec::{
            Finished, LEFTOVERS_POLL, abandon, block_signals, exit_code, finish,
            forward_signals_and_wait, grant, job_request, next_signal, spawn_gated, start,
        };
    }
    pub mod hold {
        pub use crate::jobs::hold::hold;
    }
    pub mod devices {
        pub use crate::jobs::kube::devices::{resources, states_of};
    }
    pub mod kube {
        pub use crate::jobs::kube::{allocate, live_records};
    }
    pub mod nri {
        pub use crate::engines::nri::{
            Adjustment, Created, Outcome, create, reconcile, release, serves,
        };
    }
    pub mod serve {
        pub use crate::jobs::serve::run;
    }
    pub mod nvml_helper {
        pub use crate::host::inventory::nvml_helper::{
            INVENTORY, LIVE, MEMORY_LIMIT, MIG_UNREADABLE_STATUS, live_json, memory_limit_here,
        };
    }
    pub mod explain {
        pub use crate::report::explain::{json, table, why};
    }
    pub mod prefer {
        pub use crate::jobs::kube::prefer::{Ask, preferred};
    }
    pub mod reconcile {
        pub use crate::jobs::kube::reconcile::{Unlisted, release_unassigned};
    }
    pub mod listen {
        pub use crate::jobs::serve::listen::{bind, from_systemd};
    }
    pub mod create {
        pub use crate::engines::runtime::create::prepare;
    }
}

/// What the OCI hook `gpupin-hook` uses: one hook stage (`stage::run`), as `gpupin hook`
/// runs it.
pub mod hook {
    pub use crate::base::log::init_from_env;
    pub use crate::base::message::one_line;
    pub use crate::host::inventory::NvmlAccess;

    pub mod binaries {
        pub use crate::base::binaries::{CLI, beside};
    }
    pub mod stage {
        pub use crate::engines::hook::stage::{StageArgs, run};
    }
}

/// What Docker's runtime shim `gpupin-runtime` uses: its arguments (`argv`) and the
/// work around `create` (`runtime::run`).
pub mod shim {
    pub use crate::admission::entry::EntryError;
    pub use crate::base::log::{init_from_config, init_from_env};
    pub use crate::base::message::one_line;
    pub use crate::engines::runtime::Handover;
    pub use crate::engines::runtime::argv::Invocation;
    pub use crate::host::inventory::NvmlAccess;
    pub use crate::input::config::CONFIG_ENV;

    pub mod binaries {
        pub use crate::base::binaries::{CLI, beside};
    }
    pub mod argv {
        pub use crate::engines::runtime::argv::{config_path, parse, runtime_override};
    }
    pub mod runtime {
        pub use crate::engines::runtime::{ShimError, load_config, run, run_without_config};
    }
}

/// What the integration tests (tests/) and the benches (benches/) drive directly, beside
/// the binaries: the policies on an inventory, the ledger, `admit`.
pub mod parts {
    pub use crate::base::procinfo::start_time;

    pub use crate::model::gpu::{Gpu, Inventory};
    pub use crate::model::holder::{ContainerInfo, HolderId, HolderKind};
    pub use crate::model::link::Link;
    pub use crate::model::live::Live;

    pub use crate::host::inventory::{NvmlAccess, from_json, to_json};
    pub use crate::host::slurm::short_hostname;

    pub use crate::policy::PolicyInput;
    pub use crate::policy::topology::Terms;

    pub use crate::input::config::inventory::load as load_inventory;
    pub use crate::input::config::{Config, Driver, InventorySource, PolicyName};
    pub use crate::input::request::{GpuRequest, Origin, Selection, Share};

    pub use crate::state::audit::REFUSALS_PER_MINUTE;
    pub use crate::state::ledger::HolderMeta;

    pub use crate::admission::admit::Admission;
    pub use crate::admission::edits::{ApplyError, ContainerEdits};

    pub mod inventory {
        pub use crate::host::inventory::{from_json, to_json};
    }
    pub mod topology {
        pub use crate::policy::topology::{search, terms};
    }
    pub mod reference {
        pub use crate::policy::reference::best;
    }
    pub mod request {
        pub use crate::input::request::from_env;
    }
    /// The audit log's lines as gpupin writes them (benches/audit_year generates a year).
    pub mod audit {
        pub use crate::state::audit::{Event, EventKind, GpuRef};
    }
    pub mod admit {
        pub use crate::admission::admit::admit;
    }
    pub mod driver {
        pub use crate::admission::driver::add_for_spec;
    }
}
