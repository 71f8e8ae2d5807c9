//! What a container asks for: OCI annotations and Docker labels (`gpupin.*`), the process
//! env (`GPUPIN_*`), Docker's own `--gpus`, found in that order by `find`. All validation
//! of user input happens here, so that nothing past this point sees a count of 0 or a
//! policy it does not know.

mod pod;

use crate::input::config::PolicyName;
use crate::model::holder::HolderId;
use crate::model::holder::WithinKey;
use crate::model::names::{annotation, env_name};
use std::collections::HashMap;
use std::time::Duration;

/// A request key. Each key's two names, the annotation (and Docker label) and the env
/// name that stands for it, are written once, in `Key::names`; everything else reads
/// them from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Count,
    Devices,
    Policy,
    Memory,
    Model,
    Share,
    Reserve,
    Wait,
    Cpus,
    Within,
    Mig,
}

impl Key {
    /// Every key, in the order messages list them.
    pub const ALL: [Key; 11] = [
        Key::Count,
        Key::Devices,
        Key::Policy,
        Key::Memory,
        Key::Model,
        Key::Share,
        Key::Reserve,
        Key::Wait,
        Key::Cpus,
        Key::Within,
        Key::Mig,
    ];

    /// The annotation name and the env name.
    const fn names(self) -> (&'static str, &'static str) {
        match self {
            Key::Count => (annotation!("count"), env_name!("COUNT")),
            Key::Devices => (annotation!("devices"), env_name!("DEVICES")),
            Key::Policy => (annotation!("policy"), env_name!("POLICY")),
            Key::Memory => (annotation!("memory"), env_name!("MEMORY")),
            Key::Model => (annotation!("model"), env_name!("MODEL")),
            Key::Share => (annotation!("share"), env_name!("SHARE")),
            Key::Reserve => (annotation!("reserve"), env_name!("RESERVE")),
            Key::Wait => (annotation!("wait"), env_name!("WAIT")),
            Key::Cpus => (annotation!("cpus"), env_name!("CPUS")),
            Key::Within => (annotation!("within"), env_name!("WITHIN")),
            Key::Mig => (annotation!("mig"), env_name!("MIG")),
        }
    }

    /// The annotation (and Docker label) name: `gpupin.count`.
    pub const fn as_str(self) -> &'static str {
        self.names().0
    }

    /// The env name: `GPUPIN_COUNT`.
    pub const fn env(self) -> &'static str {
        self.names().1
    }

    /// The option of `gpupin exec`, `pick` and `hold`: `--count`.
    pub const fn flag(self) -> &'static str {
        match self {
            Key::Count => "--count",
            Key::Devices => "--devices",
            Key::Policy => "--policy",
            Key::Memory => "--memory",
            Key::Model => "--model",
            Key::Share => "--share",
            Key::Reserve => "--reserve",
            Key::Wait => "--wait",
            Key::Cpus => "--cpus",
            Key::Within => "--within",
            Key::Mig => "--mig",
        }
    }

    /// The name as a requester from `origin` writes it, so that an error speaks their
    /// words: `--count` on the command line, `GPUPIN_COUNT` in env, else `gpupin.count`.
    pub fn name(self, origin: Origin) -> &'static str {
        match origin {
            Origin::Env => self.env(),
            Origin::Cli => self.flag(),
            _ => self.as_str(),
        }
    }

    /// The key named `name` as written from `origin`; `None` for an unknown key. The
    /// command line's pairs travel under annotation names (`gpupin serve`'s protocol),
    /// so those are taken from it too.
    pub fn parse(name: &str, origin: Origin) -> Option<Key> {
        Key::ALL
            .into_iter()
            .find(|k| k.name(origin) == name || (origin == Origin::Cli && k.as_str() == name))
    }
}

impl std::str::FromStr for Key {
    type Err = RequestError;
    /// An annotation name (`gpupin.count`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Key::parse(s, Origin::Annotations).ok_or_else(|| RequestError::UnknownKey {
            key: s.to_string(),
            origin: Origin::Annotations,
        })
    }
}

pub(crate) use crate::model::names::{ANNOTATION_PREFIX, ENV_PREFIX, USER_LABEL};
/// Annotation gpupin itself writes into an edited spec: the UUIDs it assigned.
pub(crate) const ASSIGNED_ANNOTATION: &str = annotation!("assigned");
/// Annotation of a spec edited at podman's precreate: the claim its GPUs are held under
/// until the prestart hook binds them to the container id.
pub(crate) const CLAIM_ANNOTATION: &str = annotation!("claim");
/// Annotation of a spec whose precreate failed: the reason, for gpupin's prestart hook
/// to fail with (podman does not show a precreate hook's stderr).
pub(crate) const ERROR_ANNOTATION: &str = annotation!("error");
/// Keys gpupin writes, not users: ignored when reading a request, so that a retried
/// create of an already edited spec reads the same request again.
pub(crate) const WRITTEN_BY_GPUPIN: &[&str] =
    &[ASSIGNED_ANNOTATION, CLAIM_ANNOTATION, ERROR_ANNOTATION];
/// The longest `gpupin.wait` accepted: a runtime blocked for longer is a stuck host.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
/// The longest value of any key but `gpupin.devices`: every valid one is far shorter,
/// and a value ends up in messages and audit lines.
pub(crate) const MAX_VALUE_LEN: usize = 256;
/// The most GPUs `gpupin.devices` may name (each at most 64 bytes); the ledger then
/// refuses a list longer than the machine has GPUs.
pub(crate) const MAX_DEVICES: usize = 1024;
/// How much of a refused value a message quotes.
const SHOWN_VALUE_LEN: usize = 128;

