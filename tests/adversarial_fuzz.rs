//! Fuzz of what users and files hand gpupin (issue 8): request keys and values (as
//! annotations and as env), the inventory file, the live file, and gpupin-runtime's argv.
//! Every case drives the real binaries and asserts exit 0 or 1 (never a panic's 101, a
//! signal or a hang), exactly one `gpupin: ` line on stderr for a 1, and a ledger
//! byte-identical to before after every refusal.
//!
//! Each loop is bounded in count (GPUPIN_FUZZ_CASES, default sized for about a minute on
//! two cores for the whole file) and in time (GPUPIN_FUZZ_SECONDS per loop, default 40).
//! GPUPIN_FUZZ_SEED replays a run: the seed of each loop is printed on stderr, which the
//! test harness shows for a failing test.

mod adversarial_inputs_support;

use adversarial_inputs_support::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use std::ffi::OsString;
use std::fmt::Debug;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// The loop

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Runs `check` on up to `default_cases` values of `strategy` (GPUPIN_FUZZ_CASES
/// overrides), stopping early when the loop's time is up.
fn fuzz<T: Debug>(
    name: &str,
    default_cases: u64,
    strategy: impl Strategy<Value = T>,
    mut check: impl FnMut(u64, &T, &str),
) {
    let cases = env_number("GPUPIN_FUZZ_CASES").unwrap_or(default_cases);
    let budget = Duration::from_secs(env_number("GPUPIN_FUZZ_SECONDS").unwrap_or(40));
    let seed = env_number("GPUPIN_FUZZ_SEED").unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        (nanos as u64) ^ u64::from(std::process::id())
    });
    eprintln!("{name}: GPUPIN_FUZZ_SEED={seed}, up to {cases} cases in {budget:?}");
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let started = Instant::now();
    let mut ran = 0;
    for i in 0..cases {
        if started.elapsed() > budget {
            break;
        }
        let value = strategy.new_tree(&mut runner).unwrap().current();
        let mut what = format!("{name} case {i} (GPUPIN_FUZZ_SEED={seed}): {value:?}");
        if what.len() > 3000 {
            let cut = (0..=3000)
                .rev()
                .find(|&c| what.is_char_boundary(c))
                .unwrap();
            what.truncate(cut);
            what.push_str("...");
        }
        check(i, &value, &what);
        ran += 1;
    }
    eprintln!("{name}: {ran} cases in {:?}", started.elapsed());
}

/// Allocates through gpupin-runtime with `bundle` for `id` and checks the outcome: exit
/// 0 with a record (released again), or a one-line refusal that left the ledger as it was.
fn create_and_check(env: &Env, bundle: &Path, id: &str, what: &str) -> Run {
    let before = env.ledger();
    let run = env.create(bundle, id);
    check_against(env, &run, &before, what);
    run
}

/// The rule for every case, whatever the entry point: see the module doc. New holders
/// after a success are released, so that every case starts from the same ledger.
fn check_against(
    env: &Env,
    run: &Run,
    before: &std::collections::BTreeMap<String, Entry>,
    what: &str,
) {
    assert_zero_or_refused(run, what);
    if run.code == Some(1) {
        let after = env.ledger();
        assert!(
            &after == before,
            "{what}: the ledger changed on a refusal ({}): {after:?}",
            run.stderr
        );
        return;
    }
    let had: Vec<String> = before
        .keys()
        .filter_map(|k| k.strip_prefix("holders/"))
        .map(str::to_string)
        .collect();
    for file in env.record_files() {
        if had.contains(&file) {
            continue;
        }
        let id = file.trim_end_matches(".json");
        let out = env.gpupin(&["release", "--force", id], b"");
        assert_eq!(
            out.code,
            Some(0),
            "{what}: releasing {id}: {}",
            out.describe()
        );
    }
}

/// Puts one live holder into the ledger, so that "unchanged" means something.
fn hold_one(env: &Env) {
    let bundle = env.bundle("holder", &[("gpupin.count", "1")]);
    let run = env.create(&bundle, "holder");
    assert_eq!(run.code, Some(0), "the holder: {}", run.describe());
}

// ---------------------------------------------------------------------------------------
// Strings

