//! gpupin's configuration: `--config FILE`, else `$GPUPIN_CONFIG`, else
//! /etc/gpupin/config.toml; a missing default file means defaults.

mod audit_log;
mod driver;
mod effective;
mod fields;
mod health;
pub(crate) mod inventory;
mod ledger;
mod leftovers;
mod located;
mod policy;
mod serve;

pub use effective::effective_toml;

pub(crate) use audit_log::{
    AuditFailure, AuditLog, DEFAULT_AUDIT_LOG, DEFAULT_KEEP, DEFAULT_MAX_BYTES,
};
pub use driver::Driver;
pub(crate) use driver::{DEFAULT_CDI_SPEC_DIRS, Unrequested};
pub(crate) use health::HealthSettings;
pub(crate) use inventory::InventorySettings;
pub use inventory::InventorySource;
pub(crate) use ledger::LedgerSettings;
pub(crate) use leftovers::Leftovers;
pub(crate) use serve::ServeSettings;

use crate::base::log::Level;
use crate::base::safe_open::{self, Links};
use crate::host::confine::Confine;
use crate::host::inventory::NvmlAccess;
use crate::model::limits::Limits;
pub use policy::PolicyName;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpupin/config.toml";
pub(crate) const DEFAULT_STATE_DIR: &str = "/run/gpupin";
pub const CONFIG_ENV: &str = "GPUPIN_CONFIG";
/// The socket a client of `gpupin serve` talks to, when set: it wins over the config's.
pub(crate) const SOCKET_ENV: &str = "GPUPIN_SOCKET";
/// How long GPUs assigned before create stay held without a container process.
pub(crate) const DEFAULT_CLAIM_GRACE: Duration = Duration::from_secs(120);