/// Which GPUs are wanted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Selection {
    Count(u32),
    /// Every GPU of the machine.
    All,
    /// Named GPUs: indices, UUIDs or PCI bus ids, as the user wrote them.
    Devices(Vec<String>),
}

/// Which MIG instances a request wants (`gpupin.mig`), `count` of them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigWant {
    /// Instances of this profile (`1g.10gb`).
    Profile(String),
    /// The smallest instances that pass the memory filter.
    Any,
}

impl std::fmt::Display for MigWant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigWant::Profile(p) => f.write_str(p),
            MigWant::Any => f.write_str("any"),
        }
    }
}

/// Whether a holder has its GPUs to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Share {
    #[default]
    Exclusive,
    /// Up to `max_shared` holders per GPU, never together with an exclusive one.
    Shared,
}

/// Where the container's CPUs should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpuBinding {
    /// The CPUs (and memory nodes) local to the assigned GPUs.
    Numa,
}

/// Where a request was read from, for records and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Origin {
    Annotations,
    /// Docker labels (config.v2.json), read by the runtime shim.
    Labels,
    /// Docker's own GPU request (`--gpus`, compose device reservations) in hostconfig.json.
    DockerGpus,
    Env,
    Cli,
    /// NVIDIA's own request found in the spec: GPU device nodes put there around gpupin
    /// (CDI, `--device`), or under `unrequested = "request"` a `cdi.k8s.io` annotation, a
    /// volume-mount request or `NVIDIA_VISIBLE_DEVICES` (`admission::foreign`).
    Nvidia,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuRequest {
    pub selection: Selection,
    /// `None`: the configured default.
    pub policy: Option<PolicyName>,
    /// Only GPUs with at least this much memory (free memory, where live figures exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Only GPUs whose name contains this, ignoring case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub share: Share,
    /// Memory a shared holder reserves on each of its GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<u64>,
    /// How long to wait for the request to become satisfiable instead of failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<CpuBinding>,
    /// The holder whose GPUs this request takes from, instead of the free pool: a
    /// container inside a Slurm job's hold, a job inside a reservation. Alone it asks for
    /// all of that holder's GPUs that no other holder inside it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
    /// The key to `within` (`gpupin.within=HOLDER:KEY`), for requests that must show one
    /// (`model::holder::WithinKey`). Never stored: records and audit lines are readable by all.
    #[serde(skip)]
    pub within_key: Option<WithinKey>,
    /// MIG instances instead of whole GPUs (`gpupin.mig`); the selection is their count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigWant>,
    pub origin: Origin,
}

impl GpuRequest {
    /// `count=2 policy=pack memory=40GiB`: the request in a few words, as `gpupin queue`
    /// and `status` show what a waiter asked for.
    pub fn summary(&self) -> String {
        let mut words = vec![match &self.selection {
            Selection::Count(n) => format!("count={n}"),
            Selection::All => "count=all".to_string(),
            Selection::Devices(list) => format!("devices={}", list.join(",")),
        }];
        if let Some(policy) = self.policy {
            words.push(format!("policy={policy}"));
        }
        if let Some(memory) = self.memory {
            words.push(format!(
                "memory={}",
                crate::base::units::format_size(memory)
            ));
        }
        if let Some(model) = &self.model {
            words.push(format!("model={model}"));
        }
        if self.share == Share::Shared {
            words.push("shared".into());
        }
        if let Some(within) = &self.within {
            words.push(format!("within={within}"));
        }
        if let Some(mig) = &self.mig {
            words.push(format!("mig={mig}"));
        }
        words.join(" ")
    }

    /// A request for `selection` with every option at its default.
    pub fn new(selection: Selection, origin: Origin) -> GpuRequest {
        GpuRequest {
            selection,
            policy: None,
            memory: None,
            model: None,
            share: Share::Exclusive,
            reserve: None,
            wait: None,
            cpus: None,
            within: None,
            within_key: None,
            mig: None,
            origin,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    #[error("invalid {key}={value:?}: {expected}")]
    Invalid {
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("unknown request key {key:?}: expected one of {}", known_keys(*.origin))]
    UnknownKey { key: String, origin: Origin },
    #[error("{count_key} and {devices_key} exclude each other: give one of them")]
    CountAndDevices {
        count_key: &'static str,
        devices_key: &'static str,
    },
    #[error("{key} was given without {count_key} or {devices_key}")]
    OptionWithoutSelection {
        key: &'static str,
        count_key: &'static str,
        devices_key: &'static str,
    },
    #[error(
        "{mig_key} asks for MIG instances, which are never shared: leave out {share_key}=shared"
    )]
    MigShared {
        mig_key: &'static str,
        share_key: &'static str,
    },
    #[error("{mig_key} takes a number of instances: give {count_key}=N (default 1), not {other}")]
    MigSelection {
        mig_key: &'static str,
        count_key: &'static str,
        other: String,
    },
    #[error("{reserve_key} needs {share_key}=shared: an exclusive holder has the whole GPU")]
    ReserveWithoutSharing {
        reserve_key: &'static str,
        share_key: &'static str,
    },
}

fn known_keys(origin: Origin) -> String {
    Key::ALL
        .iter()
        .map(|k| k.name(origin))
        .collect::<Vec<_>>()
        .join(", ")
}

const COUNT_EXPECTED: &str = "expected a positive integer or \"all\"";
const DEVICES_EXPECTED: &str = "expected a comma-separated list of GPU indices, GPU UUIDs, PCI bus ids or MIG instances (0:1 or MIG-...)";
const SIZE_EXPECTED: &str = "expected a size such as 40GiB or 512MiB (binary units)";
const MODEL_EXPECTED: &str =
    "expected part of a GPU name, such as H100 (letters, digits, space, -, _)";
