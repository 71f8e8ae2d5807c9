//! How gpupin words an error for people: the whole chain on one line, because runtimes
//! fold a hook's stderr into their own one-line message.

use std::error::Error;
use std::fmt::Write;

/// `outer: inner: innermost`, with every control character escaped (`\n`, `\u{1b}`), so
/// that text a container chose (an annotation key, a label) can neither start a second
/// line nor steer a terminal, whatever message it ends up in.
/// A source whose text its outer message already ends with (libraries that print their
/// cause in their own message, as nvml-wrapper and libloading do) is said once.
pub fn one_line(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let said = inner.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = inner.source();
    }
    escape_controls(&text)
}

/// C0, DEL and C1 (`char::is_control`), and the Unicode line and paragraph separators,
/// which some terminals and log viewers also break lines at.
pub fn escape_controls(text: &str) -> String {
    controls_escaped(text).into_owned()
}

/// `escape_controls`, borrowing `text` where it has nothing to escape (nearly always): a
/// table of hundreds of thousands of rows allocates nothing for them.
pub(crate) fn controls_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    let breaks_line = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    if !text.contains(breaks_line) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if breaks_line(c) {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether `text` is one line someone may read in a log or a terminal: not blank, at most
/// `max` characters, no control character, nothing that reorders what a terminal shows
/// after it (Trojan Source). For the reasons people give (`--reason`).
pub(crate) fn is_one_short_line(text: &str, max: usize) -> bool {
    !text.trim().is_empty()
        && text.chars().count() <= max
        && !text.chars().any(|c| c.is_control() || is_bidi(c))
}

/// A character that reorders what a terminal shows after it.
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {0}")]
    struct Outer(&'static str, #[source] std::io::Error);

    #[test]
    fn joins_the_chain_on_one_line() {
        let err = Outer("/x", std::io::Error::other("no such file"));
        assert_eq!(one_line(&err), "reading /x: no such file");
    }

    #[test]
    fn control_characters_anywhere_in_the_chain_are_escaped() {
        let err = Outer(
            "a\nb\rc\td\u{1b}[31me\u{7f}f",
            std::io::Error::other("g\u{85}h\u{2028}i\nj"),
        );
        let line = one_line(&err);
        assert_eq!(
            line,
            r"reading a\nb\rc\td\u{1b}[31me\u{7f}f: g\u{85}h\u{2028}i\nj"
        );
        assert!(!line.contains(|c: char| c.is_control()), "{line}");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot load: {0}")]
    struct SaysItsCause(#[source] std::io::Error);

    #[test]
    fn a_cause_the_message_already_says_is_said_once() {
        let err = Outer("/x", std::io::Error::other("gone"));
        assert_eq!(one_line(&err), "reading /x: gone");
        let err = SaysItsCause(std::io::Error::other("libnvidia-ml.so.1: no such file"));
        assert_eq!(
            one_line(&err),
            "cannot load: libnvidia-ml.so.1: no such file"
        );
    }

    #[test]
    fn other_text_is_kept_as_it_is() {
        let err = Outer("/données/ü \"x\" \\n", std::io::Error::other("GPU-ä"));
        assert_eq!(one_line(&err), "reading /données/ü \"x\" \\n: GPU-ä");
    }
}