const KEYS: &[&str] = &[
    "gpupin.count",
    "gpupin.devices",
    "gpupin.policy",
    "gpupin.memory",
    "gpupin.model",
    "gpupin.share",
    "gpupin.reserve",
    "gpupin.wait",
    "gpupin.cpus",
];

/// Values that are valid for some key, and near misses.
const VALUES: &[&str] = &[
    "1",
    "2",
    "8",
    "9",
    "all",
    "ALL",
    "0",
    "-1",
    "+2",
    " 2 ",
    "2.0",
    "0x2",
    "4294967296",
    "0,1",
    "7,0",
    "0,0",
    "8",
    "1,,2",
    "GPU-5a1e0001-0000-4000-8000-000000000003",
    "gpu-5a1e0001-0000-4000-8000-000000000003",
    "00000000:18:00.0",
    "pack",
    "spread",
    "topology",
    "least-loaded",
    "most-free",
    "best",
    "40GiB",
    "80GiB",
    "81559MiB",
    "1TiB",
    "40GB",
    "0B",
    "-5GiB",
    "18446744073709551615",
    "H100",
    "h100",
    "L40S",
    "H100;rm",
    "shared",
    "exclusive",
    "numa",
    "NUMA",
    "",
    " ",
    "\n",
    "1\n",
    "gpupin: x\ny",
];

/// Values for gpupin.wait: valid ones short, so that a request that cannot be met only
/// waits briefly (a long valid wait is not a hang).
const WAITS: &[&str] = &[
    "0s", "1s", "300ms", "25h", "24h1s", "forever", "-1s", "1", "", "1 s", "\u{221e}",
];

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,24}",
        "[a-zA-Z0-9,:.\\- ]{0,40}",
        "[\\x00-\\x1f\"\\\\]{1,8}",
        // Below the kernel's 128 KiB limit on one argument.
        (1usize..100_000).prop_map(|n| "9".repeat(n)),
        Just("\u{202e}gpupin\u{0}\r\n".to_string()),
    ]
}

fn value_for(key: &str) -> BoxedStrategy<String> {
    if key.ends_with("wait") || key == "GPUPIN_WAIT" {
        return proptest::sample::select(WAITS)
            .prop_map(str::to_string)
            .boxed();
    }
    prop_oneof![
        4 => proptest::sample::select(VALUES).prop_map(str::to_string),
        1 => any_text(),
    ]
    .boxed()
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => Just("gpupin.error".to_string()),
        1 => Just("gpupin.assigned".to_string()),
        1 => "gpupin\\.[a-z._]{0,12}",
        1 => "\\PC{1,12}".prop_map(|k| format!("gpupin.{k}")),
        1 => Just("org.example.other".to_string()),
    ]
}

// ---------------------------------------------------------------------------------------
// Requests

#[derive(Debug, Clone)]
struct RequestCase {
    pairs: Vec<(String, String)>,
    /// As `GPUPIN_*` process env instead of annotations.
    as_env: bool,
}

fn env_name(key: &str) -> String {
    match key.strip_prefix("gpupin.") {
        Some(rest) if KEYS.contains(&key) => format!("GPUPIN_{}", rest.to_ascii_uppercase()),
        _ => key.to_string(),
    }
}

fn request_case() -> impl Strategy<Value = RequestCase> {
    let pair = key().prop_flat_map(|k| {
        let values = value_for(&k);
        (Just(k), values)
    });
    (proptest::collection::vec(pair, 0..5), any::<bool>())
        .prop_map(|(pairs, as_env)| RequestCase { pairs, as_env })
}

#[test]
fn fuzz_request_keys_and_values() {
    let env = Env::new();
    hold_one(&env);
    fuzz("requests", 1500, request_case(), |i, case, what| {
        let id = format!("req{i}");
        let spec = if case.as_env {
            let vars: Vec<String> = case
                .pairs
                .iter()
                .map(|(k, v)| format!("{}={v}", env_name(k)))
                .collect();
            let vars: Vec<&str> = vars.iter().map(String::as_str).collect();
            spec_json(json!({}), &vars)
        } else {
            let map: serde_json::Map<String, Value> = case
                .pairs
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                .collect();
            spec_json(Value::Object(map), &[])
        };
        let bundle = env.bundle_with(&id, &spec);
        create_and_check(&env, &bundle, &id, what);
        let _ = std::fs::remove_dir_all(&bundle);
    });
}

