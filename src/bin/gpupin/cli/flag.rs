//! Option values that the library parses (`--since 2h`), with a bad one reported in
//! gpupin's words, `invalid --since "yesterday": expected ...`, through clap, so that it
//! ends like every usage error: one line and exit status 2.

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use std::ffi::OsStr;
use std::fmt::Display;

/// A clap value parser around `parse`, whose error says the value and what was expected.
pub struct Parsed<T, E>(pub fn(&str) -> Result<T, E>);

// Derived, Clone would ask for T: Clone and E: Clone; a fn pointer is Copy whatever they are.
impl<T, E> Clone for Parsed<T, E> {
    fn clone(&self) -> Self {
        Parsed(self.0)
    }
}

impl<T, E> TypedValueParser for Parsed<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Display + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg
            .and_then(|a| a.get_long())
            .map_or_else(|| "value".to_string(), |long| format!("--{long}"));
        let Some(text) = value.to_str() else {
            return Err(usage(
                cmd,
                format!("invalid {flag} {value:?}: expected UTF-8 text"),
            ));
        };
        (self.0)(text).map_err(|err| usage(cmd, format!("invalid {flag} {err}")))
    }
}

fn usage(cmd: &clap::Command, message: String) -> clap::Error {
    clap::Error::raw(ErrorKind::ValueValidation, format!("{message}\n")).with_cmd(cmd)
}

/// A duration as people write it (`10s`, `2m`) that may be zero (`0s`: no grace).
pub fn grace() -> Parsed<std::time::Duration, String> {
    Parsed(|text| {
        humantime::parse_duration(text)
            .map_err(|_| format!("{text:?}: expected a duration, such as 60s or 0s"))
    })
}

/// How long a hold lasts (`--for 2h`): at least a second, at most
/// `hold::LONGEST_DAYS`; whole seconds.
pub fn hold_for() -> Parsed<u64, String> {
    Parsed(|text| {
        let asked = humantime::parse_duration(text)
            .map_err(|_| format!("{text:?}: expected a duration, such as 2h or 30m"))?;
        gpupin::command::check_for(asked.as_secs().max(1))
            .map_err(|_| format!("{text:?}: a hold lasts at most {} days; give a shorter --for, or hold with --until-release (root) and release it", gpupin::command::LONGEST_DAYS))
    })
}

/// How long a request may wait in the queue, as `gpupin.wait` takes it: at most 24h.
pub fn wait() -> Parsed<std::time::Duration, String> {
    Parsed(|text| match humantime::parse_duration(text) {
        Ok(d) if d <= gpupin::command::MAX_WAIT => Ok(d),
        _ => Err(format!(
            "{text:?}: expected a duration of at most 24h, such as 10m"
        )),
    })
}

/// A count of GPUs: a positive integer.
pub fn positive() -> Parsed<u32, String> {
    Parsed(|text| match text.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{text:?}: expected a positive integer, such as 2")),
    })
}
