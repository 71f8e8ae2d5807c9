//! Which events a reader of the audit trail asks for: since when, whose, which GPU; and
//! the times people write (`2h`, `7d`, RFC 3339).

use super::Event;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A value a person gave that does not say what it should. Display: the value, then what
/// was expected; the caller puts the option's name in front (`invalid --since ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    #[error("{0:?}: expected a duration such as 2h or 7d, or an RFC 3339 time")]
    When(String),
    #[error("{0:?}: expected a GPU index such as 3 or a UUID such as GPU-5a1e...")]
    Gpu(String),
    #[error("{0:?}: expected a user name or uid")]
    User(String),
    #[error("{0:?}: expected user, holder or gpu")]
    By(String),
}

/// A point in time as given on a command line: so long before now, or a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Ago(Duration),
    At(SystemTime),
}

impl When {
    /// `2h`, `7d`, `1h30m` (humantime's units), or an RFC 3339 time with `Z` or an
    /// offset such as `+02:00`.
    pub fn parse(text: &str) -> Result<When, BadValue> {
        let text = text.trim();
        if let Ok(ago) = humantime::parse_duration(text) {
            return Ok(When::Ago(ago));
        }
        parse_time(text)
            .map(When::At)
            .ok_or_else(|| BadValue::When(text.to_string()))
    }

    /// The time this names, counted back from `now` where it is a duration.
    pub fn resolve(self, now: SystemTime) -> SystemTime {
        match self {
            When::At(at) => at,
            When::Ago(ago) => now
                .checked_sub(ago)
                .filter(|t| *t >= UNIX_EPOCH)
                .unwrap_or(UNIX_EPOCH),
        }
    }
}

/// An RFC 3339 time: `2024-05-01T12:00:00Z`, a space for the `T`, fractions of a second,
/// `Z` or an offset. A time without a zone is refused: it would be a guess. So is one
/// before 1970 or after 9999 (an offset can move a time past either), which RFC 3339 text
/// cannot show.
pub(super) fn parse_time(text: &str) -> Option<SystemTime> {
    with_zone(text).filter(|t| *t >= UNIX_EPOCH && *t < UNIX_EPOCH + END_OF_TEXT)
}

/// 10000-01-01T00:00:00Z: the first time four digits of year cannot write.
const END_OF_TEXT: Duration = Duration::from_secs(253_402_300_800);

fn with_zone(text: &str) -> Option<SystemTime> {
    if let Some(utc) = text.strip_suffix(['Z', 'z']) {
        return humantime::parse_rfc3339_weak(utc).ok();
    }
    // humantime reads UTC only: the offset is taken off here and applied after.
    let split = text
        .len()
        .checked_sub(6)
        .filter(|&i| text.is_char_boundary(i))?;
    let (local, offset) = text.split_at(split);
    let (sign, hhmm) = (offset.as_bytes()[0], &offset[1..]);
    let (hh, mm) = hhmm.split_once(':')?;
    if !matches!(sign, b'+' | b'-') || hh.len() != 2 || mm.len() != 2 {
        return None;
    }
    let (hh, mm): (u64, u64) = (hh.parse().ok()?, mm.parse().ok()?);
    if hh > 23 || mm > 59 {
        return None;
    }
    let local = humantime::parse_rfc3339_weak(local).ok()?;
    let offset = Duration::from_secs(hh * 3600 + mm * 60);
    // Local time is UTC plus the offset: UTC is local minus it.
    match sign {
        b'+' => local.checked_sub(offset),
        _ => local.checked_add(offset),
    }
}

/// One GPU as a person names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    Index(u32),
    Uuid(String),
}

impl GpuSelector {
    /// An index (`3`) or a UUID as NVIDIA writes them (`GPU-...`, `MIG-...`).
    pub fn parse(text: &str) -> Result<GpuSelector, BadValue> {
        let text = text.trim();
        if let Ok(index) = text.parse() {
            return Ok(GpuSelector::Index(index));
        }
        let prefix = text.get(..4).unwrap_or_default();
        if text.len() > 4
            && (prefix.eq_ignore_ascii_case("GPU-") || prefix.eq_ignore_ascii_case("MIG-"))
        {
            return Ok(GpuSelector::Uuid(text.to_string()));
        }
        Err(BadValue::Gpu(text.to_string()))
    }

    fn matches(&self, event: &Event) -> bool {
        event.gpus.iter().any(|g| match self {
            GpuSelector::Index(i) => g.index == Some(*i),
            GpuSelector::Uuid(u) => g.uuid.eq_ignore_ascii_case(u),
        })
    }
}

/// A user as a person names them: a name, or a uid. Containers, which have no user, go
/// by their engine's name (`docker`), as `gpupin usage --by user` lists them.
pub fn parse_user(text: &str) -> Result<String, BadValue> {
    let text = text.trim();
    if text.is_empty() || text.contains(char::is_whitespace) {
        return Err(BadValue::User(text.to_string()));
    }
    Ok(text.to_string())
}

/// What to keep; every part left `None` keeps everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Events at or after this time.
    pub since: Option<SystemTime>,
    /// Events of this user (`parse_user`).
    pub user: Option<String>,
    /// Events about this GPU.
    pub gpu: Option<GpuSelector>,
    /// Events of this holder, named as `gpupin status` and `gpupin log` show it: its id,
    /// a container's name, or a prefix of a container's id (4 hex digits or more).
    pub holder: Option<String>,
}

