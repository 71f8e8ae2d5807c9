//! How gpupin words an error for people: the whole chain on one line, because runtimes
//! fold a hook's stderr into their own one-line message.

use std::error::Error;

/// `outer: inner: innermost`.
pub fn one_line(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
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
}