/// The configuration: one field per key of the file (`path` and `nvml` aside, which the
/// binary sets), each with its default and, where a value needs more than its type says,
/// the reader in `fields` that names a bad value in one line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The lock directory holding the ledger and the inventory cache.
    #[serde(default = "fields::state_dir")]
    pub state_dir: PathBuf,
    #[serde(
        default = "fields::inventory",
        deserialize_with = "fields::inventory_source"
    )]
    pub inventory: InventorySource,
    /// Policy for requests that name none.
    #[serde(default, deserialize_with = "fields::policy")]
    pub policy: PolicyName,
    /// The OCI runtime gpupin-runtime hands over to: a path, or a name found on PATH.
    #[serde(default = "fields::runtime")]
    pub runtime: PathBuf,
    /// How long GPUs assigned before create (shim, precreate) stay held while the
    /// container has not reached its prestart hook.
    #[serde(
        default = "fields::claim_grace",
        deserialize_with = "fields::claim_grace_duration"
    )]
    pub claim_grace: Duration,
    /// Live figures for simulated and file inventories (NVML supplies them otherwise).
    #[serde(default)]
    pub live_file: Option<PathBuf>,
    /// How many shared holders one GPU takes at most.
    #[serde(
        default = "fields::max_shared",
        deserialize_with = "fields::max_shared_count"
    )]
    pub max_shared: u32,
    /// How much to log to stderr when `GPUPIN_LOG` is unset: the way to turn logging
    /// on for hooks, which get whatever environment the runtime gives them.
    #[serde(default, deserialize_with = "fields::log_level")]
    pub log: Option<Level>,
    /// What a container that asks gpupin for nothing keeps of what it asked NVIDIA's
    /// stack for (`NVIDIA_VISIBLE_DEVICES`, `cdi.k8s.io` annotations); `Unrequested`
    /// says why the default strips it.
    #[serde(default, deserialize_with = "fields::unrequested")]
    pub unrequested: Unrequested,
    /// Where this configuration was read from; `None` for built-in defaults.
    #[serde(skip)]
    pub path: Option<PathBuf>,
    /// Where NVML runs: not a key of the file, but the binary's to say (the statically
    /// linked ones ask the `gpupin` beside them).
    #[serde(skip)]
    pub nvml: NvmlAccess,
    /// How a container gets the driver's libraries (`Driver`).
    #[serde(default, deserialize_with = "fields::driver")]
    pub driver: Driver,
    /// Where CDI specs are read from; a later dir wins for the same device name.
    #[serde(default = "fields::cdi_spec_dirs")]
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// The audit trail (`audit()` puts these four together).
    #[serde(default = "fields::audit_log")]
    pub audit_log: PathBuf,
    /// The size past which the audit log is rotated, in bytes.
    #[serde(
        default = "fields::audit_max_size",
        deserialize_with = "fields::audit_size"
    )]
    pub audit_max_size: u64,
    /// Rotated audit files kept; 0 truncates the log instead.
    #[serde(default = "fields::audit_keep")]
    pub audit_keep: u32,
    /// What an allocation does when its audit line cannot be written.
    #[serde(default, deserialize_with = "fields::audit_failure")]
    pub audit_failure: AuditFailure,
    /// How many GPUs people may hold, and which (`limits`).
    #[serde(default, deserialize_with = "fields::limits")]
    pub limits: Limits,
    /// `gpupin serve`'s socket; `None`: `<state_dir>/gpupin.sock`.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// The group whose members may use the socket; `None`: every local user.
    #[serde(default)]
    pub socket_group: Option<String>,
    /// How `gpupin exec` names GPUs in CUDA_VISIBLE_DEVICES.
    #[serde(default, deserialize_with = "fields::cuda_ids")]
    pub cuda_visible_devices: CudaIds,
    /// How an exec'd job is kept to its GPUs (`confine`).
    #[serde(
        default = "fields::confine",
        deserialize_with = "fields::confine_value"
    )]
    pub confine: Confine,
    /// What happens to the processes a confined job leaves in its cgroup when its main
    /// process ends (`leftovers`).
    #[serde(default, deserialize_with = "fields::leftovers")]
    pub leftovers: Leftovers,
    /// A Prometheus text file rewritten on every ledger change (node_exporter's textfile
    /// collector); `None`: none.
    #[serde(default)]
    pub metrics_file: Option<PathBuf>,
    /// Whether a container whose env says `SLURM_JOB_ID=N` takes its GPUs from Slurm job
    /// N's hold (`request::GpuRequest::enter_slurm_job`). Off by default: an engine does
    /// not say who started a container, so its env could name any job; `gpupin exec`
    /// always follows the rule, since the daemon knows who asks.
    #[serde(default)]
    pub slurm_containers: bool,
    /// The label or annotation whose value names the user a container is for, set by a
    /// spawner or platform the admin trusts (`admission::trusted_user`); `None`:
    /// containers belong to no user and `[limits]` do not apply to them.
    #[serde(default, deserialize_with = "fields::trusted_user_label")]
    pub trusted_user_label: Option<String>,
    /// Whether an exclusive request may get a GPU that runs a process no holder owns.
    #[serde(default, deserialize_with = "fields::foreign")]
    pub foreign: Foreign,
    /// How long an NVML snapshot of the live figures serves further allocations.
    #[serde(
        default = "fields::live_cache",
        deserialize_with = "fields::live_cache_age"
    )]
    pub live_cache: Duration,
    /// `gpupin serve`'s bounds (`[serve]`).
    #[serde(default, deserialize_with = "fields::serve")]
    pub serve: ServeSettings,
    /// `gpupin serve`'s watch of the GPUs' health (`[health]`).
    #[serde(default, deserialize_with = "fields::health")]
    pub health: HealthSettings,
    /// In which order waiting requests are served (`QueueOrder`).
    #[serde(default, deserialize_with = "fields::queue_order")]
    pub queue: QueueOrder,
    /// A holder whose GPUs all stay under this utilization, in percent, for `idle_after`
    /// is idle (`state::ledger::idle`).
    #[serde(
        default = "fields::idle_utilization",
        deserialize_with = "fields::idle_percent"
    )]
    pub idle_utilization: u32,
    /// How long a holder's GPUs stay under `idle_utilization` before it is idle.
    #[serde(
        default = "fields::idle_after",
        deserialize_with = "fields::idle_after_duration"
    )]
    pub idle_after: Duration,
    /// What happens to a holder found idle (`IdleAction`).
    #[serde(default, deserialize_with = "fields::idle_action")]
    pub idle_action: IdleAction,
    /// Whether a plain count may take MIG instances (`MigUnits`).
    #[serde(default, deserialize_with = "fields::mig")]
    pub mig: MigUnits,
    /// Who may open GPU nodes besides what their mode says (`NodeAccess`).
    #[serde(default, deserialize_with = "fields::node_access")]
    pub node_access: NodeAccess,
    /// Where the host's `/dev/nvidia*` nodes are, for `node_access`: `/dev`, unless the
    /// nodes gpupin manages live elsewhere (a test's fake nodes).
    #[serde(
        default = "fields::node_dir",
        deserialize_with = "fields::node_dir_path"
    )]
    pub node_dir: PathBuf,
}

