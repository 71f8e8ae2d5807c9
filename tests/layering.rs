//! The module graph stays a DAG a reader can see: no module depends, through any chain
//! of `crate::`, `super::` or re-exported paths, on a module that depends on it, at any
//! level of the tree (the library's layers and the modules inside each folder alike;
//! the `gpupin` binary's cli/ too). A parent and its own children are not a cycle: a
//! folder's mod.rs is its front door and its children may use what it re-exports.
//! The crate root's layers (src/lib.rs) and the ledger's rooms (src/state/ledger/mod.rs)
//! are also in order: each is declared bottom first, and uses only those declared before it.
//!
//! Read from the source text, without a compiler: comments, strings and `#[cfg(test)]`
//! items are left out (tests may reach anywhere), every path that starts at `crate`,
//! `super` or `self` (and a `use` of a child module by its bare name) is followed to
//! the module that defines it, re-exports included. Run alone: `cargo test --test
//! layering`; a failure names each cycle and a line that makes each of its edges.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;
/// A closed walk through a folder's modules: its edges, in order.
type Walk = Vec<(String, String)>;

/// One module file, as far as the graph needs it.
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
    /// The children in the order their `mod` lines come.
    declared: Vec<String>,
    /// Names a `use` brings into this module: the name and the absolute path it stands for.
    imports: BTreeMap<String, ModPath>,
    /// Every absolute path this module's code names, with its line.
    refs: Vec<(ModPath, usize, String)>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Punct(char),
}

