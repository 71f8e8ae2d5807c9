//! Holds: GPUs set aside with no container, for a Slurm prolog (the job's GPUs, released
//! by the epilog) or an administrator ("GPU 7 is in maintenance"). A hold lasts as long
//! as a process (`pid`), or until `gpupin release` (`until_release`).
//!
//! One type says what is asked (`HoldRequest`): `gpupin hold` makes it from its
//! arguments, sends it to `gpupin serve` as the `hold` request (its fields are the
//! wire's), and root's CLI and the daemon hand it to `hold` with whose hold it is.

use crate::admission::grant::{self, GrantError};
use crate::input::config::Config;
use crate::input::request::{self, GpuRequest, Key, Origin, Selection};
use crate::model::gpu::Inventory;
use crate::model::holder::{BadHolderId, HolderId, HolderKind, Owner};
use crate::state::ledger::{HolderMeta, Record, StillWanted};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HoldError {
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error("invalid --devices {value:?}: {expected}")]
    BadDevices {
        value: String,
        expected: &'static str,
    },
    #[error(
        "no GPU has device minor {minor} ({node}): this machine's minors are {known}",
        node = crate::model::nvidia::gpu_node(*minor)
    )]
    UnknownMinor { minor: u32, known: String },
    #[error(
        "a hold lasts as long as a process, for a while, or until it is released: give --pid P, --for DURATION or --until-release"
    )]
    NoLifetime,
    #[error("give --devices LIST or --count N, not both")]
    DevicesAndCount,
    #[error(
        "no MIG instance of {node} has capability minors {caps}: gres.conf and the MIG geometry differ (gpupin inventory lists the instances)",
        node = crate::model::nvidia::gpu_node(*gpu)
    )]
    UnknownMigMinors { gpu: u32, caps: String },
    #[error("give --mig PROFILE (with --count N) or --devices LIST, not both")]
    MigAndDevices,
    #[error(transparent)]
    Request(request::RequestError),
    #[error("invalid --count 0: expected a positive integer, such as 2")]
    ZeroCount,
    #[error("invalid --reason: {0}")]
    BadReason(&'static str),
    #[error(
        "invalid --for {asked}: a hold lasts at most {LONGEST_DAYS} days; give a shorter --for, or hold with --until-release (root) and release it"
    )]
    TooLong { asked: String },
    #[error(transparent)]
    Holder(#[from] BadHolderId),
    #[error("a hold gives request keys, or devices or count, not both")]
    KeysAndDevices,
    #[error("the request keys ask for no GPUs: give gpupin.count")]
    NoGpusAsked,
}

/// What to hold, as asked: `gpupin hold`'s arguments, and `gpupin serve`'s `hold`
/// request, whose JSON fields these are (docs/protocol.md; optional ones left out as
/// `mig` and `request` are, so that the wire stays as it was).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HoldRequest {
    /// The holder id.
    pub id: String,
    /// GPUs by index, UUID or bus id, comma-separated; device minors with `by_minor`
    /// (Slurm numbers GPUs by gres.conf's File= order, `/dev/nvidia<minor>`).
    pub devices: String,
    #[serde(default)]
    pub by_minor: bool,
    /// The process the hold lasts as long as.
    #[serde(default)]
    pub pid: Option<i32>,
    #[serde(default)]
    pub until_release: bool,
    /// Root only: whose hold it is (a name or uid; the caller's when absent).
    #[serde(default)]
    pub user: Option<String>,
    /// The holder it nests in.
    #[serde(default)]
    pub within: Option<String>,
    /// How many GPUs the policy chooses, instead of `devices` (then empty).
    #[serde(default)]
    pub count: Option<u32>,
    /// MIG instances of this profile, or `any` (`gpupin.mig`), `count` of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// Why, for status and the audit log (one line, at most `MAX_REASON` characters).
    #[serde(default)]
    pub reason: Option<String>,
    /// How long it lasts at most, in seconds (`--for`), from when it is held.
    #[serde(default)]
    pub for_secs: Option<u64>,
    /// The whole request as `gpupin pick`'s keys (`gpupin.count`, `gpupin.policy`,
    /// `gpupin.memory`, `gpupin.wait` ...), instead of `devices` and `count` (then
    /// empty): the Python client's `acquire`, a user's `hold --wait`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request: Vec<(String, String)>,
    /// Root's own hold only: how long it may wait in the queue for its GPUs (`--wait`);
    /// `None`: refused at once when they are taken. Never sent: through `gpupin serve`
    /// a wait is one of `request`'s keys.
    #[serde(skip)]
    pub wait: Option<std::time::Duration>,
}