const SHARE_EXPECTED: &str = "expected exclusive or shared";
const WAIT_EXPECTED: &str = "expected a duration of at most 24h, such as 90s or 5m";
const CPUS_EXPECTED: &str = "expected numa";
const MIG_EXPECTED: &str =
    "expected a MIG profile such as 1g.10gb (gpupin inventory lists them) or any";
const TOO_LONG: &str = "expected a value of at most 256 bytes";
const TOO_MANY_DEVICES: &str =
    "expected at most 1024 comma-separated GPUs (name each GPU once, no more than the machine has)";
const WITHIN_EXPECTED: &str = "expected HOLDER or HOLDER:KEY, a holder's id (1-128 letters, digits, '_', '.', '-', starting with a letter or digit) and the 32 hex digits `gpupin key HOLDER` prints";

/// Reads a request from OCI annotations. `Ok(None)`: no `gpupin.` key at all. Keys are
/// read in byte order, so that of several bad keys the same one is always reported.
pub(crate) fn from_annotations(
    annotations: &HashMap<String, String>,
) -> Result<Option<GpuRequest>, RequestError> {
    from_keys(annotations, Origin::Annotations)
}

/// Reads a request from Docker labels, which use the annotation keys.
pub(crate) fn from_labels(
    labels: &HashMap<String, String>,
) -> Result<Option<GpuRequest>, RequestError> {
    from_keys(labels, Origin::Labels)
}

