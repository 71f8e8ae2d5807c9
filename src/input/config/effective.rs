//! The configuration as gpupin uses it, every key with its value (the file's or the
//! default), as a TOML file that reads back to the same configuration: what `gpupin
//! config check` prints.

use super::Leftovers;
use super::{AuditFailure, Config, CudaIds, Driver, Foreign, MigUnits, Unrequested};
use crate::base::log::Level;
use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

/// `config` as TOML: every key, the defaults included, then `[limits]`, `[serve]` and
/// `[health]`.
pub fn effective_toml(config: &Config) -> String {
    let mut out = String::new();
    let mut key = |name: &str, value: String| {
        let _ = writeln!(out, "{name} = {value}");
    };
    key("state_dir", path(&config.state_dir));
    key("inventory", quoted(&config.inventory.to_string()));
    key("policy", quoted(&config.policy.to_string()));
    key("max_shared", config.max_shared.to_string());
    key("claim_grace", duration(config.claim_grace));
    key(
        "foreign",
        quoted(match config.foreign {
            Foreign::Avoid => "avoid",
            Foreign::Ignore => "ignore",
        }),
    );
    key(
        "mig",
        quoted(match config.mig {
            MigUnits::WholeOnly => "whole-only",
            MigUnits::InstancesToo => "instances-too",
        }),
    );
    key("live_cache", duration(config.live_cache));
    if let Some(live) = &config.live_file {
        key("live_file", path(live));
    }
    key("runtime", path(&config.runtime));
    key(
        "log",
        quoted(match config.log.unwrap_or(Level::Off) {
            Level::Off => "off",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }),
    );
    key(
        "driver",
        quoted(match config.driver {
            Driver::Auto => "auto",
            Driver::Cdi => "cdi",
            Driver::None => "none",
        }),
    );
    let dirs: Vec<String> = config.cdi_spec_dirs.iter().map(|d| path(d)).collect();
    key("cdi_spec_dirs", format!("[{}]", dirs.join(", ")));
    key(
        "unrequested",
        quoted(match config.unrequested {
            Unrequested::Request => "request",
            Unrequested::Strip => "strip",
            Unrequested::Pass => "pass",
        }),
    );
    key("audit_log", path(&config.audit_log));
    key(
        "audit_max_size",
        quoted(&crate::base::units::format_size(config.audit_max_size)),
    );
    key("audit_keep", config.audit_keep.to_string());
    key(
        "audit_failure",
        quoted(match config.audit_failure {
            AuditFailure::Refuse => "refuse",
            AuditFailure::Warn => "warn",
        }),
    );
    key("confine", quoted(&config.confine.to_string()));
    key("node_access", quoted(config.node_access.as_str()));
    key("node_dir", path(&config.node_dir));
    key(
        "leftovers",
        quoted(match config.leftovers {
            Leftovers::Wait => "wait",
            Leftovers::Kill => "kill",
        }),
    );
    key(
        "cuda_visible_devices",
        quoted(match config.cuda_visible_devices {
            CudaIds::Index => "index",
            CudaIds::Uuid => "uuid",
        }),
    );
    key("socket", path(&config.socket_path()));
    if let Some(group) = &config.socket_group {
        key("socket_group", quoted(group));
    }
    if let Some(file) = &config.metrics_file {
        key("metrics_file", path(file));
    }
    key("slurm_containers", config.slurm_containers.to_string());
    if let Some(label) = &config.trusted_user_label {
        key("trusted_user_label", quoted(label));
    }
    key("queue", quoted(config.queue.as_str()));
    key("idle_utilization", config.idle_utilization.to_string());
    key("idle_after", duration(config.idle_after));
    key("idle_action", quoted(config.idle_action.as_str()));
    let limits = &config.limits;
    let _ = writeln!(out, "\n[limits]");
    if let Some(max) = limits.max_gpus_per_user {
        let _ = writeln!(out, "max_gpus_per_user = {max}");
    }
    let _ = writeln!(out, "max_waiting_per_user = {}", limits.max_waiting());
    for (name, user) in &limits.users {
        let _ = writeln!(out, "\n[limits.users.{}]", quoted(name));
        if let Some(max) = user.max_gpus {
            let _ = writeln!(out, "max_gpus = {max}");
        }
    }
    for (name, group) in &limits.groups {
        let _ = writeln!(out, "\n[limits.groups.{}]", quoted(name));
        if let Some(max) = group.max_gpus {
            let _ = writeln!(out, "max_gpus = {max}");
        }
        if let Some(gpus) = &group.gpus {
            let keys: Vec<String> = gpus
                .iter()
                .map(|g| match g {
                    crate::model::limits::GpuKey::Index(i) => i.to_string(),
                    crate::model::limits::GpuKey::Name(name) => quoted(name),
                })
                .collect();
            let _ = writeln!(out, "gpus = [{}]", keys.join(", "));
        }
    }
    let serve = &config.serve;
    let _ = writeln!(
        out,
        "\n[serve]\nmax_connections = {}\nmax_connections_per_user = {}\nmax_watched_per_user = {}\nrequest_timeout = {}",
        serve.max_connections,
        serve.max_connections_per_user,
        serve.max_watched_per_user,
        duration(serve.request_timeout)
    );
    let health = &config.health;
    let xid: Vec<String> = health
        .xid
        .iter()
        .map(|(xid, action)| format!("{xid} = {}", quoted(action.as_str())))
        .collect();
    let _ = writeln!(
        out,
        "\n[health]\nwatch = {}\npoll = {}\nxid = {{ {} }}\nevict = {}",
        health.watch,
        duration(health.poll),
        xid.join(", "),
        health.evict
    );
    out
}

/// A TOML basic string.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn path(p: &Path) -> String {
    quoted(&p.display().to_string())
}

fn duration(d: Duration) -> String {
    quoted(&humantime::format_duration(d).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What check prints reads back as the configuration it was printed from.
    #[test]
    fn the_effective_config_reads_back_as_itself() {
        let path = Path::new("/etc/gpupin/config.toml");
        for text in [
            "",
            "policy = \"spread\"\nlive_cache = \"0s\"\nconfine = \"v1\"\nlog = \"debug\"\nsocket_group = \"gpu\"\n\
             queue = \"fifo\"\nidle_utilization = 10\nidle_after = \"90m\"\nidle_action = \"release-holds\"\n\
             [limits]\nmax_gpus_per_user = 2\n[limits.users.alice]\nmax_gpus = 4\n\
             [limits.groups.vision]\nmax_gpus = 4\ngpus = [0, \"GPU-x\"]\n[serve]\nrequest_timeout = \"1m\"\n",
        ] {
            let config = Config::parse(text, path).unwrap();
            let printed = effective_toml(&config);
            let again = Config::parse(&printed, path).unwrap();
            let expected = Config {
                // A default printed is the same default; an absent log key reads as off.
                log: Some(config.log.unwrap_or(Level::Off)),
                limits: crate::model::limits::Limits {
                    max_waiting_per_user: Some(config.limits.max_waiting()),
                    ..config.limits.clone()
                },
                socket: Some(config.socket_path()),
                ..config.clone()
            };
            assert_eq!(again, expected, "{printed}");
        }
    }
}