impl HoldRequest {
    /// The request keys (`request`) as a request: `None` when there are none (then
    /// `devices`, `count` or `mig` say what is held), refused beside `devices` or `count`.
    pub fn keys(&self) -> Result<Option<GpuRequest>, HoldError> {
        if self.request.is_empty() {
            return Ok(None);
        }
        if self.count.is_some() || !self.devices.trim().is_empty() {
            return Err(HoldError::KeysAndDevices);
        }
        let pairs: Vec<(&str, &str)> = self
            .request
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let parsed = request::from_pairs(&pairs, Origin::Cli).map_err(HoldError::Request)?;
        parsed.map(Some).ok_or(HoldError::NoGpusAsked)
    }
}

/// Whose a hold is and whether `[limits]` apply to it: decided by whoever takes the
/// request (root's `gpupin hold`; `gpupin serve`, from who the kernel says the caller is).
#[derive(Debug, Clone)]
pub struct HoldOwner {
    pub owner: Owner,
    /// Whether the limits apply (a hold a user asks for; not one root makes).
    pub limited: bool,
}

/// A hold as granted: the request with its holder id checked and its end in time.
struct Hold<'a> {
    asked: &'a HoldRequest,
    id: HolderId,
    whose: &'a HoldOwner,
    /// Seconds since the Unix epoch at which the hold ends by itself (`--for`).
    expires_at: Option<u64>,
}

/// The longest reason a hold keeps: it is shown in status and written to the audit log.
pub(crate) const MAX_REASON: usize = 200;
/// The longest `--for`: a year and a day, in days. A longer time is no plan but a typo
/// (`500000000000y`), and the end it would store breaks every reader of times.
pub const LONGEST_DAYS: u64 = 366;
/// `LONGEST_DAYS` in seconds.
pub(crate) const LONGEST_SECS: u64 = LONGEST_DAYS * 86_400;

/// Refuses a hold time longer than `LONGEST_DAYS`: the one check for the CLI's `--for`
/// and for a `for_secs` the daemon was sent.
pub fn check_for(secs: u64) -> Result<u64, HoldError> {
    match secs <= LONGEST_SECS {
        true => Ok(secs),
        false => Err(HoldError::TooLong {
            asked: humantime::format_duration(std::time::Duration::from_secs(secs)).to_string(),
        }),
    }
}

const DEVICES_EXPECTED: &str = "expected a comma-separated list of GPU indices, UUIDs or bus ids (device minors with --by-minor)";

/// Holds what `asked` says for `whose` (its `request` keys left out: see `hold_with`).
pub fn hold(
    config: &Config,
    asked: &HoldRequest,
    whose: &HoldOwner,
    source: &str,
) -> Result<Record, HoldError> {
    hold_with(config, asked, whose, None, None, source)
}

/// `hold`, with the whole request given (`asked.keys()`, read by the caller where its
/// checks come in their order: `gpupin serve`'s hold with request keys: a policy,
/// memory, a wait in the queue), instead of `asked.devices` or `asked.count`; a wait
/// ends once `still_wanted` says no.
pub(crate) fn hold_with(
    config: &Config,
    asked: &HoldRequest,
    whose: &HoldOwner,
    request: Option<GpuRequest>,
    still_wanted: Option<StillWanted>,
    source: &str,
) -> Result<Record, HoldError> {
    let now = crate::state::ledger::unix_now();
    let hold = Hold {
        asked,
        id: HolderId::new(&asked.id)?,
        whose,
        expires_at: asked.for_secs.map(|secs| now.saturating_add(secs)),
    };
    if asked.pid.is_none() && !asked.until_release && hold.expires_at.is_none() {
        return Err(HoldError::NoLifetime);
    }
    if let Some(end) = hold.expires_at {
        // An end further off than the longest hold from now (a minute's slack, as for a
        // caller that computed it a moment ago) was no checked `--for`.
        check_for(end.saturating_sub(now).saturating_sub(60))?;
    }
    if let Some(reason) = &asked.reason {
        check_reason(reason)?;
    }
    let mut request = match request {
        Some(request) => GpuRequest {
            within: request.within.or_else(|| asked.within.clone()),
            ..request
        },
        None => match &asked.mig {
            Some(mig) => mig_request(asked, mig)?,
            None => {
                let selection = match (asked.count, asked.devices.trim().is_empty()) {
                    (Some(_), false) => return Err(HoldError::DevicesAndCount),
                    // The CLI takes no 0; a request to gpupin serve may say anything.
                    (Some(0), true) => return Err(HoldError::ZeroCount),
                    (Some(n), true) => Selection::Count(n),
                    (None, _) => Selection::Devices(device_keys(config, asked)?),
                };
                GpuRequest {
                    within: asked.within.clone(),
                    ..GpuRequest::new(selection, Origin::Cli)
                }
            }
        },
    };
    if asked.wait.is_some() {
        request.wait = asked.wait;
    }
    grant_hold(config, &hold, &request, still_wanted, source)
}

