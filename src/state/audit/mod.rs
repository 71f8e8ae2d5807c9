//! The audit trail: one JSON object a line for every allocation, binding, release, reap,
//! refusal and hold, in a file that survives a reboot (`audit_log`, default
//! /var/log/gpupin/audit.log), capped in size and rotated (`write`). It is the machine's
//! history of who used which GPU when; the ledger only knows who holds one now.
//! `read` takes the events back (`gpupin log`), `usage` sums GPU-hours from them and the
//! ledger's live records (`gpupin usage`); the report layer renders both for people.

mod filter;
mod line;
mod prefilter;
mod read;
mod tail;
mod write;

pub(crate) use filter::BadValue;
pub use filter::{Filter, GpuSelector, When, parse_user};
pub(crate) use prefilter::{Needle, before, escaped};
pub use read::Entry;
pub(crate) use read::{Lines, ReadError, Wanted, open_log_with_stat, wanted};
pub use write::REFUSALS_PER_MINUTE;
pub(crate) use write::WriteError;

use crate::input::request::{GpuRequest, Selection};
use crate::model::holder::{ContainerInfo, HolderKind, Owner};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// GPUs given to a container or an exec'd job.
    Allocate,
    /// GPUs set aside by `gpupin hold`.
    Hold,
    /// A holder's GPUs bound to its process (a claim made before create, an exec'd job).
    Bind,
    /// GPUs given back: the container stopped, the job ended, `gpupin release`.
    Release,
    /// A holder whose process was gone, removed by the next allocation or `gpupin gc`.
    Reap,
    /// A request that got nothing, and why.
    Refuse,
    /// An entry of the ledger that could be nobody's record, removed.
    Clear,
    /// A running holder stopped by an operator (`gpupin evict`); its release follows.
    Evict,
    /// A holder whose GPUs stayed under `idle_utilization` for `idle_after`, found by
    /// `gpupin serve`: once per holder (an idle hold's release under `idle_action =
    /// "release-holds"` follows as a `release` that says why).
    Idle,
    /// A GPU taken out of allocation (`gpupin drain`; later, its health): `code` says
    /// how (`drained`, `needs-reset`, `needs-reboot`), `reason` why, `user` who.
    Drain,
    /// A GPU put back into allocation (`gpupin undrain`, or its health once a reset
    /// cleared what fenced it): `reason` says what it was.
    Undrain,
    /// A GPU health event that fenced nothing (an XID whose action is to restart the
    /// application, or one on a GPU fenced already): `code` says the action, `reason`
    /// the event.
    Health,
}

impl EventKind {
    /// The name the log writes.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Allocate => "allocate",
            EventKind::Hold => "hold",
            EventKind::Bind => "bind",
            EventKind::Release => "release",
            EventKind::Reap => "reap",
            EventKind::Refuse => "refuse",
            EventKind::Clear => "clear",
            EventKind::Evict => "evict",
            EventKind::Idle => "idle",
            EventKind::Drain => "drain",
            EventKind::Undrain => "undrain",
            EventKind::Health => "health",
        }
    }
}

/// One GPU as people name it (the index) and as the ledger keys it (the UUID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub uuid: String,
}

/// A unit as `log` and `usage` name it: a GPU by its index (else its UUID), a MIG
/// instance by its GPU's index and its own UUID (`0:MIG-...`), under its parent.
pub(crate) fn unit_name(index: Option<u32>, uuid: &str) -> String {
    match (index, uuid.starts_with("MIG-")) {
        (Some(i), true) => format!("{i}:{uuid}"),
        (Some(i), false) => i.to_string(),
        (None, _) => uuid.to_string(),
    }
}

/// One line of the audit log. Every field but `time`, `event` and `holder` is left out
/// where it is not known. Read back by `line` (the same keys, without serde's flatten).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// RFC 3339, UTC, to the second.
    pub time: String,
    pub event: EventKind,
    pub holder: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<HolderKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// What the engine told about a container: its `engine`, `name` and `image` keys,
    /// flattened into the line where they always were (a line written before this field
    /// reads the same).
    #[serde(flatten)]
    pub container: ContainerInfo,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<GpuRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// The holder whose GPUs this one's were taken from (`gpupin.within`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
    /// Why a request was refused (`refuse`), or why an entry was cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The kind of refusal, a short fixed name (`not_enough_free`, `limit`, `not_yours`,
    /// ...), for counting (`gpupin metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// At `release` and `reap`: how long the GPUs were held, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_s: Option<u64>,
    /// A summary of refusals not written in full (`write`'s rate limit): how many, by
    /// `code`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub suppressed: BTreeMap<String, u64>,
    /// Some value was cut short to keep the line bounded (a refusal quotes what a
    /// container or a user sent).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// The longest value a refusal line keeps of a name, an id, an image.
pub(crate) const MAX_VALUE: usize = 256;
/// The longest reason a refusal line keeps (messages quote values, and are one line).
pub(crate) const MAX_REASON: usize = 1024;
/// The most named GPUs a refusal line keeps of a request, each at most `MAX_DEVICE` bytes
/// (a UUID is 40, a bus id 16): more than any machine has.
pub(crate) const MAX_DEVICES_LOGGED: usize = 64;
pub(crate) const MAX_DEVICE: usize = 64;

impl Event {
    /// An event about `holder` now, with nothing else known yet.
    pub fn new(event: EventKind, holder: &str) -> Event {
        Event {
            time: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            event,
            holder: holder.to_string(),
            kind: None,
            user: None,
            uid: None,
            container: ContainerInfo::default(),
            gpus: Vec::new(),
            request: None,
            pid: None,
            within: None,
            reason: None,
            code: None,
            held_s: None,
            suppressed: BTreeMap::new(),
            truncated: false,
        }
    }

