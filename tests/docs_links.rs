//! The documentation holds together: every relative link in README.md and docs/*.md names
//! a file that exists and, with `#anchor`, a heading of that page (GitHub's anchor rule),
//! and the README stays an admin's ten minutes.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// About ten minutes of reading at an admin's pace: what the README promises.
const README_MAX_WORDS: usize = 3_000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, as (path, text).
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
            (path, text)
        })
        .collect()
}

/// The lines of a page outside fenced code blocks, with their numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// A line with its inline code spans taken out: `[x](y)` inside backticks is no link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        match c {
            '`' => in_code = !in_code,
            _ if !in_code => out.push(c),
            _ => {}
        }
    }
    out
}

/// GitHub's anchor for a heading: lowercase, punctuation but `-` and `_` dropped, each
/// space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            _ if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings; a repeated heading gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// The targets of the inline links `[text](target)` of a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                // `[text](target "title")`: the target is the first word.
                let target = after[..end].split_whitespace().next().unwrap_or("");
                targets.push(target.to_string());
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    targets
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// Every broken relative link of every page, one line each: page, line, target, why.
fn broken_links() -> Vec<String> {
    let pages = pages();
    let mut anchors_of: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    for (path, text) in &pages {
        anchors_of.insert(canonical(path), anchors(text));
    }
    let mut broken = Vec::new();
    for (path, text) in &pages {
        let dir = path.parent().expect("a page's directory");
        for (number, line) in prose_lines(text) {
            for target in link_targets(&without_code_spans(line)) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                let (file, anchor) = match target.split_once('#') {
                    Some((file, anchor)) => (file, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let shown = format!(
                    "{}:{number}: ({target})",
                    path.strip_prefix(root()).unwrap_or(path).display()
                );
                let linked = match file {
                    "" => path.clone(),
                    _ => dir.join(file),
                };
                if !linked.exists() {
                    broken.push(format!("{shown}: no file {}", linked.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let linked_anchors = match anchors_of.get(&canonical(&linked)) {
                    Some(anchors) => anchors.clone(),
                    // A page outside README.md and docs/ (hooks/README.md, say).
                    None => match std::fs::read_to_string(&linked) {
                        Ok(text) => anchors(&text),
                        Err(err) => {
                            broken.push(format!("{shown}: reading {}: {err}", linked.display()));
                            continue;
                        }
                    },
                };
                if !linked_anchors.contains(anchor) {
                    broken.push(format!("{shown}: no heading with anchor #{anchor}"));
                }
            }
        }
    }
    broken
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

#[test]
fn every_relative_link_names_a_file_and_heading_that_exist() {
    let broken = broken_links();
    assert!(
        broken.is_empty(),
        "{} broken link(s) in README.md and docs/:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_readme_stays_ten_minutes_of_reading() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let words = text.split_whitespace().count();
    assert!(
        words < README_MAX_WORDS,
        "README.md has {words} words: it is the page an admin acts on in ten minutes \
         (under {README_MAX_WORDS} words); move the detail to docs/ and link it"
    );
}

#[test]
fn anchors_follow_githubs_rule() {
    assert_eq!(
        slug("`gpupin serve`: the daemon for users"),
        "gpupin-serve-the-daemon-for-users"
    );
    assert_eq!(
        slug("Requests in the environment: `--always`"),
        "requests-in-the-environment---always"
    );
    assert_eq!(
        slug("Beside NVIDIA's go-gpuallocator"),
        "beside-nvidias-go-gpuallocator"
    );
    assert_eq!(slug("The demo and the CI run"), "the-demo-and-the-ci-run");
    let repeated = anchors("# A\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n");
    let expected: HashSet<String> = ["a", "notes", "notes-1"].map(String::from).into();
    assert_eq!(repeated, expected);
    assert_eq!(
        link_targets("see [a](x.md#b) and [c](../d.md \"t\")"),
        ["x.md#b", "../d.md"]
    );
    assert!(link_targets(&without_code_spans("`[a](nowhere.md)`")).is_empty());
}
