//! docs/reference.md says what the program does: its configuration table has a row for
//! every key the config file takes (and no other), each default as `gpupin config check`
//! prints it for an empty file, and its table of simulated machines lists every `sim:`
//! name the code knows. Both are read from the code, so the docs cannot drift again.
//! tests/README.md, the map of the suites, names every one of them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn reference() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the first table after `heading` in docs/reference.md: each row's cells,
/// the first with its backticks removed.
fn table_after(text: &str, heading: &str) -> Vec<Vec<String>> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in docs/reference.md"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            row.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_string())
                .collect()
        })
        .collect()
}

/// The keys serde takes at the top of the config file, as its own error lists them.
fn config_keys() -> BTreeSet<String> {
    let error = toml::from_str::<gpupin::parts::Config>("gpupin_no_such_key = 0")
        .expect_err("an unknown key is refused");
    let message = error.message().to_string();
    let (_, expected) = message
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("serde's message changed: {message}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `gpupin config check` on an empty file: every key with its default, as TOML.
fn defaults() -> toml::Table {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("empty.toml");
    std::fs::write(&file, "").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpupin"))
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().parse().unwrap()
}

fn unquoted(text: &str) -> String {
    text.replace(['`', '"'], "")
}

#[test]
fn the_references_config_table_has_every_key_and_its_default() {
    let rows = table_after(&reference(), "## Configuration");
    let documented: BTreeSet<String> = rows
        .iter()
        .map(|row| unquoted(&row[0]).trim_matches(['[', ']']).to_string())
        .collect();
    let keys = config_keys();
    let missing: Vec<&String> = keys.difference(&documented).collect();
    let unknown: Vec<&String> = documented.difference(&keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/reference.md's config table lacks {missing:?} and has keys the config does not take: {unknown:?}"
    );
    // Each scalar default as gpupin uses it; `socket` is derived from state_dir.
    let mut wrong = Vec::new();
    for (key, value) in defaults() {
        if key == "socket" || value.is_table() {
            continue;
        }
        let row = rows
            .iter()
            .find(|row| unquoted(&row[0]) == key)
            .expect("checked above");
        let shown = unquoted(&value.to_string()).replace(", ", ",");
        if !unquoted(&row[1]).replace(", ", ",").contains(&shown) {
            wrong.push(format!(
                "{key}: the reference says {}, gpupin uses {value}",
                row[1]
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_references_simulated_machines_are_the_ones_the_code_has() {
    let config = Path::new("/nonexistent/gpupin.toml");
    let error = gpupin::parts::Config::parse("inventory = \"sim:gpupin-no-such\"", config)
        .expect_err("an unknown machine is refused")
        .to_string();
    let (_, names) = error
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("the message changed: {error}"));
    let known: BTreeSet<String> = names.split(", ").map(str::to_string).collect();
    let documented: BTreeSet<String> = table_after(&reference(), "### Built-in simulated machines")
        .iter()
        .map(|row| unquoted(&row[0]))
        .collect();
    assert_eq!(
        documented, known,
        "docs/reference.md's sim table and sim::names()"
    );
}

/// tests/README.md maps every suite: a new file under tests/ must be placed on it.
#[test]
fn the_tests_map_names_every_suite() {
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    let map = std::fs::read_to_string(tests.join("README.md")).unwrap();
    let unnamed: Vec<String> = std::fs::read_dir(&tests)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".rs"))
        .filter(|name| !map.contains(&format!("`{name}`")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "tests/README.md does not name {unnamed:?}: add each to the row of the feature it shows"
    );
}