/// Who may open the GPU nodes (`/dev/nvidia<minor>`, MIG capability nodes) besides what
/// their mode says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NodeAccess {
    /// gpupin leaves the nodes' permissions alone: with the driver's default mode 0666
    /// every local user opens every GPU that no device cgroup keeps them from. The
    /// default, since "acl" only helps once the nodes are root-only, which is the
    /// driver's setting (NVreg_DeviceFileMode), and earlier versions wrote no ACLs.
    #[default]
    Open,
    /// The named-user entries of each GPU node's POSIX ACL are exactly the owners of
    /// the live holders whose processes run on the host (jobs, holds for a process),
    /// rewritten after every change of the ledger: with root-only nodes, a user opens the
    /// GPUs they hold and no others.
    Acl,
}

impl NodeAccess {
    pub const EXPECTED: &str = "expected \"open\" (the nodes' modes decide) or \"acl\" (each holder's user gets an ACL entry on exactly its GPUs' nodes)";

    pub fn as_str(self) -> &'static str {
        match self {
            NodeAccess::Open => "open",
            NodeAccess::Acl => "acl",
        }
    }
}

impl std::str::FromStr for NodeAccess {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "open" => Ok(NodeAccess::Open),
            "acl" => Ok(NodeAccess::Acl),
            _ => Err(()),
        }
    }
}

/// In which order the requests waiting for GPUs (`gpupin.wait`, `exec --wait`) are
/// served. Either way a request that does not wait never overtakes them, and a waiter
/// held back only by its own user's limit is in no one's way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueOrder {
    /// Arrival order.
    Fifo,
    /// Round-robin by user: a user's second waiting request goes behind every other
    /// user's first, then by arrival. The default: with one user (or only containers)
    /// waiting it is arrival order, and with several, one user's batch of requests no
    /// longer keeps everyone else waiting until all of it is served.
    #[default]
    Fair,
}

impl QueueOrder {
    pub const EXPECTED: &str =
        "expected \"fair\" (round-robin by user) or \"fifo\" (arrival order)";

    pub fn as_str(self) -> &'static str {
        match self {
            QueueOrder::Fifo => "fifo",
            QueueOrder::Fair => "fair",
        }
    }
}

impl std::str::FromStr for QueueOrder {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "fifo" => Ok(QueueOrder::Fifo),
            "fair" => Ok(QueueOrder::Fair),
            _ => Err(()),
        }
    }
}

/// Utilization under which a GPU counts as doing nothing, by default, in percent.
pub(crate) const DEFAULT_IDLE_UTILIZATION: u32 = 5;
/// How long a holder's GPUs do nothing before it is idle, by default: long enough that
/// a job loading data or between epochs is not called idle, short enough that a
/// forgotten notebook is found the same morning.
pub(crate) const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(3600);

/// What happens to a holder found idle. Never more than releasing a hold: a container or
/// a job that runs is not stopped for it (`gpupin evict` is for that).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdleAction {
    /// Shown in status and metrics and audited once; nothing else.
    #[default]
    Report,
    /// As `Report`, and an idle hold (`gpupin hold`, kind hold) is released.
    ReleaseHolds,
}

impl IdleAction {
    pub const EXPECTED: &str = "expected \"report\" or \"release-holds\" (idle holds are released; containers and jobs never are)";

    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Report => "report",
            IdleAction::ReleaseHolds => "release-holds",
        }
    }
}