/// Blanks out comments, string and char literals, keeping lines where they were.
fn strip_literals(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && matches!(c.get(i + 1), Some('"') | Some('#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                blank(&mut out, c[j]);
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime.
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Colons, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Leaves out every item under `#[cfg(test)]`; returns the names of test-only `mod x;`.
fn strip_test_items(toks: Vec<(Tok, usize)>) -> (Vec<(Tok, usize)>, BTreeSet<String>) {
    let is = |t: &[(Tok, usize)], i: usize, want: &[&str]| -> bool {
        want.iter().enumerate().all(|(k, w)| match t.get(i + k) {
            Some((Tok::Ident(s), _)) => s == w,
            Some((Tok::Punct(p), _)) => w.len() == 1 && w.starts_with(*p),
            _ => false,
        })
    };
    let mut out = Vec::with_capacity(toks.len());
    let mut test_mods = BTreeSet::new();
    let mut i = 0;
    while i < toks.len() {
        if is(&toks, i, &["#", "[", "cfg", "(", "test", ")", "]"]) {
            let mut j = i + 7;
            // The item: through its `;` or its block, whichever comes first.
            let mut depth = 0;
            let mut mod_name = None;
            while j < toks.len() {
                match &toks[j].0 {
                    Tok::Ident(s) if s == "mod" && depth == 0 => {
                        if let Some((Tok::Ident(n), _)) = toks.get(j + 1) {
                            mod_name = Some(n.clone());
                        }
                    }
                    Tok::Punct('{') | Tok::Punct('(') | Tok::Punct('[') => depth += 1,
                    Tok::Punct('}') | Tok::Punct(')') | Tok::Punct(']') => {
                        depth -= 1;
                        if depth == 0 && toks[j].0 == Tok::Punct('}') {
                            break;
                        }
                    }
                    Tok::Punct(';') if depth == 0 => {
                        if let Some(n) = mod_name.take() {
                            test_mods.insert(n);
                        }
                        break;
                    }
                    _ => {}
                }
                j += 1;
            }
            i = j + 1;
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    (out, test_mods)
}

/// A `use` tree from `i` (just after `use`): every leaf's path (relative, as written)
/// and the name it binds (None for a glob or `_`).
fn use_tree(
    t: &[(Tok, usize)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(ModPath, Option<String>)>,
) {
    let mut segs = prefix.to_vec();
    loop {
        match t.get(*i).map(|x| &x.0) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                *i += 1;
                if t.get(*i).map(|x| &x.0) == Some(&Tok::Colons) {
                    *i += 1;
                    continue;
                }
                let mut name = Some(s.clone());
                if let Some((Tok::Ident(a), _)) = t.get(*i)
                    && a == "as"
                {
                    name = match t.get(*i + 1) {
                        Some((Tok::Ident(n), _)) if n != "_" => Some(n.clone()),
                        _ => None,
                    };
                    *i += 2;
                }
                if name.as_deref() == Some("self") {
                    segs.pop();
                    name = segs.last().cloned();
                }
                out.push((segs, name));
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match t.get(*i).map(|x| &x.0) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return,
                        _ => use_tree(t, i, &segs, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push((segs, None));
                return;
            }
            _ => return,
        }
    }
}

/// Where a path written in module `at` starts: `crate`, `super`, `self`, or (in a `use`)
/// a child module of `at` by its bare name. None for another crate's path.
fn absolute(at: &ModPath, rel: &[String], children: &BTreeSet<String>) -> Option<ModPath> {
    let mut base = at.clone();
    let mut rest = rel;
    match rel.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rel[1..];
        }
        Some("self") => rest = &rel[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) if children.contains(first) => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

fn load(root_file: &Path) -> BTreeMap<ModPath, Module> {
    let mut modules = BTreeMap::new();
    let mut todo = vec![(Vec::new(), root_file.to_path_buf())];
    while let Some((path, file)) = todo.pop() {
        let src = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (toks, test_mods) = strip_test_items(tokens(&strip_literals(&src)));
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        let mut children = BTreeSet::new();
        let mut declared = Vec::new();
        for w in toks.windows(3) {
            if let [
                (Tok::Ident(m), _),
                (Tok::Ident(name), _),
                (Tok::Punct(';'), _),
            ] = w
                && m == "mod"
                && !test_mods.contains(name)
            {
                children.insert(name.clone());
                declared.push(name.clone());
                let single = dir.join(format!("{name}.rs"));
                let child = if single.exists() {
                    single
                } else {
                    dir.join(name).join("mod.rs")
                };
                let mut child_path = path.clone();
                child_path.push(name.clone());
                todo.push((child_path, child));
            }
        }
        let mut imports = BTreeMap::new();
        let mut refs = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            let (tok, line) = &toks[i];
            let after_colons = i > 0 && toks[i - 1].0 == Tok::Colons;
            match tok {
                Tok::Ident(u) if u == "use" => {
                    i += 1;
                    let mut leaves = Vec::new();
                    use_tree(&toks, &mut i, &[], &mut leaves);
                    for (rel, name) in leaves {
                        if let Some(abs) = absolute(&path, &rel, &children) {
                            if let Some(name) = name {
                                imports.insert(name, abs.clone());
                            }
                            refs.push((abs, *line, rel.join("::")));
                        }
                    }
                }
                Tok::Ident(s)
                    if !after_colons
                        && matches!(s.as_str(), "crate" | "super" | "self")
                        && toks.get(i + 1).map(|x| &x.0) == Some(&Tok::Colons) =>
                {
                    let mut rel = vec![s.clone()];
                    i += 1;
                    while toks.get(i).map(|x| &x.0) == Some(&Tok::Colons) {
                        match toks.get(i + 1) {
                            Some((Tok::Ident(n), _)) => {
                                rel.push(n.clone());
                                i += 2;
                            }
                            _ => break,
                        }
                    }
                    if let Some(abs) = absolute(&path, &rel, &children) {
                        refs.push((abs, *line, rel.join("::")));
                    }
                }
                _ => i += 1,
            }
        }
        modules.insert(
            path,
            Module {
                file,
                children,
                declared,
                imports,
                refs,
            },
        );
    }
    modules
}

/// The module an absolute path ends in, following re-exports (`pub use`, and a parent's
/// own `use` lines, which its children see too).
fn resolve(modules: &BTreeMap<ModPath, Module>, abs: &[String], depth: usize) -> ModPath {
    let mut cur: ModPath = Vec::new();
    for (k, seg) in abs.iter().enumerate() {
        let Some(module) = modules.get(&cur) else {
            break;
        };
        if module.children.contains(seg) {
            cur.push(seg.clone());
        } else if let Some(target) = module.imports.get(seg)
            && depth < 8
            && target.as_slice() != &abs[..=k]
        {
            let mut next = target.clone();
            next.extend(abs[k + 1..].iter().cloned());
            return resolve(modules, &next, depth + 1);
        } else {
            break;
        }
    }
    cur
}

/// The edges between sibling modules, per folder: folder -> (from, to) -> evidence.
type Edges = BTreeMap<ModPath, BTreeMap<(String, String), String>>;

fn sibling_edges(modules: &BTreeMap<ModPath, Module>, src: &Path) -> Edges {
    let mut edges: Edges = BTreeMap::new();
    for (from, module) in modules {
        for (abs, line, written) in &module.refs {
            let to = resolve(modules, abs, 0);
            let k = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if k == from.len() || k == to.len() {
                continue; // itself, its parent chain or its own children
            }
            let file = module.file.strip_prefix(src).unwrap_or(&module.file);
            edges
                .entry(from[..k].to_vec())
                .or_default()
                .entry((from[k].clone(), to[k].clone()))
                .or_insert_with(|| format!("src/{}:{line} {written}", file.display()));
        }
    }
    edges
}

/// Each strongly connected part of a folder's graph: one closed walk through it, and all
/// its modules (a part may hold more modules than its shortest walk).
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<(Walk, BTreeSet<String>)> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for (a, b) in edges.keys() {
                if *a == n && seen.insert(b.clone()) {
                    todo.push(b.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reaches[n].contains(*n) {
            continue;
        }
        // Its strongly connected part, and a shortest walk from n back to n within it.
        let part: BTreeSet<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(**m) && reaches[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        done.extend(part.iter().cloned());
        let mut back: BTreeMap<String, String> = BTreeMap::new();
        let mut frontier = vec![(*n).clone()];
        'search: while !frontier.is_empty() {
            let mut next = Vec::new();
            for a in frontier {
                for (x, b) in edges.keys() {
                    if *x == a && part.contains(b) && !back.contains_key(b) {
                        back.insert(b.clone(), a.clone());
                        if b == *n {
                            break 'search;
                        }
                        next.push(b.clone());
                    }
                }
            }
            frontier = next;
        }
        let mut walk = Vec::new();
        let mut at = (*n).clone();
        loop {
            let prev = back[&at].clone();
            walk.push((prev.clone(), at.clone()));
            at = prev;
            if at == **n {
                break;
            }
        }
        walk.reverse();
        found.push((walk, part));
    }
    found
}

fn report(root_file: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = load(&src.join(root_file));
    let mut lines = Vec::new();
    for (folder, edges) in sibling_edges(&modules, &src) {
        for (walk, part) in cycles(&edges) {
            let names: Vec<&str> = walk
                .iter()
                .map(|(a, _)| a.as_str())
                .chain([walk[0].0.as_str()])
                .collect();
            let at = if folder.is_empty() {
                format!("{root_file}'s modules")
            } else {
                format!("{}/", folder.join("/"))
            };
            let all: Vec<&str> = part.iter().map(String::as_str).collect();
            lines.push(format!(
                "cycle in {at}: {} (tied together: {})",
                names.join(" -> "),
                all.join(", ")
            ));
            for (a, b) in &walk {
                lines.push(format!(
                    "    {a} -> {b}: {}",
                    edges[&(a.clone(), b.clone())]
                ));
            }
            // The other edges inside the part: a fix may have to break each of them too.
            for ((a, b), why) in &edges {
                if part.contains(a) && part.contains(b) && !walk.contains(&(a.clone(), b.clone())) {
                    lines.push(format!("    also {a} -> {b}: {why}"));
                }
            }
        }
    }
    lines
}

#[test]
fn the_library_has_no_module_cycle() {
    let found = report("lib.rs");
    assert!(
        found.is_empty(),
        "module cycles (break each edge's line, or move what it names):\n{}",
        found.join("\n")
    );
}

/// The edges between `folder`'s children that go up the order its mod.rs (lib.rs for
/// the crate root) declares them in, bottom first: one line each, naming the line that
/// makes it. `what` is what a child is called in that folder (a layer, a room).
fn upward_edges(
    modules: &BTreeMap<ModPath, Module>,
    src: &Path,
    folder: &[&str],
    what: &str,
) -> Vec<String> {
    let folder: ModPath = folder.iter().map(|s| s.to_string()).collect();
    let order = &modules[&folder].declared;
    let rank = |m: &str| order.iter().position(|o| o == m).unwrap();
    sibling_edges(modules, src)
        .get(&folder)
        .into_iter()
        .flatten()
        .filter(|((a, b), _)| rank(b) > rank(a))
        .map(|((a, b), why)| format!("    {a} -> {b} ({what} above it): {why}"))
        .collect()
}

/// The crate root's modules are layers, listed bottom first in src/lib.rs: an edge from
/// one to another must go down the list.
#[test]
fn each_layer_imports_only_from_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = load(&src.join("lib.rs"));
    let upward = upward_edges(&modules, &src, &[], "a layer");
    assert!(
        upward.is_empty(),
        "layers import only from below (src/lib.rs lists them bottom first):\n{}",
        upward.join("\n")
    );
}

/// The ledger's rooms, listed bottom first in src/state/ledger/mod.rs: the pure decision
/// (`decide`) below the files on disk (`store`), and those below the wait queue and a
/// holder's life. An edge from one room to another must go down the list.
#[test]
fn each_room_of_the_ledger_imports_only_from_the_rooms_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = load(&src.join("lib.rs"));
    let ledger = ["state", "ledger"];
    let order = &modules[&ledger.map(String::from).to_vec()].declared;
    let rank = |m: &str| {
        order
            .iter()
            .position(|o| o == m)
            .unwrap_or_else(|| panic!("src/state/ledger/mod.rs declares no room {m}"))
    };
    assert!(
        rank("decide") < rank("store") && rank("store") < rank("queue").min(rank("life")),
        "src/state/ledger/mod.rs lists decide below store, and store below queue and life: {order:?}"
    );
    let upward = upward_edges(&modules, &src, &ledger, "a room");
    assert!(
        upward.is_empty(),
        "the ledger's rooms import only from below (src/state/ledger/mod.rs lists them bottom first):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_gpupin_binary_has_no_module_cycle() {
    let found = report("bin/gpupin/main.rs");
    assert!(
        found.is_empty(),
        "module cycles (break each edge's line, or move what it names):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_cycle_is_found_through_a_reexport() {
    // The checker itself: two siblings, one naming the other directly, the other through
    // its parent's re-export, are a cycle; a child using its parent's item is not.
    let dir = tempfile::tempdir().unwrap();
    let w = |p: &str, s: &str| {
        let path = dir.path().join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, s).unwrap();
    };
    w(
        "lib.rs",
        "pub mod a;\npub mod b;\nmod c;\n#[cfg(test)]\nmod tests;\n",
    );
    w(
        "a/mod.rs",
        "mod inner;\npub use inner::Thing;\npub struct Top;\n",
    );
    w(
        "a/inner.rs",
        "use super::Top; // a parent is no cycle\npub struct Thing(crate::b::B);\n",
    );
    w(
        "b.rs",
        "pub struct B;\nfn f() -> crate::a::Thing { todo!() }\n",
    );
    w(
        "c.rs",
        "// crate::a::Thing in a comment, \"crate::b\" in a string\nconst S: &str = \"crate::a\";\n",
    );
    let modules = load(&dir.path().join("lib.rs"));
    assert!(
        !modules.contains_key(&vec!["tests".to_string()]),
        "a test-only module is left out"
    );
    let edges = sibling_edges(&modules, dir.path());
    let root = &edges[&Vec::new()];
    let pairs: Vec<_> = root.keys().cloned().collect();
    assert_eq!(pairs, [("a".into(), "b".into()), ("b".into(), "a".into())]);
    assert_eq!(
        root[&("b".into(), "a".into())],
        "src/b.rs:2 crate::a::Thing"
    );
    assert_eq!(cycles(root).len(), 1);
    assert!(
        !edges.contains_key(&vec!["a".to_string()]),
        "inner -> a is a child using its parent"
    );
}

#[test]
fn an_edge_up_a_folders_order_is_found_and_named_by_its_line() {
    // The checker itself: a folder's children declared bottom first (low, mid, high);
    // mid using low goes down, low using high (through the folder's re-export) goes up.
    let dir = tempfile::tempdir().unwrap();
    let w = |p: &str, s: &str| {
        let path = dir.path().join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, s).unwrap();
    };
    w("lib.rs", "pub mod f;\n");
    w(
        "f/mod.rs",
        "mod low;\n\nmod mid;\n\nmod high;\n\npub use high::High;\n",
    );
    w(
        "f/low.rs",
        "pub struct Low;\n\nfn up() -> crate::f::High {\n    todo!()\n}\n",
    );
    w("f/mid.rs", "use super::low::Low;\npub struct Mid(Low);\n");
    w("f/high.rs", "pub struct High;\n");
    let modules = load(&dir.path().join("lib.rs"));
    assert_eq!(
        modules[&vec!["f".to_string()]].declared,
        ["low", "mid", "high"]
    );
    let upward = upward_edges(&modules, dir.path(), &["f"], "a room");
    assert_eq!(
        upward,
        ["    low -> high (a room above it): src/f/low.rs:3 crate::f::High"]
    );
    assert!(upward_edges(&modules, dir.path(), &[], "a layer").is_empty());
}

/// Not a check: prints every folder's edges, for whoever redraws docs/ARCHITECTURE.md
/// (`cargo test --test layering -- --ignored --nocapture`).
#[test]
#[ignore]
fn print_the_graph() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for root in ["lib.rs", "bin/gpupin/main.rs"] {
        for (folder, edges) in sibling_edges(&load(&src.join(root)), &src) {
            println!("{root} {}/", folder.join("/"));
            for ((a, b), why) in edges {
                println!("    {a} -> {b}: {why}");
            }
        }
    }
}