/// `--mig PROFILE [--count N]`: checked as `gpupin.mig` is everywhere.
fn mig_request(hold: &HoldRequest, mig: &str) -> Result<GpuRequest, HoldError> {
    if !hold.devices.trim().is_empty() || hold.by_minor {
        return Err(HoldError::MigAndDevices);
    }
    let count = hold.count.unwrap_or(1);
    if count == 0 {
        return Err(HoldError::ZeroCount);
    }
    let count = count.to_string();
    let pairs = [
        (Key::Mig.as_str(), mig),
        (Key::Count.as_str(), count.as_str()),
    ];
    let Some(mut request) = request::from_pairs(&pairs, Origin::Cli).map_err(HoldError::Request)?
    else {
        return Err(HoldError::MigAndDevices);
    };
    request.within = hold.within.clone();
    Ok(request)
}

fn grant_hold(
    config: &Config,
    hold: &Hold,
    request: &GpuRequest,
    still_wanted: Option<StillWanted>,
    source: &str,
) -> Result<Record, HoldError> {
    let asked = hold.asked;
    let meta = HolderMeta {
        source: source.to_string(),
        pid: asked.pid,
        kind: HolderKind::Hold,
        owner: Some(hold.whose.owner.clone()),
        // A hold for a while without a process lasts until released or its time is up.
        until_release: asked.until_release || (asked.pid.is_none() && hold.expires_at.is_some()),
        limited: hold.whose.limited,
        expires_at: hold.expires_at,
        reason: asked.reason.clone(),
        still_wanted,
        ..HolderMeta::default()
    };
    let (_, record) = grant::allocate(config, &hold.id, request, meta)?;
    Ok(record)
}

/// A reason is one line of what a person wrote: shown in tables and logs as it is.
fn check_reason(reason: &str) -> Result<(), HoldError> {
    if reason.trim().is_empty() {
        return Err(HoldError::BadReason(
            "it is empty; say why the GPUs are held",
        ));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(HoldError::BadReason("it is longer than 200 characters"));
    }
    if reason.chars().any(char::is_control) {
        return Err(HoldError::BadReason(
            "it holds a control character; write it on one line",
        ));
    }
    Ok(())
}

/// The GPUs `--devices` names, as UUIDs where they were device minors.
fn device_keys(config: &Config, hold: &HoldRequest) -> Result<Vec<String>, HoldError> {
    let keys: Vec<String> = hold
        .devices
        .split(',')
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        return Err(HoldError::BadDevices {
            value: hold.devices.clone(),
            expected: DEVICES_EXPECTED,
        });
    }
    if !hold.by_minor {
        return Ok(keys);
    }
    let inventory = config.load_inventory().map_err(GrantError::from)?;
    by_minor(&keys, &inventory, &hold.devices)
}

