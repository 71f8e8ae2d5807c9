//! Which raw lines of the log could hold an event a reader wants, told from the bytes
//! before the line is parsed: a year of a busy box is 750,000 lines, and a reader that
//! wants one holder's, or the ends of holdings, parses the few that could be and skips
//! the rest at the speed of a substring search.
//!
//! Every test here only ever says "could be" of a line the full parse would keep: a
//! value's text is in the line as written unless JSON escapes it, so a line with a
//! backslash anywhere is always parsed; gpupin writes the time first and once
//! (`{"time":"...`), and a line that does not start so is judged by its parse.

use super::filter::parse_time;
use memchr::memmem;
use std::time::SystemTime;

/// Whether `line` has an escape: then any text could be spelt in it, and only its parse
/// can tell.
pub(crate) fn escaped(line: &[u8]) -> bool {
    memchr::memchr(b'\\', line).is_some()
}

/// A text to look for in line after line, its searcher built once.
pub(crate) struct Needle(memmem::Finder<'static>);

impl Needle {
    pub(crate) fn new(text: &[u8]) -> Needle {
        Needle(memmem::Finder::new(text).into_owned())
    }

    /// Whether the text is in `line` as written.
    pub(crate) fn in_(&self, line: &[u8]) -> bool {
        self.0.find(line).is_some()
    }
}

/// `"time"`, the key every line starts with.
static TIME_KEY: std::sync::LazyLock<Needle> =
    std::sync::LazyLock::new(|| Needle::new(b"\"time\""));

/// The time of a line as gpupin writes it: `{"time":"<RFC 3339>"` first, and no other
/// `"time"` in the line (a key given twice is the parser's to settle). `None`: a line
/// written otherwise, whose time only its parse can tell.
pub(crate) fn time_of(line: &[u8]) -> Option<SystemTime> {
    let rest = line.strip_prefix(b"{\"time\":\"")?;
    let end = memchr::memchr(b'"', rest)?;
    // The first is at the start; a second would be after it.
    if TIME_KEY.in_(&line[b"{\"time\"".len()..]) {
        return None;
    }
    parse_time(std::str::from_utf8(&rest[..end]).ok()?)
}

/// Whether `line`, as written, is certainly of an event before `since`.
pub(crate) fn before(line: &[u8], since: SystemTime) -> bool {
    !escaped(line) && time_of(line).is_some_and(|at| at < since)
}

impl super::Filter {
    /// Whether a line could hold an event `matches` keeps: `false` only where its bytes
    /// rule that out (before `since`; without the holder's or the user's name anywhere).
    /// The GPU is left to the parse. Built once, asked of every line.
    pub fn line_test(&self) -> impl Fn(&[u8]) -> bool + 'static {
        let since = self.since;
        // A holder is named by its id, its container's name or a prefix of its id, and a
        // user by name, uid or engine (`-` for none): each is in the line as written.
        let names: Vec<Needle> = [&self.holder, &self.user]
            .into_iter()
            .flatten()
            .map(|given| Needle::new(given.as_bytes()))
            .collect();
        move |line: &[u8]| {
            escaped(line)
                || (!since.is_some_and(|since| before(line, since))
                    && names.iter().all(|name| name.in_(line)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::audit::{Event, EventKind, Filter};
    use proptest::prelude::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_time_is_read_only_where_gpupin_wrote_it_first_and_once() {
        let line = br#"{"time":"2024-05-01T12:00:00Z","event":"release","holder":"h"}"#;
        assert_eq!(time_of(line), Some(at(1_714_564_800)));
        assert!(before(line, at(1_714_564_801)) && !before(line, at(1_714_564_800)));
        let twice =
            br#"{"time":"2024-05-01T12:00:00Z","event":"release","time":"2030-01-01T00:00:00Z"}"#;
        assert_eq!(time_of(twice), None);
        let later = br#"{"event":"release","time":"2024-05-01T12:00:00Z"}"#;
        assert_eq!(time_of(later), None);
        let escaped_line = br#"{"time":"2024-05-01T12:00:00Z","holder":"a\"b"}"#;
        assert!(!before(escaped_line, at(1_714_564_801)));
    }

    fn event(holder: &str, name: Option<&str>, user: Option<&str>, secs: u64) -> Event {
        let mut event = Event::new(EventKind::Release, holder);
        event.time = humantime::format_rfc3339_seconds(at(secs)).to_string();
        event.container.name = name.map(str::to_string);
        event.user = user.map(str::to_string);
        event
    }

    proptest! {
        /// Whatever the names (quotes, backslashes, other scripts) and times, a line the
        /// full parse keeps is never ruled out by its bytes.
        #[test]
        fn a_line_the_filter_keeps_is_never_ruled_out(
            holder in "[a-f0-9\"\\\\é -]{1,14}",
            name in proptest::option::of("[a-z\"\\\\ü]{1,6}"),
            user in proptest::option::of("[a-z\"\\\\]{1,6}"),
            secs in 1_700_000_000u64..1_700_000_100,
            given in "[a-f0-9\"\\\\é -]{1,6}",
            since in 1_700_000_000u64..1_700_000_100,
        ) {
            let event = event(&holder, name.as_deref(), user.as_deref(), secs);
            let line = serde_json::to_string(&event).unwrap();
            let read: Event = serde_json::from_str(&line).unwrap();
            for filter in [
                Filter { holder: Some(given.clone()), ..Filter::default() },
                Filter { user: Some(given.clone()), ..Filter::default() },
                Filter { since: Some(at(since)), holder: Some(holder.clone()), ..Filter::default() },
            ] {
                if filter.matches(read.at().unwrap(), &read) {
                    prop_assert!(filter.line_test()(line.as_bytes()), "{filter:?} {line}");
                }
            }
        }
    }
}