// ---------------------------------------------------------------------------------------
// JSON mutations, shared by the inventory and live files

#[derive(Debug, Clone)]
enum Mutation {
    /// Sets the value at a path (chosen by two indices into what is there) to `Value`.
    Set(usize, usize, Value),
    Remove(usize, usize),
    AddKey(usize, String, Value),
    DuplicateEntry(usize),
    DropEntries,
}

#[derive(Debug, Clone)]
enum ByteEdit {
    None,
    Truncate(usize),
    Insert(usize, Vec<u8>),
}

fn any_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(1.5)),
        proptest::sample::select(VALUES).prop_map(Value::from),
        any_text().prop_map(Value::from),
        Just(json!(["X", "NVS"])),
        Just(json!({})),
        Just(json!("GPU-5a1e0001-0000-4000-8000-000000000000")),
        Just(json!("/dev/nvidia0")),
        Just(json!("/dev/../etc/passwd")),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<usize>(), any_json()).prop_map(|(a, b, v)| Mutation::Set(a, b, v)),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Remove(a, b)),
        1 => (any::<usize>(), "[a-z_]{1,10}", any_json()).prop_map(|(a, k, v)| Mutation::AddKey(a, k, v)),
        1 => any::<usize>().prop_map(Mutation::DuplicateEntry),
        1 => Just(Mutation::DropEntries),
    ]
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        6 => Just(ByteEdit::None),
        1 => any::<usize>().prop_map(ByteEdit::Truncate),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..6))
            .prop_map(|(at, b)| ByteEdit::Insert(at, b)),
    ]
}

/// Objects reachable from the document: the top level, each entry of `list_key`, and
/// each row of `topology`.
fn objects_mut<'a>(doc: &'a mut Value, list_key: &str) -> Vec<&'a mut Value> {
    let mut out = Vec::new();
    let Value::Object(map) = doc else {
        return out;
    };
    for (k, v) in map.iter_mut() {
        if (k == list_key || k == "topology" || k == "control_nodes")
            && let Value::Array(items) = v
        {
            out.extend(items.iter_mut());
        }
    }
    out
}

/// Replaces (`Some`) or removes (`None`) one key or item, chosen by `a` and `b`.
fn edit_at(doc: &mut Value, list_key: &str, a: usize, b: usize, new: Option<&Value>) {
    // Index 0 is the top level, the others the entries.
    let n = objects_mut(doc, list_key).len() + 1;
    let target: &mut Value = if a.is_multiple_of(n) {
        doc
    } else {
        objects_mut(doc, list_key).swap_remove(a % n - 1)
    };
    match target {
        Value::Object(map) if !map.is_empty() => {
            let key = map.keys().nth(b % map.len()).unwrap().clone();
            match new {
                Some(v) => map.insert(key, v.clone()),
                None => map.remove(&key),
            };
        }
        Value::Array(items) if !items.is_empty() => {
            let at = b % items.len();
            match new {
                Some(v) => items[at] = v.clone(),
                None => drop(items.remove(at)),
            }
        }
        _ => {}
    }
}

fn apply(doc: &mut Value, list_key: &str, m: &Mutation) {
    match m {
        Mutation::Set(a, b, v) => edit_at(doc, list_key, *a, *b, Some(v)),
        Mutation::Remove(a, b) => edit_at(doc, list_key, *a, *b, None),
        Mutation::AddKey(a, k, v) => {
            let mut objects = objects_mut(doc, list_key);
            let n = objects.len();
            if n > 0
                && let Value::Object(map) = &mut objects[a % n]
            {
                map.insert(k.clone(), v.clone());
            }
        }
        Mutation::DuplicateEntry(a) => {
            if let Some(Value::Array(items)) = doc.get_mut(list_key)
                && !items.is_empty()
            {
                let copy = items[a % items.len()].clone();
                items.push(copy);
            }
        }
        Mutation::DropEntries => {
            if let Some(items) = doc.get_mut(list_key) {
                *items = json!([]);
            }
        }
    }
}