impl std::str::FromStr for IdleAction {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "report" => Ok(IdleAction::Report),
            "release-holds" => Ok(IdleAction::ReleaseHolds),
            _ => Err(()),
        }
    }
}

/// What a plain `gpupin.count=N` may get where GPUs are cut into MIG instances. Whole
/// GPUs only, by default: a job that asks for a GPU and gets a `1g.10gb` slice (a
/// seventh of the compute, a tenth of the memory) fails late or runs slowly, with
/// nothing telling it why; instances are asked for by name (`gpupin.mig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MigUnits {
    #[default]
    WholeOnly,
    /// A count whole GPUs cannot meet takes MIG instances, the largest first: for
    /// machines whose GPUs are all cut, where every job fits in an instance.
    InstancesToo,
}

impl MigUnits {
    pub const EXPECTED: &str = "expected \"whole-only\" or \"instances-too\"";
}

impl std::str::FromStr for MigUnits {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "whole-only" => Ok(MigUnits::WholeOnly),
            "instances-too" => Ok(MigUnits::InstancesToo),
            _ => Err(()),
        }
    }
}

/// What allocation makes of a process on a GPU that no holder owns (one started
/// without gpupin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Foreign {
    /// An exclusive request never gets such a GPU; the refusal names the process.
    #[default]
    Avoid,
    /// Processes are not looked at: only the ledger says which GPUs are free.
    Ignore,
}

impl Foreign {
    pub const EXPECTED: &str = "expected \"avoid\" or \"ignore\"";
}

impl std::str::FromStr for Foreign {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "avoid" => Ok(Foreign::Avoid),
            "ignore" => Ok(Foreign::Ignore),
            _ => Err(()),
        }
    }
}

/// How long a live snapshot serves, by default: a burst of starts pays once, and a
/// process started since is missed for no longer than this.
pub(crate) const DEFAULT_LIVE_CACHE: Duration = Duration::from_secs(2);

/// How `gpupin exec` writes CUDA_VISIBLE_DEVICES.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CudaIds {
    /// Indices in PCI bus order, with CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's numbers).
    #[default]
    Index,
    /// `GPU-<uuid>`: the same on every machine and every boot.
    Uuid,
}

impl CudaIds {
    pub const EXPECTED: &str = "expected \"index\" or \"uuid\"";
}

impl std::str::FromStr for CudaIds {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "index" => Ok(CudaIds::Index),
            "uuid" => Ok(CudaIds::Uuid),
            _ => Err(()),
        }
    }
}

impl Config {
    /// Where `gpupin serve` listens and `gpupin exec` finds it.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.state_dir.join("gpupin.sock"))
    }

    /// The socket a client of `gpupin serve` talks to: `$GPUPIN_SOCKET`, else
    /// `socket_path`. The Python client finds it the same way (docs/python.md).
    pub fn client_socket(&self) -> PathBuf {
        match std::env::var_os(SOCKET_ENV) {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => self.socket_path(),
        }
    }

    /// The audit trail these settings describe.
    pub fn audit(&self) -> AuditLog {
        AuditLog {
            path: self.audit_log.clone(),
            max_bytes: self.audit_max_size,
            keep: self.audit_keep,
            on_failure: self.audit_failure,
        }
    }

    /// What the ledger this configuration names is opened with (`Ledger::open`).
    pub fn ledger_settings(&self) -> LedgerSettings {
        LedgerSettings {
            dir: self.state_dir.clone(),
            claim_grace: self.claim_grace,
            audit: self.audit(),
            queue: self.queue,
        }
    }
}

impl Default for Config {
    /// Every key at its default: the file with no keys.
    fn default() -> Self {
        toml::Table::new()
            .try_into()
            .expect("every key of the config has a default")
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("reading config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl Config {
    /// Resolves which file to read (flag, env, default) and reads it.
    pub fn discover(flag: Option<&Path>) -> Result<Config, ConfigError> {
        if let Some(path) = flag {
            return Config::load(path);
        }
        if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty()) {
            return Config::load(Path::new(&path));
        }
        match Config::load(Path::new(DEFAULT_CONFIG_PATH)) {
            Err(ConfigError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(Config::default())
            }
            other => other,
        }
    }

    /// Reads one config file; a file named explicitly must exist.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        // Admins link configs into managed trees, so a link is followed; a FIFO or device
        // is refused rather than read (a FIFO would block every hook on the host).
        let text =
            safe_open::read_to_string(path, Links::Follow).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        Config::parse(&text, path)
    }