fn from_keys(
    map: &HashMap<String, String>,
    origin: Origin,
) -> Result<Option<GpuRequest>, RequestError> {
    let mut pairs: Vec<(&str, &str)> = map
        .iter()
        .filter(|(k, _)| {
            k.starts_with(ANNOTATION_PREFIX)
                && !WRITTEN_BY_GPUPIN.contains(&k.as_str())
                && k.as_str() != USER_LABEL
                && k.as_str() != crate::input::request::pod::CONTAINERS_ANNOTATION
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // A HashMap's order changes from run to run: without a fixed order, a request with
    // several bad keys would be refused with a different reason each time.
    pairs.sort_unstable();
    parse(pairs.into_iter(), origin)
}

/// Reads a request from a process env (`KEY=VALUE` strings). The last occurrence of a
/// variable wins, as it does for the process itself.
pub fn from_env<S: AsRef<str>>(env: &[S]) -> Result<Option<GpuRequest>, RequestError> {
    let mut vars: Vec<(&str, &str)> = Vec::new();
    for entry in env {
        let Some((k, v)) = entry.as_ref().split_once('=') else {
            continue;
        };
        if k.starts_with(ENV_PREFIX) {
            vars.retain(|(seen, _)| *seen != k);
            vars.push((k, v));
        }
    }
    parse(vars.into_iter(), Origin::Env)
}

/// The Slurm job an env says its process runs in: the hold `slurm-N` for
/// `SLURM_JOB_ID=N` (the last occurrence wins, as for the process itself). `None` without
/// the variable, or for a value that is no job id.
pub(crate) fn slurm_job<S: AsRef<str>>(env: &[S]) -> Option<HolderId> {
    let prefix = format!("{}=", crate::host::slurm::JOB_ID_ENV);
    env.iter()
        .rev()
        .find_map(|entry| entry.as_ref().strip_prefix(&prefix))
        .and_then(crate::host::slurm::job_holder)
}

/// The Slurm rule: a request from inside Slurm job N (its env has `SLURM_JOB_ID=N`,
/// `slurm_job`) that names no holder to take from (`own`) takes from the job's hold
/// `slurm-N`, which the prolog made, when `held` says that hold exists. Without it (a node
/// whose prolog does not run gpupin, a job without GPUs) the request stays as it was. It
/// only ever narrows a request to that one holder's GPUs, and the ledger checks it as it
/// checks any `within` (who may take from whose holder included). Returns the holder the
/// request takes from, if any.
pub fn slurm_within(
    own: Option<&str>,
    job: Option<&HolderId>,
    held: impl FnOnce(&HolderId) -> bool,
) -> Option<String> {
    match (own, job) {
        (Some(own), _) => Some(own.to_string()),
        (None, Some(job)) if held(job) => Some(job.to_string()),
        _ => None,
    }
}

impl GpuRequest {
    /// `slurm_within` for this request. Returns whether it now takes from the job's hold.
    pub fn enter_slurm_job(
        &mut self,
        job: Option<&HolderId>,
        held: impl FnOnce(&HolderId) -> bool,
    ) -> bool {
        if self.within.is_some() {
            return false;
        }
        self.within = slurm_within(None, job, held);
        self.within.is_some()
    }
}

/// Builds a request from annotation-named parts given on a command line (`gpupin pick`)
/// or taken from another source (Docker's `--gpus` device ids).
pub fn from_pairs(
    pairs: &[(&str, &str)],
    origin: Origin,
) -> Result<Option<GpuRequest>, RequestError> {
    parse(pairs.iter().copied(), origin)
}

/// Where one entry point finds a container's request. `find` reads them in the one
/// order of precedence and stops at the first that asks for something, so an entry point
/// pays only for the sources it reaches (a spec parse, Docker's files).
pub trait Sources {
    type Error: From<RequestError>;
    /// OCI annotations: Docker >= 24 `--annotation`, compose `annotations:`, podman,
    /// CRI-O pod annotations, a runc bundle's own.
    fn annotations(&self) -> &HashMap<String, String>;
    /// A request from Docker labels; `None` where there is no Docker container.
    fn labels(&mut self) -> Result<Option<GpuRequest>, Self::Error> {
        Ok(None)
    }
    /// The process env (`KEY=VALUE`).
    fn env(&mut self) -> Result<Vec<String>, Self::Error>;
    /// Docker's own GPU request (`--gpus`, compose device reservations).
    fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, Self::Error> {
        Ok(None)
    }
    /// What NVIDIA's stack was asked for around gpupin (`admission::foreign::request`); only
    /// the entry points that edit the spec before create read it.
    fn foreign(&mut self) -> Result<Option<GpuRequest>, Self::Error> {
        Ok(None)
    }
}

/// A container's request: annotations, else Docker labels, else the process env, else
/// Docker's `--gpus`, else GPUs NVIDIA's stack was asked for around gpupin. `Ok(None)`:
/// it asks for nothing.
pub fn find<S: Sources>(sources: &mut S) -> Result<Option<GpuRequest>, S::Error> {
    // A pod's sandbox gets the pod's annotations too, and asks for nothing (`pod`).
    if crate::input::request::pod::is_sandbox(sources.annotations()) {
        return Ok(None);
    }
    if let Some(request) = from_annotations(sources.annotations())?
        && crate::input::request::pod::annotation_request_applies(sources.annotations())?
    {
        return Ok(Some(request));
    }
    if let Some(request) = sources.labels()? {
        return Ok(Some(request));
    }
    if let Some(request) = from_env(&sources.env()?)? {
        return Ok(Some(request));
    }
    if let Some(request) = sources.docker_gpus()? {
        return Ok(Some(request));
    }
    sources.foreign()
}

/// Every key as the user gave it, before the checks that look at several keys at once.
#[derive(Default)]
struct Parts {
    count: Option<Selection>,
    devices: Option<Selection>,
    policy: Option<PolicyName>,
    memory: Option<u64>,
    model: Option<String>,
    share: Option<Share>,
    reserve: Option<u64>,
    wait: Option<Duration>,
    cpus: Option<CpuBinding>,
    within: Option<String>,
    within_key: Option<WithinKey>,
    mig: Option<MigWant>,
}

fn parse<'a>(
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
    origin: Origin,
) -> Result<Option<GpuRequest>, RequestError> {
    let mut parts = Parts::default();
    let mut first_key: Option<Key> = None;
    for (key, value) in pairs {
        let Some(known) = Key::parse(key, origin) else {
            return Err(RequestError::UnknownKey {
                key: key.to_string(),
                origin,
            });
        };
        first_key.get_or_insert(known);
        // Errors name the key as the requester wrote it in their terms (`--count`).
        parse_one(&mut parts, known, known.name(origin), value)?;
    }
    match first_key {
        None => Ok(None),
        Some(some_key) => assemble(parts, origin, some_key).map(Some),
    }
}

fn parse_one(p: &mut Parts, known: Key, key: &str, value: &str) -> Result<(), RequestError> {
    // Bounded before anything else reads them: a value is quoted in refusals, which
    // every requester can make as often as they like.
    if known == Key::Devices {
        if value.split(',').count() > MAX_DEVICES {
            return Err(invalid(key, value, TOO_MANY_DEVICES));
        }
    } else if value.len() > MAX_VALUE_LEN {
        return Err(invalid(key, value, TOO_LONG));
    }
    let v = value.trim();
    match known {
        Key::Count => p.count = Some(parse_count(key, value)?),
        Key::Devices => p.devices = Some(parse_devices(key, value)?),
        Key::Policy => p.policy = Some(parse_policy(key, value)?),
        Key::Memory => p.memory = Some(parse_size(key, value)?),
        Key::Reserve => p.reserve = Some(parse_size(key, value)?),
        Key::Model => {
            let ok = !v.is_empty()
                && v.len() <= 64
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || " -_".contains(c));
            if !ok {
                return Err(invalid(key, value, MODEL_EXPECTED));
            }
            p.model = Some(v.to_string());
        }
        Key::Share => {
            p.share = Some(match v {
                "exclusive" => Share::Exclusive,
                "shared" => Share::Shared,
                _ => return Err(invalid(key, value, SHARE_EXPECTED)),
            })
        }
        Key::Wait => match humantime::parse_duration(v) {
            Ok(d) if d <= MAX_WAIT => p.wait = Some(d),
            _ => return Err(invalid(key, value, WAIT_EXPECTED)),
        },
        Key::Cpus => match v {
            "numa" => p.cpus = Some(CpuBinding::Numa),
            _ => return Err(invalid(key, value, CPUS_EXPECTED)),
        },
        Key::Mig => {
            p.mig = Some(match v {
                "any" => MigWant::Any,
                _ if crate::model::mig::is_profile_name(v) => MigWant::Profile(v.to_string()),
                _ => return Err(invalid(key, value, MIG_EXPECTED)),
            })
        }
        Key::Within => {
            let (name, key_text) = match v.split_once(':') {
                Some((name, key)) => (name, Some(key)),
                None => (v, None),
            };
            let key_given = key_text.map(WithinKey::parse);
            match (HolderId::new(name), key_given) {
                (Ok(id), None) => p.within = Some(id.to_string()),
                (Ok(id), Some(Some(k))) => {
                    p.within = Some(id.to_string());
                    p.within_key = Some(k);
                }
                // A value with a key is not echoed whole: messages are logged.
                (_, Some(_)) => {
                    return Err(invalid(key, &format!("{name}:(key)"), WITHIN_EXPECTED));
                }
                (Err(_), None) => return Err(invalid(key, value, WITHIN_EXPECTED)),
            }
        }
    }
    Ok(())
}

