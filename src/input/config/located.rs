//! A config error as an admin fixes it: where (`path:line`, the `[table]` it is in) and
//! what, with the key meant when a key is misspelt or sits in the wrong table ("did you
//! mean"). toml gives the byte span and serde's message; the rest is read from the text.

use super::Config;

/// `line 7 in [limits]: unknown key "polcy"; did you mean the top-level "policy"? ...`,
/// for an error of `toml::from_str` on `text`.
pub(super) fn explain(text: &str, error: &toml::de::Error) -> String {
    let message = super::one_line(error.message());
    let Some(span) = error.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let line = text[..start].matches('\n').count() + 1;
    let table = table_at(text, start);
    let place = match &table {
        Some(table) => format!("line {line} in [{table}]"),
        None => format!("line {line}"),
    };
    let what = match unknown_field(&message) {
        Some((key, expected)) => unknown_key(&key, &expected, table.as_deref()),
        None => not_a_whole_number(&message, line_at(text, start)).unwrap_or(message),
    };
    format!("{place}: {what}")
}

/// The line that holds byte `at`, whole.
fn line_at(text: &str, at: usize) -> &str {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    &text[start..end]
}

/// serde's "invalid type: string \"two\", expected u32" for `key = value` on `line`, as
/// an admin reads it: the key and value as written, and that a whole number is meant
/// (of GPUs, for the keys that count GPUs).
fn not_a_whole_number(message: &str, line: &str) -> Option<String> {
    let expected = message.rsplit_once(", expected ")?.1;
    if !message.starts_with("invalid type: ")
        || !["u8", "u16", "u32", "u64", "usize"].contains(&expected)
    {
        return None;
    }
    let (key, value) = line.split_once('=')?;
    let (key, value) = (key.trim(), value.trim());
    let unit = if key.contains("gpus") { " of GPUs" } else { "" };
    Some(format!(
        "{key} = {value} is not a whole number: expected a whole number{unit}, such as {key} = 2"
    ))
}

/// The `[table]` (or `[[table]]`) header last opened before byte `at`, or on its line:
/// toml points an error in a dotted header (`[limits.user.alice]`) inside the header.
fn table_at(text: &str, at: usize) -> Option<String> {
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    text[..end]
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let inner = line.strip_prefix('[')?.split(']').next()?;
            Some(inner.trim_start_matches('[').trim().to_string())
        })
        .next_back()
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (or "expected `a`"): the key and
/// the keys its table has.
fn unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    let expected = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((key.to_string(), expected))
}

fn unknown_key(key: &str, expected: &[String], table: Option<&str>) -> String {
    if let Some(meant) = closest(key, expected) {
        return format!("unknown key {key:?}; did you mean {meant:?}?");
    }
    if let Some(table) = table
        && let Some(meant) = closest(key, &top_level_keys())
    {
        return format!(
            "unknown key {key:?} in [{table}]; did you mean the top-level {meant:?}? Top-level keys go above the first [table]"
        );
    }
    match table {
        Some(table) => format!(
            "unknown key {key:?} in [{table}], whose keys are {}",
            expected.join(", ")
        ),
        None => {
            format!(
                "unknown key {key:?}; the keys are listed in docs/reference.md, section Configuration"
            )
        }
    }
}

/// The keys of the file's top level, as serde names them when one is unknown.
fn top_level_keys() -> Vec<String> {
    match toml::from_str::<Config>("gpupin_no_such_key = 0") {
        Err(e) => unknown_field(e.message())
            .map(|(_, keys)| keys)
            .unwrap_or_default(),
        Ok(_) => Vec::new(),
    }
}

/// The key of `keys` nearest to `key`, if near enough to be a typo: at most a third of
/// its letters off (at least one).
fn closest(key: &str, keys: &[String]) -> Option<String> {
    let limit = (key.chars().count() / 3).max(1);
    keys.iter()
        .map(|k| (distance(key, k), k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.clone())
}

/// Edit distance (insertions, deletions, substitutions, adjacent swaps).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explained(text: &str) -> String {
        let error = toml::from_str::<Config>(text).unwrap_err();
        explain(text, &error)
    }

    #[test]
    fn a_typo_in_a_dotted_table_names_the_table_as_written() {
        let text = "inventory = \"sim:nvswitch8\"\n[limits.user.alice]\nmax_gpus = 2\n";
        assert_eq!(
            explained(text),
            "line 2 in [limits.user.alice]: unknown key \"user\"; did you mean \"users\"?"
        );
    }

    #[test]
    fn a_count_of_gpus_written_as_a_word_asks_for_a_whole_number_of_gpus() {
        let text = "[limits]\nmax_gpus_per_user = \"two\"\n";
        assert_eq!(
            explained(text),
            "line 2 in [limits]: max_gpus_per_user = \"two\" is not a whole number: expected a whole number of GPUs, such as max_gpus_per_user = 2"
        );
        let text = "[limits.users.alice]\nmax_gpus = 1.5\n";
        assert_eq!(
            explained(text),
            "line 2 in [limits.users.alice]: max_gpus = 1.5 is not a whole number: expected a whole number of GPUs, such as max_gpus = 2"
        );
    }

    #[test]
    fn a_key_in_the_wrong_table_points_to_the_top_level() {
        let text =
            "inventory = \"sim:nvswitch8\"\n\n[limits]\nmax_gpus_per_user = 2\npolcy = \"pack\"\n";
        assert_eq!(
            explained(text),
            "line 5 in [limits]: unknown key \"polcy\" in [limits]; did you mean the top-level \"policy\"? Top-level keys go above the first [table]"
        );
    }

    #[test]
    fn a_typo_gets_the_key_meant_and_its_line() {
        assert_eq!(
            explained("state_dir = \"/run/gpupin\"\npolcy = \"pack\"\n"),
            "line 2: unknown key \"polcy\"; did you mean \"policy\"?"
        );
        assert_eq!(
            explained("[limits]\nmax_gpu_per_user = 2\n"),
            "line 2 in [limits]: unknown key \"max_gpu_per_user\"; did you mean \"max_gpus_per_user\"?"
        );
    }

    #[test]
    fn a_key_far_from_any_lists_the_tables_keys() {
        let text = "[limits]\nzebra = 1\n";
        let got = explained(text);
        assert!(
            got.starts_with("line 2 in [limits]: unknown key \"zebra\" in [limits], whose keys are max_gpus_per_user"),
            "{got}"
        );
        assert_eq!(
            explained("zebra = 1\n"),
            "line 1: unknown key \"zebra\"; the keys are listed in docs/reference.md, section Configuration"
        );
    }

    #[test]
    fn a_syntax_error_gets_its_line() {
        let got = explained("state_dir = \"/run/gpupin\"\npolicy = pack\n");
        assert!(got.starts_with("line 2: "), "{got}");
        assert!(!got.contains('\n'), "{got}");
    }

    #[test]
    fn distance_counts_typos() {
        assert_eq!(distance("polcy", "policy"), 1);
        assert_eq!(distance("ploicy", "policy"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
        assert_eq!(closest("zebra", &["policy".into()]), None);
    }
}