    /// Parses config text; `path` names the file in errors and anchors relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            reason: located::explain(text, &e),
        })?;
        config.path = Some(path.to_path_buf());
        // Relative paths are relative to the config file, not to the cwd of whichever
        // runtime happens to call the hook (the bundle, under runc and dockerd). The
        // defaults are absolute, so anchoring leaves them as they are.
        let beside = |p: &mut PathBuf| {
            if let Some(dir) = path.parent() {
                *p = dir.join(&*p);
            }
        };
        beside(&mut config.state_dir);
        if let InventorySource::File(p) = &mut config.inventory {
            beside(p);
        }
        config.live_file.as_mut().map(beside);
        // A bare name is looked up on PATH; only a path is anchored.
        if config.runtime.components().count() > 1 {
            beside(&mut config.runtime);
        }
        config.cdi_spec_dirs.iter_mut().for_each(beside);
        beside(&mut config.audit_log);
        config.socket.as_mut().map(beside);
        config.metrics_file.as_mut().map(beside);
        Ok(config)
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// For tests of the layers above: a config of 8 simulated GPUs whose ledger and audit log
/// live in `dir` (`dir/state`, `dir/audit.log`).
#[cfg(test)]
pub(crate) mod testing {
    use super::Config;

    pub(crate) fn sim8_in(dir: &std::path::Path) -> Config {
        Config {
            state_dir: dir.join("state"),
            inventory: "sim:nvswitch8".parse().unwrap(),
            audit_log: dir.join("audit.log"),
            ..Config::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commented config the package ships as /etc/gpupin/config.toml.
    const SHIPPED: &str = include_str!("../../../packaging/config.toml");

    /// The shipped file behaves as no file; with every key uncommented it still parses,
    /// and the values it shows as defaults are the defaults.
    #[test]
    fn the_shipped_config_is_the_defaults_and_says_them_truly() {
        let path = Path::new("/etc/gpupin/config.toml");
        let shipped = Config::parse(SHIPPED, path).unwrap();
        let defaults = Config {
            path: Some(path.to_path_buf()),
            ..Config::default()
        };
        assert_eq!(shipped, defaults);
        let uncommented: String = SHIPPED
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if rest.starts_with('[') || rest.contains(" = ") => rest,
                _ => line,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        let all = Config::parse(&uncommented, path).unwrap();
        // The examples (socket_group, metrics_file, trusted_user_label, [limits]) aside,
        // each shown value is the default; `log = "off"` is what no log key means.
        let expected = Config {
            socket_group: all.socket_group.clone(),
            trusted_user_label: all.trusted_user_label.clone(),
            metrics_file: all.metrics_file.clone(),
            limits: all.limits.clone(),
            log: Some(Level::Off),
            ..defaults.clone()
        };
        let shown = Config {
            socket: None,
            ..all.clone()
        };
        assert_eq!(shown, expected);
        assert_eq!(all.socket_path(), defaults.socket_path());
        assert_eq!(all.limits.max_waiting(), defaults.limits.max_waiting());
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/gpupin/config.toml"))
    }

    #[test]
    fn empty_file_means_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/run/gpupin"));
        assert_eq!(c.inventory, InventorySource::Auto);
    }

    #[test]
    fn reads_every_key() {
        let c = parse("state_dir = \"/tmp/x\"\ninventory = \"sim:pcie8\"\npolicy = \"spread\"\nruntime = \"/usr/sbin/runc\"\n")
            .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.inventory, InventorySource::Sim("pcie8".into()));
        assert_eq!(c.policy, PolicyName::Spread);
        assert_eq!(c.runtime, PathBuf::from("/usr/sbin/runc"));
    }