fn render(doc: &Value, edit: &ByteEdit) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(doc).unwrap();
    match edit {
        ByteEdit::None => {}
        ByteEdit::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
        ByteEdit::Insert(at, b) => {
            let at = at % (bytes.len() + 1);
            bytes.splice(at..at, b.iter().copied());
        }
    }
    bytes
}

#[derive(Debug, Clone)]
struct FileCase {
    mutations: Vec<Mutation>,
    edit: ByteEdit,
}

fn file_case() -> impl Strategy<Value = FileCase> {
    (proptest::collection::vec(mutation(), 0..4), byte_edit())
        .prop_map(|(mutations, edit)| FileCase { mutations, edit })
}

// ---------------------------------------------------------------------------------------
// The inventory file

fn valid_inventory() -> Value {
    let n = 4;
    let gpus: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "index": i, "uuid": format!("GPU-f022{i:04}-0000-4000-8000-000000000000"),
                "name": "NVIDIA H100 80GB HBM3", "memory": "80GiB",
                "pci_bus_id": format!("00000000:{:02X}:00.0", 0x18 + i), "minor": i,
                "numa_node": 0, "local_cpus": "0",
            })
        })
        .collect();
    let topology: Vec<Vec<&str>> = (0..n)
        .map(|r| (0..n).map(|c| if r == c { "X" } else { "NV4" }).collect())
        .collect();
    json!({
        "gpu_major": 195,
        "control_nodes": [
            {"path": "/dev/nvidiactl", "major": 195, "minor": 255},
            {"path": "/dev/nvidia-uvm", "major": 510, "minor": 0},
        ],
        "gpus": gpus,
        "topology": topology,
    })
}

#[test]
fn fuzz_inventory_file() {
    let env = Env::new();
    let inventory = env.path("inventory.json");
    env.write_config(&format!("inventory = {:?}\n", inventory.to_str().unwrap()));
    std::fs::write(&inventory, valid_inventory().to_string()).unwrap();
    hold_one(&env);
    let bundle = env.bundle("c", &[("gpupin.count", "1")]);
    fuzz("inventory", 600, file_case(), |i, case, what| {
        let mut doc = valid_inventory();
        for m in &case.mutations {
            apply(&mut doc, "gpus", m);
        }
        std::fs::write(&inventory, render(&doc, &case.edit)).unwrap();
        let before = env.ledger();
        let run = env.gpupin(&["inventory", "--json"], b"");
        check_against(&env, &run, &before, &format!("gpupin inventory: {what}"));
        let run = env.gpupin(&["status"], b"");
        check_against(&env, &run, &before, &format!("gpupin status: {what}"));
        create_and_check(&env, &bundle, &format!("inv{i}"), what);
    });
}

// ---------------------------------------------------------------------------------------
// The live file

fn valid_live() -> Value {
    let gpus: Vec<Value> = (0..8)
        .map(|i: u32| {
            let key = if i.is_multiple_of(2) {
                json!({"uuid": format!("GPU-5a1e0001-0000-4000-8000-{i:012}")})
            } else {
                json!({"index": i})
            };
            let mut entry = key;
            entry["utilization"] = json!(i * 10);
            entry["memory_free"] = if i.is_multiple_of(3) {
                json!("20GiB")
            } else {
                json!(1u64 << 34)
            };
            entry
        })
        .collect();
    json!({"gpus": gpus})
}

#[test]
fn fuzz_live_file() {
    let env = Env::new();
    let live = env.path("live.json");
    env.write_config("inventory = \"sim:nvswitch8\"\nlive_file = \"live.json\"\n");
    std::fs::write(&live, valid_live().to_string()).unwrap();
    hold_one(&env);
    let requests: [&[(&str, &str)]; 3] = [
        &[("gpupin.count", "1"), ("gpupin.policy", "least-loaded")],
        &[("gpupin.count", "2"), ("gpupin.policy", "most-free")],
        &[("gpupin.count", "1"), ("gpupin.memory", "10GiB")],
    ];
    let bundles: Vec<_> = requests
        .iter()
        .enumerate()
        .map(|(n, r)| env.bundle(&format!("live{n}"), r))
        .collect();
    let case = (file_case(), 0..requests.len());
    fuzz("live", 800, case, |i, (case, which), what| {
        let mut doc = valid_live();
        for m in &case.mutations {
            apply(&mut doc, "gpus", m);
        }
        std::fs::write(&live, render(&doc, &case.edit)).unwrap();
        create_and_check(&env, &bundles[*which], &format!("live{i}"), what);
    });
}

