//! How much gpupin logs: `GPUPIN_LOG` in the environment, else the config's `log` key.
//! The library emits `tracing` events and parses the level; the one subscriber (stderr
//! only, since a hook's stdout may be read by its caller: podman's precreate reads the
//! spec from it) is installed by each binary, at start (`init_from_env`) and once a config
//! is loaded (`init_from_config`), through the functions below. Off unless asked for: a
//! hook runs on every container start.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;

/// The target of the events that carry an audit line the audit log could not take
/// (`audit_failure = "warn"`): the binaries write these to stderr whatever the level,
/// since they are the trail's, not a log's.
pub(crate) const AUDIT_FALLBACK: &str = "gpupin::audit_fallback";

/// The environment variable that turns logging on, and wins over the config key.
pub(crate) const LOG_ENV: &str = "GPUPIN_LOG";

/// A log level as an admin writes it (`GPUPIN_LOG=debug`, `log = "debug"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Nothing: lets `GPUPIN_LOG=off` silence a configured level.
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Level {
    pub const EXPECTED: &str = "expected one of error, warn, info, debug, trace, off";

    /// The most verbose events this level lets through.
    pub fn filter(self) -> LevelFilter {
        match self {
            Level::Off => LevelFilter::OFF,
            Level::Error => LevelFilter::ERROR,
            Level::Warn => LevelFilter::WARN,
            Level::Info => LevelFilter::INFO,
            Level::Debug => LevelFilter::DEBUG,
            Level::Trace => LevelFilter::TRACE,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid log level {value:?}: {}", Level::EXPECTED)]
pub struct BadLevel {
    pub value: String,
}

impl std::str::FromStr for Level {
    type Err = BadLevel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Level::Off),
            "error" => Ok(Level::Error),
            "warn" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" => Ok(Level::Debug),
            "trace" => Ok(Level::Trace),
            _ => Err(BadLevel {
                value: s.to_string(),
            }),
        }
    }
}

/// The level `GPUPIN_LOG` asks for: `Ok(None)` when it is unset or empty (the config key
/// may then decide). A value that is not valid UTF-8 is refused like any other.
pub(crate) fn from_env() -> Result<Option<Level>, BadLevel> {
    level_of(std::env::var_os(LOG_ENV).as_deref())
}

/// At a binary's start: the subscriber `GPUPIN_LOG` asks for, one env read when it is
/// unset, which is all a container without a request pays. An invalid value is the
/// binary's to say (one warning line); logging then stays off.
pub fn init_from_env() -> Result<(), BadLevel> {
    if let Some(level) = from_env()? {
        install(level);
    }
    Ok(())
}

/// Once a config is loaded: its `log` key (`configured`), unless `GPUPIN_LOG` was set (it
/// wins, even when it was invalid). With logging off (the default, or asked for), audit
/// lines the audit log could not take still reach stderr (the journal, the engine's
/// log), since they are the trail's; a subscriber installed before wins.
pub fn init_from_config(configured: Option<Level>) {
    if let Some(level) = configured
        && std::env::var_os(LOG_ENV).is_none_or(|v| v.is_empty())
    {
        install(level);
    }
    install_audit_fallback();
}

/// A subscriber for `AUDIT_FALLBACK` events alone.
fn install_audit_fallback() {
    let targets = Targets::new().with_target(AUDIT_FALLBACK, LevelFilter::ERROR);
    install_stderr(LevelFilter::ERROR, targets);
}

fn install(level: Level) {
    if level == Level::Off {
        return;
    }
    // gpupin's own events at the level asked for; the libraries' (the HTTP/2 and gRPC
    // stack of `gpupin device-plugin` logs every frame at debug) at info at most.
    let ours = level.filter();
    let targets = Targets::new()
        .with_default(ours.min(LevelFilter::INFO))
        .with_targets(["gpupin", "gpupin_hook", "gpupin_runtime"].map(|t| (t, ours)))
        .with_target(AUDIT_FALLBACK, LevelFilter::ERROR);
    install_stderr(ours, targets);
}

/// The process's one subscriber: `targets` up to `max`, written to stderr. A second
/// set-up (a config loaded twice, or the fallback after a level) keeps the first.
fn install_stderr(max: LevelFilter, targets: Targets) {
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(max)
        .finish()
        .with(targets);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

fn level_of(value: Option<&std::ffi::OsStr>) -> Result<Option<Level>, BadLevel> {
    match value.filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Some(s) => s.parse().map(Some),
            None => Err(BadLevel {
                value: v.to_string_lossy().into_owned(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn every_documented_level_parses() {
        for (text, filter) in [
            ("error", LevelFilter::ERROR),
            ("warn", LevelFilter::WARN),
            ("info", LevelFilter::INFO),
            ("debug", LevelFilter::DEBUG),
            ("trace", LevelFilter::TRACE),
            ("off", LevelFilter::OFF),
        ] {
            assert_eq!(text.parse::<Level>().unwrap().filter(), filter, "{text}");
        }
    }

    #[test]
    fn a_bad_level_is_named_on_one_line() {
        for bad in ["DEBUG", "verbose", "debug ", "", "de\nbug"] {
            let err = bad.parse::<Level>().unwrap_err().to_string();
            assert!(
                err.starts_with("invalid log level ") && err.ends_with(Level::EXPECTED),
                "{err}"
            );
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn unset_or_empty_env_leaves_the_choice_to_the_config() {
        assert_eq!(level_of(None), Ok(None));
        assert_eq!(level_of(Some(OsStr::new(""))), Ok(None));
        assert_eq!(level_of(Some(OsStr::new("info"))), Ok(Some(Level::Info)));
        assert!(level_of(Some(OsStr::new("loud"))).is_err());
    }

    #[test]
    fn non_utf8_env_is_refused_not_ignored() {
        use std::os::unix::ffi::OsStrExt;
        let err = level_of(Some(OsStr::from_bytes(b"deb\xffug"))).unwrap_err();
        assert!(err.to_string().contains("deb\u{fffd}ug"), "{err}");
    }
}