fn assemble(p: Parts, origin: Origin, some_key: Key) -> Result<GpuRequest, RequestError> {
    let count_key = Key::Count.name(origin);
    let devices_key = Key::Devices.name(origin);
    let mig_key = Key::Mig.name(origin);
    if p.mig.is_some() {
        let other = match (&p.count, &p.devices) {
            (Some(Selection::All), _) => Some(format!("{count_key}=all")),
            (_, Some(_)) => Some(devices_key.to_string()),
            _ => None,
        };
        if let Some(other) = other {
            return Err(RequestError::MigSelection {
                mig_key,
                count_key,
                other,
            });
        }
        if p.share == Some(Share::Shared) {
            return Err(RequestError::MigShared {
                mig_key,
                share_key: Key::Share.name(origin),
            });
        }
    }
    let selection = match (p.count, p.devices) {
        (Some(_), Some(_)) => {
            return Err(RequestError::CountAndDevices {
                count_key,
                devices_key,
            });
        }
        // `gpupin.mig=1g.10gb` alone: one instance.
        (None, None) if p.mig.is_some() => Selection::Count(1),
        (Some(c), None) => c,
        (None, Some(d)) => d,
        // All of the enclosing holder's GPUs (ledger::allocate narrows `All` to them).
        (None, None) if p.within.is_some() => Selection::All,
        (None, None) => {
            return Err(RequestError::OptionWithoutSelection {
                key: some_key.name(origin),
                count_key,
                devices_key,
            });
        }
    };
    let share = p.share.unwrap_or_default();
    if p.reserve.is_some() && share != Share::Shared {
        return Err(RequestError::ReserveWithoutSharing {
            reserve_key: Key::Reserve.name(origin),
            share_key: Key::Share.name(origin),
        });
    }
    Ok(GpuRequest {
        selection,
        policy: p.policy,
        memory: p.memory,
        model: p.model,
        share,
        reserve: p.reserve,
        wait: p.wait,
        cpus: p.cpus,
        within: p.within,
        within_key: p.within_key,
        mig: p.mig,
        origin,
    })
}

/// A value refused for `key`, with what was expected (for request keys read elsewhere).
pub(crate) fn invalid_value(key: &str, value: &str, expected: &'static str) -> RequestError {
    invalid(key, value, expected)
}

fn invalid(key: &str, value: &str, expected: &'static str) -> RequestError {
    RequestError::Invalid {
        key: key.to_string(),
        value: shown(value),
        expected,
    }
}

/// `value` as a message quotes it: whole when short, else its start and its length.
fn shown(value: &str) -> String {
    if value.len() <= SHOWN_VALUE_LEN {
        return value.to_string();
    }
    let mut end = SHOWN_VALUE_LEN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &value[..end], value.len())
}

fn parse_size(key: &str, value: &str) -> Result<u64, RequestError> {
    match crate::base::units::parse_size(value) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid(key, value, SIZE_EXPECTED)),
    }
}

fn parse_count(key: &str, value: &str) -> Result<Selection, RequestError> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("all") {
        return Ok(Selection::All);
    }
    // Digits only: `+2`, `2.0` and `0x2` are typos more often than intent.
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(key, value, COUNT_EXPECTED));
    }
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(Selection::Count(n)),
        _ => Err(invalid(key, value, COUNT_EXPECTED)),
    }
}

fn parse_devices(key: &str, value: &str) -> Result<Selection, RequestError> {
    let mut list: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim) {
        let well_formed = !item.is_empty()
            && item.len() <= 64
            && item
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b':' || b == b'.')
            || is_legacy_mig_uuid(item);
        if !well_formed {
            return Err(invalid(key, value, DEVICES_EXPECTED));
        }
        if !list.iter().any(|seen| seen.eq_ignore_ascii_case(item)) {
            list.push(item.to_string());
        }
    }
    Ok(Selection::Devices(list))
}