// ---------------------------------------------------------------------------------------
// gpupin-runtime's argv

#[derive(Debug, Clone)]
enum Token {
    Literal(&'static str),
    Config,
    ConfigEq,
    Bundle,
    BundleEq,
    Log,
    Id,
    Text(String),
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        6 => proptest::sample::select(&[
            "create", "run", "delete", "start", "state", "kill", "--bundle", "-b", "-bundle",
            "--root", "--log", "--log-format", "json", "--systemd-cgroup", "--pid-file",
            "--gpupin-config", "--gpupin-config=", "--", "-", "", "--force", "--console-socket",
            "--no-pivot", "--criu", "--rootless", "true",
        ][..]).prop_map(Token::Literal),
        1 => Just(Token::Config),
        1 => Just(Token::ConfigEq),
        2 => Just(Token::Bundle),
        1 => Just(Token::BundleEq),
        1 => Just(Token::Log),
        2 => Just(Token::Id),
        1 => any_text().prop_map(Token::Text),
    ]
}

#[derive(Debug, Clone)]
struct ArgvCase {
    /// Before the usual `create --bundle B ID`, between its words, or instead of it.
    prefix: Vec<Token>,
    middle: Vec<Token>,
    standard: bool,
    suffix: Vec<Token>,
}

fn argv_case() -> impl Strategy<Value = ArgvCase> {
    let tokens = |n| proptest::collection::vec(token(), 0..n);
    (tokens(4), tokens(3), any::<bool>(), tokens(3)).prop_map(
        |(prefix, middle, standard, suffix)| ArgvCase {
            prefix,
            middle,
            standard,
            suffix,
        },
    )
}

#[test]
fn fuzz_runtime_argv() {
    let env = Env::new();
    hold_one(&env);
    let bundle = env.bundle("argv", &[("gpupin.count", "1")]);
    let log = env.path("runc-log.json");
    let fake_bin = env.path("fake-bin");
    std::fs::create_dir(&fake_bin).unwrap();
    std::os::unix::fs::symlink(&env.fake_runtime, fake_bin.join("runc")).unwrap();
    let inherited = std::env::var_os("PATH").unwrap_or_default();
    let fake_path = std::env::join_paths(
        std::iter::once(fake_bin.clone()).chain(std::env::split_paths(&inherited)),
    )
    .unwrap();
    fuzz("argv", 1500, argv_case(), |i, case, what| {
        let id = format!("argv{i}");
        let word = |t: &Token| -> OsString {
            match t {
                Token::Literal(s) => (*s).into(),
                Token::Config => env.config.clone().into(),
                Token::ConfigEq => format!("--gpupin-config={}", env.config.display()).into(),
                Token::Bundle => bundle.clone().into(),
                Token::BundleEq => format!("--bundle={}", bundle.display()).into(),
                Token::Log => log.clone().into(),
                Token::Id => id.clone().into(),
                // An argv string cannot hold a NUL.
                Token::Text(s) => s.replace('\0', "\u{1}").into(),
            }
        };
        let mut args: Vec<OsString> = case.prefix.iter().map(word).collect();
        if case.standard {
            args.push("create".into());
            args.extend(case.middle.iter().map(word));
            args.extend(["--bundle".into(), bundle.clone().into()]);
            args.push(id.clone().into());
        } else {
            args.extend(case.middle.iter().map(word));
        }
        args.extend(case.suffix.iter().map(word));
        // Whatever the argv, the config comes from this test: never the host's. Where the
        // argv names a config that does not load, gpupin-runtime hands a container that
        // asks for no GPU to `runc` on PATH: here the same quiet fake as the config's.
        let mut cmd = Command::new(RUNTIME);
        cmd.args(&args)
            .current_dir(env.dir.path())
            .env("GPUPIN_CONFIG", &env.config)
            .env("PATH", &fake_path);
        let before = env.ledger();
        let run = run_bounded(&mut cmd, b"", LIMIT);
        check_against(&env, &run, &before, &format!("{what}\nargv {args:?}"));
    });
}
