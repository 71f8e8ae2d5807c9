//! The one log subscriber of a binary: stderr only (a hook's stdout may be the spec its
//! caller reads back), set up once, from `GPUPIN_LOG` at start or else from the config's
//! `log` key once a config is loaded. Shared by both binaries (gpupin-runtime includes
//! this file by path), so that the library itself never holds a subscriber.

use gpupin::base::log::{self, Level};
use gpupin::input::config::Config;

/// At start: one env read when `GPUPIN_LOG` is unset, which is all a container without a
/// request pays. An invalid value is one warning line, and logging stays off.
pub fn init_from_env() {
    match log::from_env() {
        Ok(Some(level)) => install(level),
        Ok(None) => {}
        Err(err) => {
            use std::io::Write;
            let line = gpupin::base::message::one_line(&err);
            let _ = writeln!(
                std::io::stderr().lock(),
                "gpupin: warning: {line}; logging off"
            );
        }
    }
}

/// Once a config is loaded: its `log` key, unless `GPUPIN_LOG` was set (it wins, even
/// when it was invalid).
pub fn init_from_config(config: &Config) {
    if let Some(level) = config.log
        && std::env::var_os(log::LOG_ENV).is_none_or(|v| v.is_empty())
    {
        install(level);
    }
    // Logging off (the default, or asked for): audit lines the audit log could not take
    // still reach stderr (the journal, the engine's log), since they are the trail's.
    // A subscriber installed above wins; this one then is not set.
    install_audit_fallback();
}

/// A subscriber for `log::AUDIT_FALLBACK` events alone.
fn install_audit_fallback() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    let targets = Targets::new().with_target(log::AUDIT_FALLBACK, LevelFilter::ERROR);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(LevelFilter::ERROR)
        .finish()
        .with(targets);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

fn install(level: Level) {
    if level == Level::Off {
        return;
    }
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    // gpupin's own events at the level asked for; the libraries' (the HTTP/2 and gRPC
    // stack of `gpupin device-plugin` logs every frame at debug) at info at most.
    let ours = level.filter();
    let targets = Targets::new()
        .with_default(ours.min(LevelFilter::INFO))
        .with_targets(["gpupin", "gpupin_hook", "gpupin_runtime"].map(|t| (t, ours)))
        .with_target(log::AUDIT_FALLBACK, LevelFilter::ERROR);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(ours)
        .finish()
        .with(targets);
    // A second set-up (a config loaded twice) keeps the first.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