/// `MIG-GPU-<uuid>/<gi>/<ci>`, the MIG UUID of older drivers and of the procfs inventory:
/// the one form with a `/`, which must not let a path through.
fn is_legacy_mig_uuid(item: &str) -> bool {
    let mut parts = item.split('/');
    let head = parts.next().unwrap_or("");
    let numbers: Vec<&str> = parts.collect();
    head.strip_prefix("MIG-GPU-")
        .is_some_and(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        && numbers.len() == 2
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn parse_policy(key: &str, value: &str) -> Result<PolicyName, RequestError> {
    value.trim().parse().map_err(|_| RequestError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
        expected: PolicyName::EXPECTED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What was this function's doc example: a doctest cannot reach a crate-private item.
    #[test]
    fn annotations_give_a_count_and_a_bad_one_is_named_with_what_was_expected() {
        let ann = HashMap::from([("gpupin.count".to_string(), "2".to_string())]);
        assert_eq!(
            from_annotations(&ann).unwrap().unwrap().selection,
            Selection::Count(2)
        );
        assert_eq!(from_annotations(&HashMap::new()).unwrap(), None);
        let bad = HashMap::from([("gpupin.count".to_string(), "-1".to_string())]);
        let err = from_annotations(&bad).unwrap_err().to_string();
        assert_eq!(
            err,
            r#"invalid gpupin.count="-1": expected a positive integer or "all""#
        );
    }

    #[test]
    fn a_summary_names_what_was_asked_in_few_words() {
        let pairs = [
            ("gpupin.count", "2"),
            ("gpupin.policy", "pack"),
            ("gpupin.memory", "40GiB"),
            ("gpupin.model", "H100"),
        ];
        let r = from_pairs(&pairs, Origin::Annotations).unwrap().unwrap();
        assert_eq!(r.summary(), "count=2 policy=pack memory=40GiB model=H100");
        let r = from_pairs(
            &[("gpupin.devices", "0,3"), ("gpupin.share", "shared")],
            Origin::Annotations,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.summary(), "devices=0,3 shared");
        let r = from_pairs(&[("gpupin.count", "all")], Origin::Annotations)
            .unwrap()
            .unwrap();
        assert_eq!(r.summary(), "count=all");
    }

    #[test]
    fn each_key_parses_from_both_its_names_and_nothing_else() {
        for key in Key::ALL {
            assert_eq!(Key::parse(key.as_str(), Origin::Annotations), Some(key));
            assert_eq!(Key::parse(key.env(), Origin::Env), Some(key));
            assert_eq!(key.as_str().parse::<Key>().unwrap(), key);
            assert_eq!(Key::parse(key.env(), Origin::Annotations), None);
        }
        assert_eq!(Key::Within.as_str(), "gpupin.within");
        assert_eq!(Key::Within.env(), "GPUPIN_WITHIN");
        let err = "gpupin.cuont".parse::<Key>().unwrap_err().to_string();
        assert!(err.contains("\"gpupin.cuont\""), "{err}");
    }

    fn ann(pairs: &[(&str, &str)]) -> Result<Option<GpuRequest>, RequestError> {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_annotations(&map)
    }

    #[test]
    fn no_gpupin_key_is_no_request() {
        assert_eq!(ann(&[("org.opencontainers.x", "1")]).unwrap(), None);
        assert_eq!(from_env(&["PATH=/bin", "HOME=/"]).unwrap(), None);
    }

    #[test]
    fn count_from_annotation() {
        let r = ann(&[("gpupin.count", "2")]).unwrap().unwrap();
        assert_eq!(r.selection, Selection::Count(2));
        assert_eq!(r.origin, Origin::Annotations);
        assert_eq!(r.policy, None);
    }

    #[test]
    fn all_is_every_gpu() {
        assert_eq!(
            ann(&[("gpupin.count", "ALL")]).unwrap().unwrap().selection,
            Selection::All
        );
    }

    #[test]
    fn bad_counts_name_key_value_and_expectation() {
        for bad in ["0", "-1", "two", "", "2.0", "+2", "99999999999"] {
            let err = ann(&[("gpupin.count", bad)]).unwrap_err().to_string();
            assert!(err.contains("gpupin.count"), "{err}");
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains("positive integer"), "{err}");
        }
    }

    #[test]
    fn devices_list_is_parsed_and_deduplicated() {
        let r = ann(&[("gpupin.devices", "0, GPU-abc,00000000:17:00.0,0")])
            .unwrap()
            .unwrap();
        assert_eq!(
            r.selection,
            Selection::Devices(vec![
                "0".into(),
                "GPU-abc".into(),
                "00000000:17:00.0".into()
            ])
        );
    }

    #[test]
    fn legacy_mig_uuids_are_the_only_devices_with_a_slash() {
        let ok = from_pairs(&[("gpupin.devices", "MIG-GPU-5a1e-0001/1/0")], Origin::Cli)
            .unwrap()
            .unwrap();
        assert_eq!(
            ok.selection,
            Selection::Devices(vec!["MIG-GPU-5a1e-0001/1/0".into()])
        );
        for bad in ["MIG-GPU-x/../y", "MIG-GPU-x/1", "GPU-x/1/0", "MIG-GPU-/1/0"] {
            assert!(
                from_pairs(&[("gpupin.devices", bad)], Origin::Cli).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn malformed_devices_are_rejected() {
        for bad in ["", "0,,1", "../x", "0;1", "a b"] {
            let err = ann(&[("gpupin.devices", bad)]).unwrap_err().to_string();
            assert!(err.contains("gpupin.devices"), "{err}");
        }
    }

    #[test]
    fn values_are_bounded_and_quoted_short() {
        let names: Vec<String> = (0..1025).map(|i| format!("GPU-{i:060}")).collect();
        let err = ann(&[("gpupin.devices", &names.join(","))])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected at most 1024 comma-separated GPUs"),
            "{err}"
        );
        assert!(
            err.contains(&format!("({} bytes)", names.join(",").len())),
            "{err}"
        );
        assert!(err.len() < 400, "{err}");
        // 1024 is accepted here; the ledger compares it with the machine.
        let ok = ann(&[("gpupin.devices", &names[..1024].join(","))]).unwrap();
        assert!(matches!(ok.unwrap().selection, Selection::Devices(d) if d.len() == 1024));
        let long = "h".repeat(257);
        let err = ann(&[("gpupin.within", &long)]).unwrap_err().to_string();
        assert!(
            err.contains("expected a value of at most 256 bytes"),
            "{err}"
        );
        assert!(err.contains("(257 bytes)"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn count_and_devices_exclude_each_other() {
        let err = ann(&[("gpupin.count", "1"), ("gpupin.devices", "0")]).unwrap_err();
        assert!(matches!(err, RequestError::CountAndDevices { .. }));
    }

    #[test]
    fn unknown_policy_lists_known_ones() {
        let err = ann(&[("gpupin.count", "1"), ("gpupin.policy", "random")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"random\"") && err.contains("pack") && err.contains("spread"));
    }

    #[test]
    fn unknown_key_is_an_error_not_a_silent_default() {
        let err = ann(&[("gpupin.cuont", "1")]).unwrap_err().to_string();
        assert!(
            err.contains("gpupin.cuont") && err.contains("gpupin.count"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_quoted_so_it_cannot_break_the_line() {
        let err = ann(&[("gpupin.count\nfake: line", "1")])
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains(r#""gpupin.count\nfake: line""#), "{err}");
        let err = from_env(&["GPUPIN_\x1b[2JX=1"]).unwrap_err().to_string();
        assert!(!err.contains('\x1b'), "{err}");
        assert!(err.contains(r#""GPUPIN_\u{1b}[2JX""#), "{err}");
    }

    #[test]
    fn several_bad_keys_give_the_same_error_whatever_the_map_order() {
        let bad = [
            ("gpupin.share", "sometimes"),
            ("gpupin.zzz", "1"),
            ("gpupin.count", "-1"),
            ("gpupin.wait", "forever"),
            ("gpupin.aaa", "1"),
            ("gpupin.policy", "random"),
        ];
        let first = ann(&bad).unwrap_err();
        // Each HashMap gets its own random hasher: 50 maps, 50 iteration orders.
        for round in 0..50 {
            let mut pairs = bad.to_vec();
            pairs.rotate_left(round % bad.len());
            let map: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(from_annotations(&map).unwrap_err(), first);
            assert_eq!(
                from_labels(&map).unwrap_err().to_string(),
                first.to_string()
            );
        }
        // The first key in byte order is the one reported.
        assert!(first.to_string().contains("\"gpupin.aaa\""), "{first}");
    }

    #[test]
    fn gpupins_own_annotation_is_not_a_request_key() {
        let r = ann(&[("gpupin.count", "1"), (ASSIGNED_ANNOTATION, "GPU-x")])
            .unwrap()
            .unwrap();
        assert_eq!(r.selection, Selection::Count(1));
        assert_eq!(ann(&[(ASSIGNED_ANNOTATION, "GPU-x")]).unwrap(), None);
    }

    #[test]
    fn policy_alone_is_rejected() {
        assert!(matches!(
            ann(&[("gpupin.policy", "pack")]).unwrap_err(),
            RequestError::OptionWithoutSelection { .. }
        ));
    }

    #[test]
    fn filters_sharing_wait_and_cpus() {
        let r = ann(&[
            ("gpupin.count", "2"),
            ("gpupin.memory", "40GiB"),
            ("gpupin.model", "H100"),
            ("gpupin.share", "shared"),
            ("gpupin.reserve", "20GiB"),
            ("gpupin.wait", "90s"),
            ("gpupin.cpus", "numa"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(r.memory, Some(40 << 30));
        assert_eq!(r.model.as_deref(), Some("H100"));
        assert_eq!(r.share, Share::Shared);
        assert_eq!(r.reserve, Some(20 << 30));
        assert_eq!(r.wait, Some(Duration::from_secs(90)));
        assert_eq!(r.cpus, Some(CpuBinding::Numa));
    }

    #[test]
    fn bad_option_values_name_key_and_expectation() {
        for (key, value, expected) in [
            ("gpupin.memory", "40 gigs", "binary units"),
            ("gpupin.memory", "0", "binary units"),
            ("gpupin.model", "H100;rm", "part of a GPU name"),
            ("gpupin.share", "yes", "exclusive or shared"),
            ("gpupin.wait", "forever", "duration"),
            ("gpupin.wait", "2days", "at most 24h"),
            ("gpupin.cpus", "0-3", "numa"),
        ] {
            let err = ann(&[("gpupin.count", "1"), (key, value)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("{key}={value:?}")) && err.contains(expected),
                "{err}"
            );
        }
    }

    #[test]
    fn reserve_needs_sharing() {
        let err = ann(&[("gpupin.count", "1"), ("gpupin.reserve", "1GiB")]).unwrap_err();
        assert!(matches!(err, RequestError::ReserveWithoutSharing { .. }));
        let err = from_env(&["GPUPIN_COUNT=1", "GPUPIN_RESERVE=1GiB"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPUPIN_SHARE=shared"), "{err}");
    }

    #[test]
    fn options_alone_are_not_a_request() {
        let err = ann(&[("gpupin.memory", "1GiB")]).unwrap_err().to_string();
        assert!(err.starts_with("gpupin.memory was given without"), "{err}");
    }

    #[test]
    fn env_uses_env_names_and_last_occurrence_wins() {
        let r = from_env(&["GPUPIN_COUNT=1", "GPUPIN_POLICY=spread", "GPUPIN_COUNT=3"])
            .unwrap()
            .unwrap();
        assert_eq!(r.selection, Selection::Count(3));
        assert_eq!(r.policy, Some(PolicyName::Spread));
        assert_eq!(r.origin, Origin::Env);
        let err = from_env(&["GPUPIN_COUNT=-1"]).unwrap_err().to_string();
        assert!(err.contains("GPUPIN_COUNT=\"-1\""), "{err}");
    }

    #[test]
    fn slurm_job_is_the_hold_of_the_last_slurm_job_id() {
        assert_eq!(
            slurm_job(&["SLURM_JOB_ID=7", "PATH=/bin", "SLURM_JOB_ID=42"]),
            Some(HolderId::new("slurm-42").unwrap())
        );
        assert_eq!(slurm_job(&["SLURM_JOBID=42", "PATH=/bin"]), None);
        assert_eq!(slurm_job(&["SLURM_JOB_ID=../x"]), None);
        assert_eq!(slurm_job(&["SLURM_JOB_ID="]), None);
    }

    #[test]
    fn a_request_inside_a_slurm_job_takes_from_its_hold_when_the_hold_exists() {
        let job = HolderId::new("slurm-42").unwrap();
        let mut r = GpuRequest::new(Selection::Count(1), Origin::Env);
        assert!(r.enter_slurm_job(Some(&job), |h| h.as_str() == "slurm-42"));
        assert_eq!(r.within.as_deref(), Some("slurm-42"));

        // No hold (no gpupin prolog on this node): the free pool, as before.
        let mut r = GpuRequest::new(Selection::Count(1), Origin::Env);
        assert!(!r.enter_slurm_job(Some(&job), |_| false));
        assert_eq!(r.within, None);

        // Not in a job: nothing is looked up.
        let mut r = GpuRequest::new(Selection::Count(1), Origin::Env);
        assert!(!r.enter_slurm_job(None, |_| panic!("no job, no lookup")));
    }

    #[test]
    fn within_takes_a_holder_and_its_key_and_never_echoes_a_key() {
        let key = "0123456789abcdef0123456789abcdef";
        let r = from_env(&[format!("GPUPIN_WITHIN=res-7:{key}")])
            .unwrap()
            .unwrap();
        assert_eq!(r.within.as_deref(), Some("res-7"));
        assert_eq!(
            r.within_key.as_ref().map(|k| k.to_string()).as_deref(),
            Some(key)
        );
        assert_eq!(r.selection, Selection::All);
        // The key is no part of what records and audit lines keep, nor of a log line.
        let stored = serde_json::to_string(&r).unwrap();
        assert!(
            !stored.contains(key) && !format!("{r:?}").contains(key),
            "{stored}"
        );
        let plain = from_env(&["GPUPIN_WITHIN=res-7"]).unwrap().unwrap();
        assert_eq!(
            (plain.within.as_deref(), plain.within_key),
            (Some("res-7"), None)
        );
        for bad in [
            format!("res-7:{}", &key[1..]),
            format!("res-7:{}", key.to_uppercase()),
        ] {
            let err = from_env(&[format!("GPUPIN_WITHIN={bad}")])
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(
                    "invalid GPUPIN_WITHIN=\"res-7:(key)\": expected HOLDER or HOLDER:KEY"
                ),
                "{err}"
            );
        }
        let err = from_env(&["GPUPIN_WITHIN=../x"]).unwrap_err().to_string();
        assert!(err.starts_with("invalid GPUPIN_WITHIN=\"../x\""), "{err}");
    }

    #[test]
    fn an_explicit_within_wins_over_the_slurm_job() {
        let mut r = from_env(&["GPUPIN_COUNT=1", "GPUPIN_WITHIN=res-7"])
            .unwrap()
            .unwrap();
        let job = HolderId::new("slurm-42").unwrap();
        assert!(!r.enter_slurm_job(Some(&job), |_| true));
        assert_eq!(r.within.as_deref(), Some("res-7"));
    }

    /// Sources with fixed contents that count how often each later one is read.
    #[derive(Default)]
    struct Fixed {
        annotations: HashMap<String, String>,
        labels: Option<GpuRequest>,
        env: Vec<String>,
        gpus: Option<GpuRequest>,
        foreign: Option<GpuRequest>,
        reads: Vec<&'static str>,
    }

    impl Sources for Fixed {
        type Error = RequestError;
        fn annotations(&self) -> &HashMap<String, String> {
            &self.annotations
        }
        fn labels(&mut self) -> Result<Option<GpuRequest>, RequestError> {
            self.reads.push("labels");
            Ok(self.labels.clone())
        }
        fn env(&mut self) -> Result<Vec<String>, RequestError> {
            self.reads.push("env");
            Ok(self.env.clone())
        }
        fn docker_gpus(&mut self) -> Result<Option<GpuRequest>, RequestError> {
            self.reads.push("gpus");
            Ok(self.gpus.clone())
        }
        fn foreign(&mut self) -> Result<Option<GpuRequest>, RequestError> {
            self.reads.push("foreign");
            Ok(self.foreign.clone())
        }
    }

    #[test]
    fn find_takes_the_first_source_that_asks_and_reads_no_further() {
        let every = || Fixed {
            annotations: HashMap::from([("gpupin.count".into(), "1".into())]),
            labels: Some(GpuRequest::new(Selection::Count(2), Origin::Labels)),
            env: vec!["GPUPIN_COUNT=3".into()],
            gpus: Some(GpuRequest::new(Selection::Count(4), Origin::DockerGpus)),
            foreign: Some(GpuRequest::new(Selection::Count(5), Origin::Nvidia)),
            reads: Vec::new(),
        };
        let mut sources = every();
        assert_eq!(
            find(&mut sources).unwrap().unwrap().origin,
            Origin::Annotations
        );
        assert!(sources.reads.is_empty());
        let mut sources = Fixed {
            annotations: HashMap::new(),
            ..every()
        };
        assert_eq!(find(&mut sources).unwrap().unwrap().origin, Origin::Labels);
        assert_eq!(sources.reads, ["labels"]);
        let mut sources = Fixed {
            annotations: HashMap::new(),
            labels: None,
            ..every()
        };
        assert_eq!(find(&mut sources).unwrap().unwrap().origin, Origin::Env);
        let mut sources = Fixed {
            annotations: HashMap::new(),
            labels: None,
            env: vec!["PATH=/bin".into()],
            ..every()
        };
        assert_eq!(
            find(&mut sources).unwrap().unwrap().origin,
            Origin::DockerGpus
        );
        assert_eq!(sources.reads, ["labels", "env", "gpus"]);
        let mut sources = Fixed {
            annotations: HashMap::new(),
            labels: None,
            env: vec!["PATH=/bin".into()],
            gpus: None,
            ..every()
        };
        assert_eq!(find(&mut sources).unwrap().unwrap().origin, Origin::Nvidia);
        assert_eq!(sources.reads, ["labels", "env", "gpus", "foreign"]);
        let mut nothing = Fixed::default();
        assert_eq!(find(&mut nothing).unwrap(), None);
    }

    #[test]
    fn a_bad_annotation_is_reported_before_any_other_source_is_read() {
        let mut sources = Fixed {
            annotations: HashMap::from([("gpupin.count".into(), "0".into())]),
            env: vec!["GPUPIN_COUNT=1".into()],
            ..Fixed::default()
        };
        assert!(matches!(
            find(&mut sources),
            Err(RequestError::Invalid { .. })
        ));
        assert!(sources.reads.is_empty());
    }
}