impl Filter {
    /// Whether `event`, which happened `at`, is one asked for.
    pub fn matches(&self, at: SystemTime, event: &Event) -> bool {
        self.since.is_none_or(|since| at >= since)
            && self.user.as_deref().is_none_or(|user| {
                event.who() == user || event.uid.is_some_and(|uid| uid.to_string() == user)
            })
            && self.gpu.as_ref().is_none_or(|gpu| gpu.matches(event))
            && self
                .holder
                .as_deref()
                .is_none_or(|holder| names_holder(holder, event))
    }
}

fn names_holder(given: &str, event: &Event) -> bool {
    let hex = given.len() >= 4
        && given
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    event.holder == given
        || event.container.name.as_deref() == Some(given)
        || (hex
            && event.kind == Some(crate::model::holder::HolderKind::Container)
            && event.holder.starts_with(given))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::audit::{EventKind, GpuRef};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn durations_and_times_with_a_zone_are_understood() {
        assert_eq!(When::parse("2h"), Ok(When::Ago(Duration::from_secs(7200))));
        assert_eq!(
            When::parse("7d"),
            Ok(When::Ago(Duration::from_secs(7 * 86400)))
        );
        assert_eq!(
            When::parse("1h30m"),
            Ok(When::Ago(Duration::from_secs(5400)))
        );
        // 2024-05-01T12:00:00Z is 1714564800.
        for same in [
            "2024-05-01T12:00:00Z",
            "2024-05-01 12:00:00Z",
            "2024-05-01T14:00:00+02:00",
            "2024-05-01T07:30:00-04:30",
            "2024-05-01T12:00:00.000Z",
        ] {
            assert_eq!(When::parse(same), Ok(When::At(at(1714564800))), "{same}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_what_was_expected() {
        for bad in [
            "yesterday",
            "",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2h ago",
            "-2h",
            "1970-01-01T00:00:00+01:00",
            "9999-12-31T23:00:00-02:00",
        ] {
            let err = When::parse(bad).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("{bad:?}: expected a duration such as 2h or 7d, or an RFC 3339 time")
            );
        }
        assert!(GpuSelector::parse("first").is_err());
        assert!(GpuSelector::parse("-1").is_err());
        assert!(parse_user("").is_err());
    }

    #[test]
    fn a_duration_counts_back_from_now() {
        let now = at(100_000);
        assert_eq!(When::parse("1h").unwrap().resolve(now), at(100_000 - 3600));
        assert_eq!(When::parse("100000d").unwrap().resolve(now), UNIX_EPOCH);
    }

    fn event(user: Option<&str>, uid: Option<u32>, engine: Option<&str>) -> Event {
        Event {
            user: user.map(String::from),
            uid,
            container: crate::model::holder::ContainerInfo {
                engine: engine.map(String::from),
                ..Default::default()
            },
            gpus: vec![GpuRef {
                index: Some(3),
                uuid: "GPU-aaaa".into(),
            }],
            ..Event::new(EventKind::Allocate, "h1")
        }
    }

    #[test]
    fn a_user_is_matched_by_name_or_uid_and_a_container_by_its_engine() {
        let alice = event(Some("alice"), Some(1000), None);
        let docker = event(None, None, Some("docker"));
        let user = |u: &str| Filter {
            user: Some(u.into()),
            ..Filter::default()
        };
        assert!(user("alice").matches(at(0), &alice));
        assert!(user("1000").matches(at(0), &alice));
        assert!(!user("bob").matches(at(0), &alice));
        assert!(user("docker").matches(at(0), &docker));
        assert!(!user("docker").matches(at(0), &alice));
    }

    #[test]
    fn a_gpu_is_matched_by_index_or_uuid_in_any_case() {
        let e = event(None, None, None);
        let gpu = |g: &str| Filter {
            gpu: Some(GpuSelector::parse(g).unwrap()),
            ..Filter::default()
        };
        assert!(gpu("3").matches(at(0), &e));
        assert!(gpu("gpu-AAAA").matches(at(0), &e));
        assert!(!gpu("2").matches(at(0), &e));
        assert!(!gpu("GPU-bbbb").matches(at(0), &e));
    }

    #[test]
    fn since_keeps_events_at_or_after_it() {
        let e = event(None, None, None);
        let since = Filter {
            since: Some(at(50)),
            ..Filter::default()
        };
        assert!(!since.matches(at(49), &e));
        assert!(since.matches(at(50), &e));
    }

    #[test]
    fn a_holder_is_matched_by_id_name_or_a_containers_id_prefix() {
        let mut web = event(None, None, Some("docker"));
        web.holder = "3f2a1b2c3d4e5f60718293a4b5c6d7e8".into();
        web.kind = Some(crate::model::holder::HolderKind::Container);
        web.container.name = Some("web".into());
        let mut slurm = event(Some("alice"), Some(1000), None);
        slurm.holder = "slurm-421".into();
        slurm.kind = Some(crate::model::holder::HolderKind::Hold);
        let holder = |h: &str| Filter {
            holder: Some(h.into()),
            ..Filter::default()
        };
        assert!(holder("web").matches(at(0), &web));
        assert!(holder("3f2a1b2c3d4e").matches(at(0), &web));
        assert!(holder("3f2a1b2c3d4e5f60718293a4b5c6d7e8").matches(at(0), &web));
        assert!(!holder("3f2").matches(at(0), &web));
        assert!(!holder("db").matches(at(0), &web));
        assert!(holder("slurm-421").matches(at(0), &slurm));
        assert!(
            !holder("slurm-42").matches(at(0), &slurm),
            "a prefix of a hold is another job"
        );
    }
}
