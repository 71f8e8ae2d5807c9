//! The defaults of the config's keys and the readers of those whose values need more
//! than their type says: each names the key, the bad value and what was expected, in
//! one line (`invalid config FILE: KEY VALUE: expected ...`).

use super::Leftovers;
use super::{
    AuditFailure, CudaIds, DEFAULT_AUDIT_LOG, DEFAULT_CDI_SPEC_DIRS, DEFAULT_CLAIM_GRACE,
    DEFAULT_IDLE_AFTER, DEFAULT_IDLE_UTILIZATION, DEFAULT_KEEP, DEFAULT_LIVE_CACHE,
    DEFAULT_MAX_BYTES, DEFAULT_STATE_DIR, Driver, Foreign, IdleAction, QueueOrder, ServeSettings,
    Unrequested,
};
use crate::base::log::Level;
use crate::host::confine::Confine;
use crate::input::config::InventorySource;
use crate::input::config::PolicyName;
use crate::model::limits::Limits;
use serde::de::{Deserialize, Deserializer, Error};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub(super) fn state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}

pub(super) fn inventory() -> InventorySource {
    InventorySource::Auto
}

pub(super) fn runtime() -> PathBuf {
    PathBuf::from("runc")
}

pub(super) fn claim_grace() -> Duration {
    DEFAULT_CLAIM_GRACE
}

pub(super) fn max_shared() -> u32 {
    4
}

pub(super) fn cdi_spec_dirs() -> Vec<PathBuf> {
    DEFAULT_CDI_SPEC_DIRS.iter().map(PathBuf::from).collect()
}

pub(super) fn audit_log() -> PathBuf {
    PathBuf::from(DEFAULT_AUDIT_LOG)
}

pub(super) fn audit_max_size() -> u64 {
    DEFAULT_MAX_BYTES
}

pub(super) fn audit_keep() -> u32 {
    DEFAULT_KEEP
}

pub(super) fn confine() -> Confine {
    Confine::Auto
}

pub(super) fn live_cache() -> Duration {
    DEFAULT_LIVE_CACHE
}

pub(super) fn idle_utilization() -> u32 {
    DEFAULT_IDLE_UTILIZATION
}

pub(super) fn idle_after() -> Duration {
    DEFAULT_IDLE_AFTER
}

/// A string value parsed by its type: `KEY "VALUE": EXPECTED` when it does not parse.
fn keyed<'de, D: Deserializer<'de>, T: FromStr>(
    d: D,
    key: &str,
    expected: &str,
) -> Result<T, D::Error> {
    let text = String::deserialize(d)?;
    text.parse()
        .map_err(|_| D::Error::custom(format!("{key} {text:?}: {expected}")))
}

/// A duration such as "2m"; `expected` describes one.
fn duration<'de, D: Deserializer<'de>>(
    d: D,
    key: &str,
    expected: &str,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map_err(|_| D::Error::custom(format!("{key} {text:?}: {expected}")))
}

pub(super) fn inventory_source<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<InventorySource, D::Error> {
    let text = String::deserialize(d)?;
    text.parse()
        .map_err(|e| D::Error::custom(format!("inventory: {e}")))
}

pub(super) fn policy<'de, D: Deserializer<'de>>(d: D) -> Result<PolicyName, D::Error> {
    let text = String::deserialize(d)?;
    text.parse()
        .map_err(|e| D::Error::custom(format!("policy: {e}")))
}

pub(super) fn claim_grace_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    duration(
        d,
        "claim_grace",
        "expected a duration such as \"120s\" or \"2m\"",
    )
}

pub(super) fn live_cache_age<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    duration(
        d,
        "live_cache",
        "expected a duration such as \"2s\" (\"0s\": no cache)",
    )
}

/// A label or annotation key: what Docker, podman and Kubernetes accept, on one line.
/// Of gpupin's own keys only `gpupin.user` may be it: the others are requests.
pub(super) fn trusted_user_label<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    let key = String::deserialize(d)?;
    let fits = !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/'));
    if !fits {
        return Err(D::Error::custom(format!(
            "trusted_user_label {:?}: expected a label key such as \"gpupin.user\" or \"hub.example.org/user\" (letters, digits, '.', '-', '_', '/')",
            crate::base::message::escape_controls(&key)
        )));
    }
    if key.starts_with(crate::model::names::ANNOTATION_PREFIX)
        && key != crate::model::names::USER_LABEL
    {
        return Err(D::Error::custom(format!(
            "trusted_user_label {key:?}: gpupin.* keys are requests; use \"gpupin.user\" or your platform's own key"
        )));
    }
    Ok(Some(key))
}

pub(super) fn max_shared_count<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match u32::deserialize(d)? {
        0 => Err(D::Error::custom("max_shared 0: expected at least 1")),
        n => Ok(n),
    }
}

pub(super) fn log_level<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Level>, D::Error> {
    keyed(d, "log", Level::EXPECTED).map(Some)
}

pub(super) fn driver<'de, D: Deserializer<'de>>(d: D) -> Result<Driver, D::Error> {
    keyed(d, "driver", Driver::EXPECTED)
}

