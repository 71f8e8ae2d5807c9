//! `[serve]` in the config: the bounds that keep `gpupin serve` answering under load.
//!
//! ```toml
//! [serve]
//! max_connections = 128            # open connections, all users together (root aside)
//! max_connections_per_user = 8     # open connections of one user
//! max_watched_per_user = 64        # holders of one user with a process the daemon watches
//! request_timeout = "30s"          # a whole request, from connect to its last byte
//! ```

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeSettings {
    pub max_connections: u32,
    pub max_connections_per_user: u32,
    pub max_watched_per_user: u32,
    pub request_timeout: Duration,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            max_connections: 128,
            max_connections_per_user: 8,
            max_watched_per_user: 64,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// `[serve]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServeFile {
    max_connections: Option<u32>,
    max_connections_per_user: Option<u32>,
    max_watched_per_user: Option<u32>,
    request_timeout: Option<String>,
}

impl ServeFile {
    /// The settings, or one line naming the bad value.
    pub(super) fn settings(self) -> Result<ServeSettings, String> {
        let mut s = ServeSettings::default();
        let at_least_one = |key: &str, v: Option<u32>, into: &mut u32| match v {
            Some(0) => Err(format!("serve.{key} 0: expected at least 1")),
            Some(n) => {
                *into = n;
                Ok(())
            }
            None => Ok(()),
        };
        at_least_one(
            "max_connections",
            self.max_connections,
            &mut s.max_connections,
        )?;
        at_least_one(
            "max_connections_per_user",
            self.max_connections_per_user,
            &mut s.max_connections_per_user,
        )?;
        at_least_one(
            "max_watched_per_user",
            self.max_watched_per_user,
            &mut s.max_watched_per_user,
        )?;
        if let Some(t) = self.request_timeout {
            s.request_timeout = match humantime::parse_duration(&t) {
                Ok(d) if d >= Duration::from_secs(1) => d,
                _ => {
                    return Err(format!(
                        "serve.request_timeout {t:?}: expected a duration of at least 1s, such as \"30s\""
                    ));
                }
            };
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeSettings, String> {
        toml::from_str::<ServeFile>(text).unwrap().settings()
    }

    #[test]
    fn what_is_written_is_what_serve_uses_and_a_short_request_timeout_is_refused() {
        let s = parse(
            "max_connections = 16\nmax_connections_per_user = 2\nmax_watched_per_user = 5\nrequest_timeout = \"45s\"",
        )
        .unwrap();
        assert_eq!(
            s,
            ServeSettings {
                max_connections: 16,
                max_connections_per_user: 2,
                max_watched_per_user: 5,
                request_timeout: Duration::from_secs(45),
            }
        );
        assert_eq!(parse("").unwrap(), ServeSettings::default());
        assert_eq!(
            parse("request_timeout = \"1s\"").unwrap().request_timeout,
            Duration::from_secs(1)
        );
        // Under a second, a caller on a busy node could not send its request in time.
        assert_eq!(
            parse("request_timeout = \"999ms\"").unwrap_err(),
            "serve.request_timeout \"999ms\": expected a duration of at least 1s, such as \"30s\""
        );
    }
}
