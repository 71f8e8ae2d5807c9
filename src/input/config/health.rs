//! `[health]` in the config: whether `gpupin serve` watches the GPUs' health through NVML,
//! how often it reads their error counters, and the action per XID where the catalog's
//! (`model::health::xid_action`) is not the site's.
//!
//! ```toml
//! [health]
//! watch = true                          # where the inventory comes from NVML
//! poll = "10s"                          # ECC counters, row remapping, retired pages
//! xid = { 13 = "reset", 79 = "reboot" } # ignore, restart-app, reset or reboot
//! evict = false                         # evict the holders of a GPU it fences
//! ```

use crate::model::health::Action;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSettings {
    pub watch: bool,
    pub poll: Duration,
    pub xid: BTreeMap<u64, Action>,
    /// Whether the holders of a GPU the health fences are evicted (`gpupin evict`, by
    /// `gpupin serve`), rather than only told.
    pub evict: bool,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            watch: true,
            poll: Duration::from_secs(10),
            xid: BTreeMap::new(),
            evict: false,
        }
    }
}

/// `[health]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HealthFile {
    watch: Option<bool>,
    poll: Option<String>,
    xid: Option<BTreeMap<String, String>>,
    evict: Option<bool>,
}

impl HealthFile {
    /// The settings, or one line naming the bad value.
    pub(super) fn settings(self) -> Result<HealthSettings, String> {
        let mut s = HealthSettings::default();
        if let Some(watch) = self.watch {
            s.watch = watch;
        }
        if let Some(evict) = self.evict {
            s.evict = evict;
        }
        if let Some(poll) = self.poll {
            s.poll = match humantime::parse_duration(&poll) {
                Ok(d) if d >= Duration::from_secs(1) => d,
                _ => {
                    return Err(format!(
                        "health.poll {poll:?}: expected a duration of at least 1s, such as \"10s\""
                    ));
                }
            };
        }
        for (key, value) in self.xid.unwrap_or_default() {
            let Ok(xid) = key.parse::<u64>() else {
                return Err(format!(
                    "health.xid key {key:?}: expected an XID number, such as 79"
                ));
            };
            let Some(action) = Action::parse(&value) else {
                return Err(format!(
                    "health.xid.{xid} {value:?}: expected \"ignore\", \"restart-app\", \"reset\" or \"reboot\""
                ));
            };
            s.xid.insert(xid, action);
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HealthSettings, String> {
        toml::from_str::<HealthFile>(text).unwrap().settings()
    }

    #[test]
    fn what_is_written_is_what_serve_uses_and_bad_values_are_one_line() {
        assert_eq!(parse("").unwrap(), HealthSettings::default());
        let s = parse(
            "watch = false\npoll = \"30s\"\nevict = true\nxid = { 13 = \"reset\", 79 = \"ignore\" }",
        )
        .unwrap();
        assert!(!s.watch);
        assert!(s.evict);
        assert_eq!(s.poll, Duration::from_secs(30));
        assert_eq!(
            s.xid,
            BTreeMap::from([(13, Action::Reset), (79, Action::Ignore)])
        );
        assert_eq!(
            parse("poll = \"200ms\"").unwrap_err(),
            "health.poll \"200ms\": expected a duration of at least 1s, such as \"10s\""
        );
        assert_eq!(
            parse("xid = { 13 = \"drain\" }").unwrap_err(),
            "health.xid.13 \"drain\": expected \"ignore\", \"restart-app\", \"reset\" or \"reboot\""
        );
        assert_eq!(
            parse("xid = { x = \"reset\" }").unwrap_err(),
            "health.xid key \"x\": expected an XID number, such as 79"
        );
    }
}