/// Device minors as the UUIDs of the GPUs that have them.
fn by_minor(keys: &[String], inventory: &Inventory, value: &str) -> Result<Vec<String>, HoldError> {
    keys.iter()
        .map(|k| {
            if k.contains('/') {
                return mig_by_minors(k, inventory, value);
            }
            let minor: u32 = k.parse().map_err(|_| HoldError::BadDevices {
                value: value.to_string(),
                expected: "expected comma-separated device minors, such as 0,1 (the N of /dev/nvidiaN)",
            })?;
            inventory
                .gpus
                .iter()
                .find(|g| g.minor == minor)
                .map(|g| g.uuid.clone())
                .ok_or_else(|| HoldError::UnknownMinor {
                    minor,
                    known: inventory
                        .gpus
                        .iter()
                        .map(|g| g.minor.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                })
        })
        .collect()
}

/// A MIG instance by its GPU's minor and its capability minors (`0/84/85`, what
/// `--by-slurm-index` makes of a gres.conf `MultipleFiles=` line).
fn mig_by_minors(key: &str, inventory: &Inventory, value: &str) -> Result<String, HoldError> {
    let bad = || HoldError::BadDevices {
        value: value.to_string(),
        expected: "expected device minors such as 0,1, a MIG instance as GPU/CAP/CAP (0/84/85)",
    };
    let numbers = key
        .split('/')
        .map(|n| n.parse::<u32>().ok())
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(bad)?;
    let (gpu, mut caps) = match numbers.split_first() {
        Some((gpu, caps)) if caps.len() == 2 => (*gpu, caps.to_vec()),
        _ => return Err(bad()),
    };
    caps.sort_unstable();
    inventory
        .mig_instances()
        .find(|m| {
            m.parent_minor == gpu
                && m.access.is_some_and(|a| {
                    let mut own = [a.gi_minor, a.ci_minor];
                    own.sort_unstable();
                    own == caps.as_slice()
                })
        })
        .map(|m| m.uuid.clone())
        .ok_or_else(|| HoldError::UnknownMigMinors {
            gpu,
            caps: format!("{} and {}", caps[0], caps[1]),
        })
}

/// Test fixtures: holds as root's tools make them.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Root's hold `id` of `devices` until released, as `gpupin hold` as root makes it.
    pub(crate) fn roots(config: &Config, id: &str, devices: &str) -> Record {
        let root = Owner {
            uid: 0,
            user: "root".into(),
            groups: vec![],
        };
        for_owner(config, id, devices, root, None)
    }

    /// The hold `id` of `devices` root makes for `owner`: while `pid` runs, or (`None`)
    /// until released.
    pub(crate) fn for_owner(
        config: &Config,
        id: &str,
        devices: &str,
        owner: Owner,
        pid: Option<i32>,
    ) -> Record {
        let asked = HoldRequest {
            id: id.into(),
            devices: devices.into(),
            pid,
            until_release: pid.is_none(),
            ..HoldRequest::default()
        };
        let whose = HoldOwner {
            owner,
            limited: false,
        };
        hold(config, &asked, &whose, "test").unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_lasts_at_most_a_year_and_a_day() {
        assert_eq!(check_for(LONGEST_SECS).unwrap(), LONGEST_SECS);
        let err = check_for(LONGEST_SECS + 1).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid --for 1year 18h 1s: a hold lasts at most 366 days; give a shorter --for, or hold with --until-release (root) and release it"
        );
        assert!(check_for(u64::MAX).is_err());
    }

    fn config(dir: &std::path::Path, inventory: &str) -> Config {
        Config {
            state_dir: dir.join("state"),
            inventory: inventory.parse().unwrap(),
            audit_log: dir.join("audit.log"),
            ..Config::default()
        }
    }

    fn root() -> Owner {
        Owner {
            uid: 0,
            user: "root".into(),
            groups: vec![],
        }
    }

    fn spec(devices: &str, by_minor: bool) -> HoldRequest {
        HoldRequest {
            id: "slurm-42".into(),
            devices: devices.into(),
            by_minor,
            until_release: true,
            ..HoldRequest::default()
        }
    }

    /// Root's hold, as `gpupin hold` as root makes it.
    fn by_root() -> HoldOwner {
        HoldOwner {
            owner: root(),
            limited: false,
        }
    }

    /// An inventory file whose minors are not its indices, as on machines where NVML's
    /// order and the driver's minors differ.
    fn shuffled(dir: &std::path::Path) -> String {
        let gpus: Vec<String> = [(0, 3), (1, 2), (2, 1), (3, 0)]
            .iter()
            .map(|(index, minor)| {
                format!(
                    r#"{{"index": {index}, "uuid": "GPU-m{minor}", "name": "Sim", "memory": "80GiB", "pci_bus_id": "00000000:1{index}:00.0", "minor": {minor}}}"#
                )
            })
            .collect();
        let path = dir.join("inventory.json");
        std::fs::write(&path, format!("{{\"gpus\": [{}]}}", gpus.join(","))).unwrap();
        path.display().to_string()
    }

    #[test]
    fn mig_holds_instances_of_a_profile_and_is_checked_in_one_line() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), "sim:nvswitch8mig");
        let asked = HoldRequest {
            mig: Some("1g.10gb".into()),
            count: Some(3),
            ..spec("", false)
        };
        let record = hold(&config, &asked, &by_root(), "test").unwrap();
        assert_eq!(record.gpus.len(), 3);
        assert!(
            record.gpus.iter().all(|u| u.starts_with("MIG-")),
            "{record:?}"
        );
        assert_eq!(record.indices, [0, 0, 0]);
        let bad = HoldRequest {
            id: "m2".into(),
            mig: Some("10gb".into()),
            ..spec("", false)
        };
        let err = hold(&config, &bad, &by_root(), "test")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid --mig=\"10gb\": expected a MIG profile"),
            "{err}"
        );
        let both = HoldRequest {
            id: "m3".into(),
            mig: Some("any".into()),
            ..spec("1", false)
        };
        let err = hold(&config, &both, &by_root(), "test")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "give --mig PROFILE (with --count N) or --devices LIST, not both"
        );
    }

    #[test]
    fn by_minor_takes_a_mig_instance_as_gpu_and_cap_minors() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), "sim:dgxa100mig");
        let record = hold(&config, &spec("0/85/84,3", true), &by_root(), "test").unwrap();
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let mut want = vec![
            inv.find_mig("0:2").unwrap().uuid.clone(),
            inv.gpus[3].uuid.clone(),
        ];
        want.sort();
        let mut got = record.gpus.clone();
        got.sort();
        assert_eq!(got, want);
        let other = HoldRequest {
            id: "slurm-43".into(),
            ..spec("0/84/99", true)
        };
        let err = hold(&config, &other, &by_root(), "test")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "no MIG instance of /dev/nvidia0 has capability minors 84 and 99: gres.conf and the MIG geometry differ (gpupin inventory lists the instances)"
        );
    }

    #[test]
    fn by_minor_holds_the_gpus_with_those_device_minors() {
        let tmp = tempfile::tempdir().unwrap();
        let inventory = shuffled(tmp.path());
        let config = config(tmp.path(), &inventory);
        let record = hold(&config, &spec("0,1", true), &by_root(), "test").unwrap();
        let mut gpus = record.gpus.clone();
        gpus.sort();
        assert_eq!(gpus, ["GPU-m0", "GPU-m1"]);
        let mut indices = record.indices.clone();
        indices.sort();
        assert_eq!(indices, [2, 3]);
        assert!(record.until_release);
    }

    #[test]
    fn bad_devices_and_no_lifetime_are_refused_in_one_line() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path(), "sim:nvswitch8");
        let mut no_life = spec("1", false);
        no_life.until_release = false;
        for (h, wanted) in [
            (spec("", false), "invalid --devices \"\""),
            (
                spec("x", true),
                "invalid --devices \"x\": expected comma-separated device minors",
            ),
            (spec("9", true), "no GPU has device minor 9 (/dev/nvidia9)"),
            (no_life, "give --pid P, --for DURATION or --until-release"),
            (
                HoldRequest {
                    count: Some(1),
                    ..spec("1", false)
                },
                "give --devices LIST or --count N, not both",
            ),
            (
                HoldRequest {
                    count: Some(0),
                    ..spec("", false)
                },
                "invalid --count 0: expected a positive integer, such as 2",
            ),
            (
                HoldRequest {
                    reason: Some("two\nlines".into()),
                    ..spec("1", false)
                },
                "invalid --reason: it holds a control character; write it on one line",
            ),
        ] {
            let err =
                crate::base::message::one_line(&hold(&config, &h, &by_root(), "test").unwrap_err());
            assert!(err.contains(wanted), "{err}");
        }
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert!(ledger.records().unwrap().is_empty());
    }
}
