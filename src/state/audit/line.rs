//! An audit line read into an `Event`, key by key. `Event` writes its container's keys
//! (`engine`, `name`, `image`) flattened into the line; serde's `flatten` on the way in
//! reads the line as a map, buffers the keys it does not name itself and copies their
//! strings, and a year of audit (750,000 lines, read whole by `gpupin usage`, `log` and
//! `metrics`) paid for it on every line. `Wire` names the same keys as plain fields with
//! the same defaults, and is read only from a JSON object as before (a derived struct
//! would also take an array of its fields in order), so a line reads as the same event,
//! or fails alike, either way (the tests below compare the two on odd lines).

use super::{Event, EventKind, GpuRef};
use crate::input::request::GpuRequest;
use crate::model::holder::{ContainerInfo, HolderKind};
use serde::de::{Deserialize, Deserializer, Visitor};
use std::collections::BTreeMap;

/// The keys of a line, as `Event` writes them.
#[derive(serde::Deserialize)]
struct Wire {
    time: String,
    event: EventKind,
    holder: String,
    #[serde(default)]
    kind: Option<HolderKind>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    engine: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    gpus: Vec<GpuRef>,
    #[serde(default)]
    request: Option<GpuRequest>,
    #[serde(default)]
    pid: Option<i32>,
    #[serde(default)]
    within: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    held_s: Option<u64>,
    #[serde(default)]
    suppressed: BTreeMap<String, u64>,
    #[serde(default)]
    truncated: bool,
}

impl From<Wire> for Event {
    fn from(w: Wire) -> Event {
        Event {
            time: w.time,
            event: w.event,
            holder: w.holder,
            kind: w.kind,
            user: w.user,
            uid: w.uid,
            container: ContainerInfo {
                engine: w.engine,
                name: w.name,
                image: w.image,
            },
            gpus: w.gpus,
            request: w.request,
            pid: w.pid,
            within: w.within,
            reason: w.reason,
            code: w.code,
            held_s: w.held_s,
            suppressed: w.suppressed,
            truncated: w.truncated,
        }
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Event, D::Error> {
        Wire::deserialize(ObjectOnly(deserializer)).map(Event::from)
    }
}

/// A deserializer that reads whatever is asked of it as a map: a struct from a JSON
/// object only, never from an array, as a struct with a flattened field was read.
struct ObjectOnly<D>(D);

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Event` as it was read before: the derive, with the container flattened.
    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Flattened {
        time: String,
        event: EventKind,
        holder: String,
        #[serde(default)]
        kind: Option<HolderKind>,
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        uid: Option<u32>,
        #[serde(flatten)]
        container: ContainerInfo,
        #[serde(default)]
        gpus: Vec<GpuRef>,
        #[serde(default)]
        request: Option<GpuRequest>,
        #[serde(default)]
        pid: Option<i32>,
        #[serde(default)]
        within: Option<String>,
        #[serde(default)]
        reason: Option<String>,
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        held_s: Option<u64>,
        #[serde(default)]
        suppressed: BTreeMap<String, u64>,
        #[serde(default)]
        truncated: bool,
    }

    impl From<Flattened> for Event {
        fn from(f: Flattened) -> Event {
            Event {
                time: f.time,
                event: f.event,
                holder: f.holder,
                kind: f.kind,
                user: f.user,
                uid: f.uid,
                container: f.container,
                gpus: f.gpus,
                request: f.request,
                pid: f.pid,
                within: f.within,
                reason: f.reason,
                code: f.code,
                held_s: f.held_s,
                suppressed: f.suppressed,
                truncated: f.truncated,
            }
        }
    }

    #[test]
    fn a_line_reads_as_the_flattened_derive_read_it_or_fails_alike() {
        let base = r#""time":"2024-05-01T12:00:00Z","event":"release","holder":"h""#;
        let lines = [
            format!("{{{base}}}"),
            format!(
                r#"{{{base},"engine":"docker","name":"web","image":"x","user":"alice","uid":7,"held_s":5}}"#
            ),
            format!(r#"{{{base},"engine":null,"name":"n","later":{{"a":[1,2]}},"container":1}}"#),
            format!(r#"{{{base},"engine":5}}"#),
            format!(r#"{{{base},"engine":"a","engine":"b"}}"#),
            format!(r#"{{{base},"time":"again"}}"#),
            format!(r#"{{{base},"uid":-1}}"#),
            format!(r#"{{{base},"held_s":1.5}}"#),
            format!(r#"{{{base},"pid":"42"}}"#),
            format!(
                r#"{{{base},"gpus":[{{"index":1,"uuid":"GPU-1"}}],"suppressed":{{"limit":3}}}}"#
            ),
            format!(
                r#"{{{base},"truncated":true,"kind":"hold","within":"w","code":"c","reason":"r"}}"#
            ),
            format!(r#"{{{base},"kind":"spaceship"}}"#),
            format!(r#"{{{base},"name":"\u0061\"b"}}"#),
            r#"{"time":"2024-05-01T12:00:00Z","event":"release"}"#.to_string(),
            r#"["2024-05-01T12:00:00Z","release","h"]"#.to_string(),
            r#"{"time":"2024-05-01T12:00:00Z","event":"explode","holder":"h"}"#.to_string(),
            "null".to_string(),
            "{}".to_string(),
            "{".to_string(),
        ];
        for line in &lines {
            let now: Result<Event, _> = serde_json::from_str(line);
            let before: Result<Event, _> = serde_json::from_str::<Flattened>(line).map(Event::from);
            assert_eq!(now.is_ok(), before.is_ok(), "{line}: {now:?} / {before:?}");
            if let (Ok(now), Ok(before)) = (now, before) {
                assert_eq!(now, before, "{line}");
            }
        }
    }
}