    /// This event with every value a requester chose cut to a bounded length (`MAX_*`),
    /// and `truncated` set where something was cut: a refusal quotes what was asked, and
    /// what was asked may be anything a container or a user wrote.
    pub fn bounded(&self) -> Event {
        let mut e = self.clone();
        let mut cut = false;
        cut |= shorten(&mut e.holder, MAX_VALUE);
        for value in [
            &mut e.user,
            &mut e.container.engine,
            &mut e.container.name,
            &mut e.container.image,
            &mut e.within,
            &mut e.code,
        ]
        .into_iter()
        .flatten()
        {
            cut |= shorten(value, MAX_VALUE);
        }
        if let Some(reason) = &mut e.reason {
            cut |= shorten(reason, MAX_REASON);
        }
        if let Some(request) = &mut e.request {
            for value in [&mut request.model, &mut request.within]
                .into_iter()
                .flatten()
            {
                cut |= shorten(value, MAX_VALUE);
            }
            if let Selection::Devices(list) = &mut request.selection {
                if list.len() > MAX_DEVICES_LOGGED {
                    list.truncate(MAX_DEVICES_LOGGED);
                    cut = true;
                }
                for device in list.iter_mut() {
                    cut |= shorten(device, MAX_DEVICE);
                }
            }
        }
        e.gpus.truncate(MAX_DEVICES_LOGGED);
        e.truncated |= cut;
        e
    }

    /// An event about a holder that may have no record (a refused request): who it is.
    pub fn for_holder(
        event: EventKind,
        holder: &str,
        kind: HolderKind,
        owner: Option<&Owner>,
        container: Option<&ContainerInfo>,
    ) -> Event {
        Event {
            kind: Some(kind),
            user: owner.map(|o| o.user.clone()),
            uid: owner.map(|o| o.uid),
            container: container.cloned().unwrap_or_default(),
            ..Event::new(event, holder)
        }
    }

    pub fn because(mut self, reason: impl Into<String>) -> Event {
        self.reason = Some(reason.into());
        self
    }

    /// When it happened; `None` for a time the log cannot have written.
    pub fn at(&self) -> Option<std::time::SystemTime> {
        filter::parse_time(&self.time)
    }

    /// Whose it is, as `gpupin log` and `gpupin usage --by user` name them: the user, else
    /// (a container) the engine that started it, else `-`.
    /// How people know the event's holder, as `Record::shown_name` names a record: a
    /// container's name where its engine told it, else the id (an engine's long hex id
    /// cut to 12 characters).
    pub fn shown_holder(&self) -> &str {
        match &self.container.name {
            Some(name) => name,
            None => crate::model::holder::shown_id(&self.holder),
        }
    }

    pub fn who(&self) -> &str {
        who(self.user.as_deref(), self.container.engine.as_deref())
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary, marking the cut with
/// `...`; whether it cut.
fn shorten(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("...");
    true
}

/// See `Event::who`; for a ledger record, `usage` asks the same of its owner and container.
/// A container that no engine named (plain runc, a runtime gpupin does not know) is
/// `(no engine)`, not a bare `-` that `gpupin usage` would list unexplained.
pub(crate) fn who<'a>(user: Option<&'a str>, engine: Option<&'a str>) -> &'a str {
    user.or(engine).unwrap_or(NO_ENGINE)
}

/// Whom `who` names when neither a user nor an engine is known.
pub(crate) const NO_ENGINE: &str = "(no engine)";

#[cfg(test)]
mod tests {
    use super::*;

    /// A full line as gpupin wrote it when `Event` spelt out `engine`, `name` and `image`.
    const OLD_LINE: &str = r#"{"time":"2024-05-01T12:00:00Z","event":"allocate","holder":"c1","kind":"container","user":"alice","uid":1000,"engine":"docker","name":"train","image":"pytorch:24","gpus":[{"index":3,"uuid":"GPU-a"}],"request":{"selection":{"count":2},"policy":"pack","memory":2147483648,"model":"H100","share":"shared","reserve":1073741824,"wait":{"secs":90,"nanos":0},"cpus":"numa","within":"res-7","origin":"annotations"},"pid":42,"within":"res-7","reason":"why","code":"limit","held_s":5,"suppressed":{"limit":3},"truncated":true}"#;

    #[test]
    fn an_old_line_reads_the_same_and_a_new_line_is_written_byte_for_byte_as_before() {
        let event: Event = serde_json::from_str(OLD_LINE).unwrap();
        assert_eq!(
            event.container,
            ContainerInfo {
                engine: Some("docker".into()),
                name: Some("train".into()),
                image: Some("pytorch:24".into()),
            }
        );
        assert_eq!(event.who(), "alice");
        assert_eq!(event.gpus.len(), 1);
        assert_eq!(event.held_s, Some(5));
        assert!(event.request.is_some() && event.truncated);
        assert_eq!(serde_json::to_string(&event).unwrap(), OLD_LINE);
        // Without a container: no key of it, and the line reads back without one.
        let line = r#"{"time":"2024-05-01T12:00:00Z","event":"release","holder":"h1","uid":0}"#;
        let event: Event = serde_json::from_str(line).unwrap();
        assert_eq!(event.container, ContainerInfo::default());
        assert_eq!(serde_json::to_string(&event).unwrap(), line);
    }
}