    #[test]
    fn slurm_containers_is_off_unless_turned_on() {
        assert!(!parse("").unwrap().slurm_containers);
        assert!(parse("slurm_containers = true").unwrap().slurm_containers);
        let err = parse("slurm_containers = \"yes\"").unwrap_err().to_string();
        assert!(
            err.contains("slurm_containers") || err.contains("boolean"),
            "{err}"
        );
    }

    #[test]
    fn claim_grace_is_a_duration() {
        assert_eq!(
            parse("claim_grace = \"2m\"").unwrap().claim_grace,
            Duration::from_secs(120)
        );
        let err = parse("claim_grace = \"soon\"").unwrap_err().to_string();
        assert!(
            err.contains("\"soon\"") && err.contains("duration"),
            "{err}"
        );
    }

    #[test]
    fn queue_and_idle_keys_have_defaults_and_name_a_bad_value() {
        let c = parse("").unwrap();
        assert_eq!(c.queue, QueueOrder::Fair);
        assert_eq!(c.idle_utilization, 5);
        assert_eq!(c.idle_after, Duration::from_secs(3600));
        assert_eq!(c.idle_action, IdleAction::Report);
        let c = parse("queue = \"fifo\"\nidle_utilization = 10\nidle_after = \"30m\"\nidle_action = \"release-holds\"").unwrap();
        assert_eq!(c.queue, QueueOrder::Fifo);
        assert_eq!(c.idle_utilization, 10);
        assert_eq!(c.idle_after, Duration::from_secs(1800));
        assert_eq!(c.idle_action, IdleAction::ReleaseHolds);
        for (text, said) in [
            ("queue = \"lifo\"", "queue \"lifo\": expected \"fair\""),
            (
                "idle_utilization = 0",
                "idle_utilization 0: expected a percentage from 1 to 100",
            ),
            (
                "idle_utilization = 101",
                "idle_utilization 101: expected a percentage",
            ),
            (
                "idle_after = \"0s\"",
                "idle_after \"0s\": expected a duration of at least 1s",
            ),
            (
                "idle_after = \"soon\"",
                "idle_after \"soon\": expected a duration",
            ),
            (
                "idle_action = \"kill\"",
                "idle_action \"kill\": expected \"report\" or \"release-holds\"",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(said), "{text}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn live_file_and_max_shared() {
        let c = parse("live_file = \"live.json\"\nmax_shared = 2").unwrap();
        assert_eq!(c.live_file, Some(PathBuf::from("/etc/gpupin/live.json")));
        assert_eq!(c.max_shared, 2);
        assert!(
            parse("max_shared = 0")
                .unwrap_err()
                .to_string()
                .contains("max_shared 0")
        );
        assert!(parse("max_shared = -1").is_err());
    }

    #[test]
    fn foreign_defaults_to_avoid_and_live_cache_to_two_seconds() {
        let c = parse("").unwrap();
        assert_eq!(
            (c.foreign, c.live_cache),
            (Foreign::Avoid, Duration::from_secs(2))
        );
        let c = parse("foreign = \"ignore\"\nlive_cache = \"0s\"").unwrap();
        assert_eq!((c.foreign, c.live_cache), (Foreign::Ignore, Duration::ZERO));
        assert_eq!(
            parse("foreign = \"avoid\"").unwrap().foreign,
            Foreign::Avoid
        );
        let err = parse("foreign = \"kill\"").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config /etc/gpupin/config.toml: line 1: foreign \"kill\": expected \"avoid\" or \"ignore\""
        );
        let err = parse("live_cache = \"soon\"").unwrap_err().to_string();
        assert!(
            err.contains("live_cache \"soon\": expected a duration"),
            "{err}"
        );
    }

    #[test]
    fn log_is_a_level() {
        assert_eq!(parse("").unwrap().log, None);
        assert_eq!(parse("log = \"debug\"").unwrap().log, Some(Level::Debug));
        let err = parse("log = \"loud\"").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config /etc/gpupin/config.toml: line 1: log \"loud\": expected one of error, warn, info, debug, trace, off"
        );
        let err = parse("log = \"de\\nbug\"").unwrap_err().to_string();
        assert!(
            err.contains(r#"log "de\nbug""#) && !err.contains('\n'),
            "{err}"
        );
        assert!(parse("log = 3").is_err());
    }

    #[test]
    fn driver_and_cdi_spec_dirs() {
        let c = parse("").unwrap();
        assert_eq!(c.driver, Driver::Auto);
        assert_eq!(
            c.cdi_spec_dirs,
            [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
        let c = parse("driver = \"cdi\"\ncdi_spec_dirs = [\"cdi\", \"/run/cdi\"]").unwrap();
        assert_eq!(c.driver, Driver::Cdi);
        assert_eq!(
            c.cdi_spec_dirs,
            [PathBuf::from("/etc/gpupin/cdi"), PathBuf::from("/run/cdi")]
        );
        assert_eq!(parse("driver = \"none\"").unwrap().driver, Driver::None);
        let err = parse("driver = \"nvidia\"").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config /etc/gpupin/config.toml: line 1: driver \"nvidia\": expected one of auto, cdi, none"
        );
    }

    #[test]
    fn unrequested_defaults_to_strip_and_names_a_bad_value() {
        assert_eq!(parse("").unwrap().unrequested, Unrequested::Strip);
        assert_eq!(
            parse("unrequested = \"request\"").unwrap().unrequested,
            Unrequested::Request
        );
        assert_eq!(
            parse("unrequested = \"pass\"").unwrap().unrequested,
            Unrequested::Pass
        );
        let err = parse("unrequested = \"keep\"").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config /etc/gpupin/config.toml: line 1: unrequested \"keep\": expected request, strip or pass"
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("stat_dir = \"/tmp\"").unwrap_err().to_string();
        assert!(err.contains("stat_dir"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let err = parse("inventory = \"gpu\"").unwrap_err().to_string();
        assert!(err.contains("\"gpu\""), "{err}");
        let err = parse("policy = \"random\"").unwrap_err().to_string();
        assert!(err.contains("random") && err.contains("pack"), "{err}");
        let err = parse("inventory = \"sim:nope\"").unwrap_err().to_string();
        assert!(
            err.contains("sim:nope") && err.contains("sim:nvswitch8"),
            "{err}"
        );
    }

    #[test]
    fn relative_state_dir_and_runtime_path_are_beside_the_config() {
        // Hooks and the shim run in a container's bundle: resolved against their cwd,
        // a relative state_dir would give every bundle a ledger of its own.
        let c = parse("state_dir = \"state\"\nruntime = \"bin/runc\"").unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/etc/gpupin/state"));
        assert_eq!(c.runtime, PathBuf::from("/etc/gpupin/bin/runc"));
        // A bare name is looked up on PATH, not beside the config.
        assert_eq!(
            parse("runtime = \"crun\"").unwrap().runtime,
            PathBuf::from("crun")
        );
    }

    #[test]
    fn relative_inventory_file_is_beside_the_config() {
        let c = parse("inventory = \"machines/box.json\"").unwrap();
        assert_eq!(
            c.inventory,
            InventorySource::File(PathBuf::from("/etc/gpupin/machines/box.json"))
        );
    }

    #[test]
    fn a_fifo_as_config_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let fifo = path.clone();
        // Opening a FIFO for reading blocks until a writer comes, which may be never.
        std::thread::spawn(move || {
            let _ = tx.send(Config::load(&fifo).map(|_| ()));
        });
        let result = rx.recv_timeout(Duration::from_secs(5));
        let err = result.expect("still blocked after 5 s").unwrap_err();
        let line = crate::base::message::one_line(&err);
        assert!(line.contains(&path.display().to_string()), "{line}");
        assert!(line.contains("FIFO"), "{line}");
    }

    #[test]
    fn a_symlinked_config_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.toml");
        std::fs::write(&target, "max_shared = 3").unwrap();
        let link = dir.path().join("config.toml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(Config::load(&link).unwrap().max_shared, 3);
    }

    #[test]
    fn missing_explicit_file_is_an_error() {
        let err = Config::load(Path::new("/nonexistent/gpupin.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/gpupin.toml"));
    }

    #[test]
    fn an_explicit_file_is_the_one_read_and_a_missing_one_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("gpupin.toml");
        std::fs::write(&file, "state_dir = \"state\"\nmax_shared = 2\n").unwrap();
        let c = Config::discover(Some(&file)).unwrap();
        assert_eq!(c.path.as_deref(), Some(file.as_path()));
        assert_eq!((c.state_dir, c.max_shared), (tmp.path().join("state"), 2));
        let err = Config::discover(Some(&tmp.path().join("none.toml"))).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }

    #[test]
    fn cuda_visible_devices_reads_both_ways_and_defaults_to_index() {
        assert_eq!(parse("").unwrap().cuda_visible_devices, CudaIds::Index);
        for (text, ids) in [("index", CudaIds::Index), ("uuid", CudaIds::Uuid)] {
            let c = parse(&format!("cuda_visible_devices = \"{text}\"\n")).unwrap();
            assert_eq!(c.cuda_visible_devices, ids, "{text}");
        }
    }

    #[test]
    fn reads_the_keys_of_jobs_users_and_the_audit_trail() {
        let c = parse(
            "audit_log = \"audit/audit.log\"\naudit_max_size = \"1MiB\"\naudit_keep = 2\n\
             confine = \"v2\"\nsocket_group = \"gpu\"\ncuda_visible_devices = \"uuid\"\n\
             [limits]\nmax_gpus_per_user = 2\n[limits.groups.vision]\ngpus = [0, 1]\n",
        )
        .unwrap();
        assert_eq!(c.audit_log, PathBuf::from("/etc/gpupin/audit/audit.log"));
        assert_eq!((c.audit_max_size, c.audit_keep), (1 << 20, 2));
        assert_eq!(c.audit_failure, audit_log::AuditFailure::Warn);
        let refuse = parse("audit_failure = \"refuse\"\n").unwrap();
        assert_eq!(refuse.audit_failure, audit_log::AuditFailure::Refuse);
        assert_eq!(c.confine, Confine::V2);
        assert_eq!(c.socket_group.as_deref(), Some("gpu"));
        assert_eq!(c.socket_path(), PathBuf::from("/run/gpupin/gpupin.sock"));
        assert_eq!(c.cuda_visible_devices, CudaIds::Uuid);
        assert_eq!(c.limits.max_gpus_per_user, Some(2));
        assert_eq!(parse("confine = false").unwrap().confine, Confine::Off);
        assert_eq!(Config::default().confine, Confine::Auto);
        assert_eq!(Config::default().leftovers, Leftovers::Wait);
        assert_eq!(
            parse("leftovers = \"kill\"").unwrap().leftovers,
            Leftovers::Kill
        );
        assert_eq!(
            parse("leftovers = \"wait\"").unwrap().leftovers,
            Leftovers::Wait
        );
        assert_eq!(
            Config::default().audit_log,
            PathBuf::from("/var/log/gpupin/audit.log")
        );
    }

    #[test]
    fn bad_values_of_the_new_keys_are_one_line_each() {
        for (text, wanted) in [
            (
                "confine = \"maybe\"",
                "confine \"maybe\": expected true, false",
            ),
            ("confine = 3", "confine 3: expected true"),
            (
                "audit_failure = \"ignore\"",
                "audit_failure \"ignore\": expected \"refuse\"",
            ),
            (
                "leftovers = \"ignore\"",
                "leftovers \"ignore\": expected \"wait\" or \"kill\"",
            ),
            (
                "audit_max_size = \"1\"",
                "audit_max_size \"1\": expected a size",
            ),
            (
                "cuda_visible_devices = \"bus\"",
                "cuda_visible_devices \"bus\": expected",
            ),
            (
                "[limits]\nmax_gpus = 1",
                "line 2 in [limits]: unknown key \"max_gpus\" in [limits], whose keys are",
            ),
            (
                "[limits]\nmax_waiting_per_user = 0",
                "limits.max_waiting_per_user 0: expected at least 1",
            ),
            (
                "[serve]\nmax_connections_per_user = 0",
                "serve.max_connections_per_user 0: expected at least 1",
            ),
            (
                "[serve]\nrequest_timeout = \"soon\"",
                "serve.request_timeout \"soon\": expected a duration",
            ),
            (
                "[serve]\nmax_threads = 1",
                "line 2 in [serve]: unknown key \"max_threads\"",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(wanted), "{text}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