pub(super) fn unrequested<'de, D: Deserializer<'de>>(d: D) -> Result<Unrequested, D::Error> {
    keyed(d, "unrequested", Unrequested::EXPECTED)
}

pub(super) fn cuda_ids<'de, D: Deserializer<'de>>(d: D) -> Result<CudaIds, D::Error> {
    keyed(d, "cuda_visible_devices", CudaIds::EXPECTED)
}

pub(super) fn leftovers<'de, D: Deserializer<'de>>(d: D) -> Result<Leftovers, D::Error> {
    keyed(d, "leftovers", Leftovers::EXPECTED)
}

pub(super) fn foreign<'de, D: Deserializer<'de>>(d: D) -> Result<Foreign, D::Error> {
    keyed(d, "foreign", Foreign::EXPECTED)
}

pub(super) fn queue_order<'de, D: Deserializer<'de>>(d: D) -> Result<QueueOrder, D::Error> {
    keyed(d, "queue", QueueOrder::EXPECTED)
}

pub(super) fn idle_action<'de, D: Deserializer<'de>>(d: D) -> Result<IdleAction, D::Error> {
    keyed(d, "idle_action", IdleAction::EXPECTED)
}

/// A percentage a GPU's utilization can be under: 0 would call nothing idle.
pub(super) fn idle_percent<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match i64::deserialize(d)? {
        n @ 1..=100 => Ok(n as u32),
        n => Err(D::Error::custom(format!(
            "idle_utilization {n}: expected a percentage from 1 to 100, such as 5"
        ))),
    }
}

/// A duration of at least a second: the daemon looks at the GPUs once a second at most.
pub(super) fn idle_after_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    match humantime::parse_duration(&text) {
        Ok(after) if after >= Duration::from_secs(1) => Ok(after),
        _ => Err(D::Error::custom(format!(
            "idle_after {text:?}: expected a duration of at least 1s, such as \"1h\" or \"30m\""
        ))),
    }
}

pub(super) fn mig<'de, D: Deserializer<'de>>(d: D) -> Result<super::MigUnits, D::Error> {
    keyed(d, "mig", super::MigUnits::EXPECTED)
}

pub(super) fn node_access<'de, D: Deserializer<'de>>(d: D) -> Result<super::NodeAccess, D::Error> {
    keyed(d, "node_access", super::NodeAccess::EXPECTED)
}

pub(super) fn node_dir() -> PathBuf {
    PathBuf::from("/dev")
}

/// An absolute directory: gpupin writes ACLs on the nodes in it.
pub(super) fn node_dir_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    let dir = PathBuf::deserialize(d)?;
    match dir.is_absolute() {
        true => Ok(dir),
        false => Err(D::Error::custom(format!(
            "node_dir {dir:?}: expected an absolute directory such as \"/dev\""
        ))),
    }
}

pub(super) fn audit_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let text = String::deserialize(d)?;
    match crate::base::units::parse_size(&text) {
        // Below a few KiB the log would rotate on every line.
        Ok(n) if n >= 4096 => Ok(n),
        _ => Err(D::Error::custom(format!(
            "audit_max_size {text:?}: expected a size of at least 4KiB, such as \"64MiB\""
        ))),
    }
}

pub(super) fn audit_failure<'de, D: Deserializer<'de>>(d: D) -> Result<AuditFailure, D::Error> {
    let text = String::deserialize(d)?;
    AuditFailure::parse(&text).ok_or_else(|| {
        D::Error::custom(format!(
            "audit_failure {text:?}: expected \"refuse\" (an allocation whose audit line cannot be written is undone) or \"warn\" (it goes on)"
        ))
    })
}

pub(super) fn limits<'de, D: Deserializer<'de>>(d: D) -> Result<Limits, D::Error> {
    let limits = Limits::deserialize(d)?;
    if limits.max_waiting_per_user == Some(0) {
        return Err(D::Error::custom(
            "limits.max_waiting_per_user 0: expected at least 1",
        ));
    }
    Ok(limits)
}

/// `confine`: a boolean (true is "auto") or one of its names.
pub(super) fn confine_value<'de, D: Deserializer<'de>>(d: D) -> Result<Confine, D::Error> {
    match toml::Value::deserialize(d)? {
        toml::Value::Boolean(on) => Ok(Confine::from(on)),
        toml::Value::String(s) => s
            .parse()
            .map_err(|_| D::Error::custom(format!("confine {s:?}: {}", Confine::EXPECTED))),
        other => Err(D::Error::custom(format!(
            "confine {other}: {}",
            Confine::EXPECTED
        ))),
    }
}

pub(super) fn health<'de, D: Deserializer<'de>>(d: D) -> Result<super::HealthSettings, D::Error> {
    super::health::HealthFile::deserialize(d)?
        .settings()
        .map_err(D::Error::custom)
}

pub(super) fn serve<'de, D: Deserializer<'de>>(d: D) -> Result<ServeSettings, D::Error> {
    super::serve::ServeFile::deserialize(d)?
        .settings()
        .map_err(D::Error::custom)
}
