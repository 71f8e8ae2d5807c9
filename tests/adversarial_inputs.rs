//! The adversarial suite, part 2 (issue 8): a hostile state dir (symlinks, FIFOs, loose
//! modes, garbage, huge and foreign records, a full disk), hostile bundles, and the
//! defects found by attacking gpupin through its real binaries: a container that steals
//! another holder's GPUs, a forged `gpupin.error`, a host pid in the OCI state, stale temp
//! files, a record from the future, unstable messages, a closed stdout, and a relative
//! `--gpupin-config`.
//!
//! Ledger attacks go through `gpupin-runtime create` with a fake runtime: it allocates
//! exactly as every entry point does, without needing a container pid. Attacks that need
//! a container go through real runc containers (tests/common's Sandbox).

mod adversarial_inputs_support;

use adversarial_inputs_support::*;
use gpupin_sandbox::harness::{Sandbox, Sleeper, need_root};
use gpupin_sandbox::{Container, SandboxError, hook_message};
use serde_json::{Value, json};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

// ---------------------------------------------------------------------------------------
// Helpers

/// gpupin's one line out of runc's report of a refused start. Panics when the container
/// started, or when runc's error does not carry exactly one gpupin line.
fn refusal(result: Result<Container, SandboxError>, what: &str) -> String {
    let err = match result {
        Ok(c) => panic!("{what}: container {} started but must be refused", c.id()),
        Err(err) => err.to_string(),
    };
    let message = hook_message(&err).unwrap_or_else(|| panic!("{what}: no gpupin line in {err}"));
    assert_eq!(
        err.matches("gpupin: ").count(),
        1,
        "{what}: not exactly one gpupin line in runc's error: {err}"
    );
    message
}

/// The record file of `id` in a sandbox's ledger, as bytes.
fn record_bytes(sb: &Sandbox, id: &str) -> Option<Vec<u8>> {
    std::fs::read(
        sb.gpupin
            .state_dir
            .join("holders")
            .join(format!("{id}.json")),
    )
    .ok()
}

fn uuids_of(holder: &Value) -> Vec<String> {
    serde_json::from_value(holder["gpus"].clone()).unwrap()
}

/// A request for one GPU, allocated through gpupin-runtime; asserts it was granted.
fn allocate_one(env: &Env, id: &str) {
    let bundle = env.bundle(id, &[("gpupin.count", "1")]);
    let run = env.create(&bundle, id);
    assert_eq!(run.code, Some(0), "allocating for {id}: {}", run.describe());
    assert!(env.record(id).is_some(), "no record for {id} after exit 0");
}

/// Runs one allocation for `id` against a tampered state dir and checks the rule for every
/// refusal: exit 0, or exit 1 with one line and the ledger as it was. Returns the run.
fn allocate_against(env: &Env, id: &str, what: &str) -> Run {
    let bundle = env.bundle(id, &[("gpupin.count", "1")]);
    let before = env.ledger();
    let run = env.create(&bundle, id);
    assert_zero_or_refused(&run, what);
    if run.code == Some(1) {
        assert_eq!(
            env.ledger(),
            before,
            "{what}: the ledger changed on a refusal"
        );
        assert!(
            env.record(id).is_none(),
            "{what}: {id} holds after a refusal"
        );
    } else {
        assert!(
            env.record(id).is_some(),
            "{what}: exit 0 without a regular record file of {id}'s own"
        );
    }
    run
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

// ---------------------------------------------------------------------------------------
// Defect 1: a container steals another holder's GPUs

#[test]
fn thief_with_victims_assigned_and_claim_annotations_is_refused() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "thief_with_victims_assigned_and_claim_annotations_is_refused",
    ) else {
        return;
    };
    let victim_id = sb.id("victim");
    let victim = sb
        .start(&victim_id, &sb.spec().annotation("gpupin.count", "1"))
        .unwrap();
    let holder = sb
        .gpupin
        .holder(&victim_id)
        .expect("the victim holds a GPU");
    let uuids = uuids_of(&holder).join(",");
    let victim_record = record_bytes(&sb, &victim_id).unwrap();

    // Everything the thief writes is visible to anyone in `gpupin status`; the secret
    // of the new claim format it can only guess.
    let claims = [victim_id.clone(), format!("{victim_id}:{}", "0".repeat(32))];
    for (n, claim) in claims.iter().enumerate() {
        let thief_id = sb.id(&format!("thief{n}"));
        let spec = sb
            .spec()
            .annotation("gpupin.assigned", &uuids)
            .annotation("gpupin.claim", claim);
        let what = format!("thief with gpupin.claim={claim}");
        refusal(sb.start(&thief_id, &spec), &what);
        assert_eq!(
            record_bytes(&sb, &victim_id).as_deref(),
            Some(&victim_record[..]),
            "{what}: the victim's record changed"
        );
        let after = sb
            .gpupin
            .holder(&victim_id)
            .expect("the victim still holds");
        assert_eq!(after["pid"], victim.pid().unwrap(), "{what}");
        assert_eq!(uuids_of(&after).join(","), uuids, "{what}");
        assert!(
            sb.gpupin.holder(&thief_id).is_none(),
            "{what}: the thief holds"
        );
        assert!(sb.gpupin.held_minors(&thief_id).is_empty(), "{what}");
    }
    victim.stop().unwrap();
}

/// `gpupin hook precreate` on a spec asking for one GPU: the edited spec.
fn precreate(sb: &Sandbox) -> Value {
    let spec = gpupin_sandbox::BundleSpec::sleeper(&sb.rootfs)
        .annotation("gpupin.count", "1")
        .to_config();
    let mut cmd = Command::new(GPUPIN);
    cmd.arg("--config")
        .arg(&sb.gpupin.config)
        .args(["hook", "precreate"]);
    let run = run_bounded(&mut cmd, spec.to_string().as_bytes(), LIMIT);
    assert_eq!(run.code, Some(0), "precreate: {}", run.describe());
    let edited: Value = serde_json::from_slice(&run.stdout).expect("precreate prints a spec");
    assert!(
        edited["annotations"].get("gpupin.error").is_none(),
        "precreate failed: {}",
        edited["annotations"]["gpupin.error"]
    );
    edited
}

/// The one claim holder (`claim-...`) in the sandbox's ledger, as status shows it.
fn only_claim(sb: &Sandbox) -> Value {
    let status = sb.gpupin.status();
    let claims: Vec<&Value> = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["id"].as_str().unwrap().starts_with("claim-"))
        .collect();
    assert_eq!(claims.len(), 1, "{status:#}");
    claims[0].clone()
}

#[test]
fn precreate_claim_cannot_be_bound_by_a_container_that_copies_what_status_shows() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "precreate_claim_cannot_be_bound_by_a_container_that_copies_what_status_shows",
    ) else {
        return;
    };
    let edited = precreate(&sb);
    let assigned = edited["annotations"]["gpupin.assigned"]
        .as_str()
        .expect("gpupin.assigned in the edited spec")
        .to_string();
    let claim_annotation = edited["annotations"]["gpupin.claim"]
        .as_str()
        .expect("gpupin.claim in the edited spec")
        .to_string();
    let claim = only_claim(&sb);
    let claim_id = claim["id"].as_str().unwrap().to_string();
    let claim_record = record_bytes(&sb, &claim_id).unwrap();
    // The new format, `<holder id>:<secret>`: status shows the id, never the secret.
    if let Some((_, secret)) = claim_annotation.split_once(':') {
        for args in [&["status"][..], &["status", "--json"]] {
            let out = sb.gpupin.run(args, "");
            assert!(
                !String::from_utf8_lossy(&out.stdout).contains(secret),
                "{args:?} shows the claim's secret"
            );
        }
    }

    let thieves = [
        ("thief-id", claim_id.clone()),
        ("thief-hex", format!("{claim_id}:{}", "0".repeat(32))),
    ];
    for (name, claim_value) in thieves {
        let thief_id = sb.id(name);
        let spec = sb
            .spec()
            .annotation("gpupin.assigned", &assigned)
            .annotation("gpupin.claim", &claim_value);
        refusal(sb.start(&thief_id, &spec), name);
        assert!(sb.gpupin.holder(&thief_id).is_none(), "{name} holds");
        assert_eq!(
            record_bytes(&sb, &claim_id).as_deref(),
            Some(&claim_record[..]),
            "{name}: the claim changed"
        );
        assert_eq!(sb.gpupin.holder(&claim_id).unwrap()["pid"], Value::Null);
    }

    // The container podman would start from the edited spec binds the claim.
    let id = sb.id("legit");
    let bundle = sb.bundle_dir(&id);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("config.json"), edited.to_string()).unwrap();
    let c = sb
        .runc
        .run_detached(&id, &bundle)
        .expect("the legit container starts");
    let holder = sb
        .gpupin
        .holder(&id)
        .expect("the claim is bound to the container");
    assert_eq!(holder["pid"], c.pid().unwrap());
    assert_eq!(uuids_of(&holder).join(","), assigned);
    assert!(sb.gpupin.holder(&claim_id).is_none(), "the claim remains");
    c.stop().unwrap();
}

// ---------------------------------------------------------------------------------------
// Defect 9: a user-set gpupin.error

#[test]
fn forged_gpupin_error_is_refused_without_printing_it() {
    let env = Env::new();
    let forged = "gpupin: fake line\nsecond line";
    let bundle = env.bundle("forger", &[]);
    let sleeper = Sleeper::start();
    let annotations = json!({"gpupin.error": forged, "gpupin.count": "1"});
    let input = state_json("forger", sleeper.pid(), &bundle, annotations);
    let run = env.gpupin(&["hook", "prestart"], &input);
    assert_refused(&run, "forged gpupin.error");
    assert!(!run.stderr.contains(forged), "{:?}", run.stderr);
    assert!(!run.stderr.contains("\nsecond line"), "{:?}", run.stderr);
    assert!(env.record_files().is_empty(), "something is held");
}

#[test]
fn forged_gpupin_error_in_a_runc_container_is_not_passed_on() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "forged_gpupin_error_in_a_runc_container_is_not_passed_on",
    ) else {
        return;
    };
    let id = sb.id("forger");
    let spec = sb
        .spec()
        .annotation("gpupin.error", "gpupin: fake line\nsecond line")
        .annotation("gpupin.count", "1");
    let err = match sb.start(&id, &spec) {
        Ok(c) => panic!("container {} started but must be refused", c.id()),
        Err(err) => err.to_string(),
    };
    assert!(hook_message(&err).is_some(), "no gpupin line in {err}");
    // runc quotes the hook's stderr: a newline gpupin printed shows as `\n` right after
    // the text, one it escaped as `\\n`. Only the escaped form may be there.
    assert!(
        !err.contains(r"fake line\nsecond"),
        "gpupin printed the forged text raw: {err}"
    );
    assert!(sb.gpupin.holder(&id).is_none());
}

// ---------------------------------------------------------------------------------------
// Defect 14: a host pid in the OCI state

#[test]
fn state_with_a_host_namespace_pid_is_refused_and_creates_nothing() {
    if !need_root("state_with_a_host_namespace_pid_is_refused_and_creates_nothing") {
        return;
    }
    let env = Env::new();
    let bundle = env.bundle("hostpid", &[]);
    let host_process = Sleeper::start();
    let input = state_json(
        "hostpid",
        host_process.pid(),
        &bundle,
        json!({"gpupin.count": "1"}),
    );
    let run = env.gpupin(&["hook", "prestart"], &input);
    let created: Vec<_> = std::fs::read_dir(bundle.join("rootfs/dev"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    // Clean up before asserting: a node made on the host must not outlive the test.
    let _ = env.gpupin(&["release", "--force", "hostpid"], b"");
    assert_refused(&run, "host pid");
    assert!(
        created.is_empty(),
        "created under the host's rootfs/dev: {created:?}"
    );
    assert!(env.record_files().is_empty(), "something is held");
}

// ---------------------------------------------------------------------------------------
// State dir: symlinks

#[test]
fn queue_symlinked_to_a_directory_keeps_that_directorys_files() {
    let env = Env::new();
    env.make_state_dir();
    let elsewhere = env.path("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let files = ["00000000000000000001-x.json", "notes.txt"];
    for f in files {
        std::fs::write(elsewhere.join(f), "precious\n").unwrap();
    }
    std::os::unix::fs::symlink(&elsewhere, env.state.join("queue")).unwrap();
    allocate_against(&env, "c1", "queue as a symlink");
    for f in files {
        assert_eq!(
            std::fs::read_to_string(elsewhere.join(f)).ok().as_deref(),
            Some("precious\n"),
            "{f} in the symlinked queue's target was touched"
        );
    }
}

#[test]
fn audit_log_symlinked_to_a_file_leaves_the_file_unchanged() {
    let env = Env::new();
    env.make_state_dir();
    let target = env.path("precious.txt");
    std::fs::write(&target, "precious\n").unwrap();
    std::os::unix::fs::symlink(&target, env.state.join("audit.log")).unwrap();
    allocate_against(&env, "c1", "audit.log as a symlink");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
}

#[test]
fn cursor_symlinked_to_another_users_file_is_replaced_not_followed() {
    if !need_root("cursor_symlinked_to_another_users_file_is_replaced_not_followed") {
        return;
    }
    let env = Env::new();
    env.make_state_dir();
    let target = env.path("their-file");
    std::fs::write(&target, "theirs\n").unwrap();
    chown(&target, NOBODY);
    chmod(&target, 0o600);
    let cursor = env.state.join("cursor");
    std::os::unix::fs::symlink(&target, &cursor).unwrap();
    let run = allocate_against(&env, "c1", "cursor as a symlink");

    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs\n");
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (NOBODY, 0o600));
    if run.code == Some(0) {
        let cursor_meta = std::fs::symlink_metadata(&cursor).unwrap();
        assert!(cursor_meta.is_file(), "the cursor is still a symlink");
        assert_eq!(cursor_meta.uid(), 0, "the new cursor is not root's");
        assert_eq!(cursor_meta.mode() & 0o7777, 0o644, "the new cursor's mode");
    }
}

#[test]
fn record_symlinked_to_another_users_file_is_not_followed() {
    if !need_root("record_symlinked_to_another_users_file_is_not_followed") {
        return;
    }
    let env = Env::new();
    let template = env.record_template();
    let target = env.path("their-record.json");
    let planted = env.plant_record(&template, "c1.json", "c1", None);
    std::fs::rename(&planted, &target).unwrap();
    chown(&target, NOBODY);
    chmod(&target, 0o600);
    let before = std::fs::read(&target).unwrap();
    std::os::unix::fs::symlink(&target, &planted).unwrap();
    let run = allocate_against(&env, "c1", "record as a symlink");

    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(
        std::fs::read(&target).unwrap(),
        before,
        "the target changed"
    );
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (NOBODY, 0o600));
    if run.code == Some(0) {
        let record = std::fs::symlink_metadata(&planted).unwrap();
        assert!(record.is_file(), "the record is still a symlink");
        assert_eq!((record.uid(), record.mode() & 0o7777), (0, 0o644));
    }
}

// ---------------------------------------------------------------------------------------
// State dir: modes

#[test]
fn world_writable_holders_dir_hands_out_nothing_through_a_planted_record() {
    if !need_root("world_writable_holders_dir_hands_out_nothing_through_a_planted_record") {
        return;
    }
    let env = Env::new();
    let template = env.record_template();
    let sleeper = Sleeper::start();
    let planted = env.plant_record(&template, "planted.json", "planted", Some(sleeper.pid()));
    chown(&planted, NOBODY);
    chmod(&env.state.join("holders"), 0o777);
    let run = allocate_against(&env, "c1", "holders/ 0777 with a planted record");
    assert_eq!(
        run.code,
        Some(1),
        "a planted record was honoured: {}",
        run.describe()
    );
}

#[test]
fn world_writable_queue_dir_hands_out_nothing_through_a_planted_ticket() {
    if !need_root("world_writable_queue_dir_hands_out_nothing_through_a_planted_ticket") {
        return;
    }
    let env = Env::new();
    env.make_state_dir();
    let queue = env.state.join("queue");
    std::fs::create_dir(&queue).unwrap();
    chmod(&queue, 0o777);
    let sleeper = Sleeper::start();
    let ticket = queue.join("00000000000000000001-planted.json");
    let text = json!({
        "seq": 1, "id": "planted", "pid": sleeper.pid(),
        "start_time": start_time(sleeper.pid()),
    });
    std::fs::write(&ticket, text.to_string()).unwrap();
    chown(&ticket, NOBODY);
    let run = allocate_against(&env, "c1", "queue/ 0777 with a planted ticket");
    assert!(
        env.record("planted").is_none(),
        "the planted ticket got GPUs"
    );
    if run.code == Some(0) {
        // Repaired rather than refused: then others cannot plant again.
        assert_eq!(
            mode_of(&queue) & 0o022,
            0,
            "queue/ still writable by others"
        );
    }
}

// ---------------------------------------------------------------------------------------
// State dir: FIFOs

/// Plants a FIFO at `rel` under the state dir (after a first allocation made the usual
/// files), then allocates; the hook must come back within LIMIT.
fn fifo_case(rel: &str, annotations: &[(&str, &str)], hint: bool) {
    let env = Env::new();
    allocate_one(&env, "first");
    let path = env.state.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    mkfifo(&path);
    let bundle = env.bundle("c1", annotations);
    let before = env.ledger();
    let run = env.create(&bundle, "c1");
    let what = format!("FIFO as {rel}");
    assert_zero_or_refused(&run, &what);
    if run.code == Some(1) {
        assert!(
            !hint,
            "{what}: refused where the file is only a hint: {}",
            run.stderr
        );
        assert_eq!(env.ledger(), before, "{what}: ledger changed on a refusal");
    } else {
        assert!(
            env.record("c1").is_some(),
            "{what}: exit 0 without a record"
        );
    }
}

#[test]
fn fifo_as_a_record_does_not_hang_the_hook() {
    fifo_case("holders/fifo.json", &[("gpupin.count", "1")], false);
}

#[test]
fn fifo_as_the_cursor_does_not_hang_the_hook() {
    fifo_case("cursor", &[("gpupin.count", "1")], true);
}

#[test]
fn fifo_as_the_audit_log_does_not_hang_the_hook() {
    fifo_case("audit.log", &[("gpupin.count", "1")], false);
}

#[test]
fn fifo_as_a_queue_ticket_does_not_hang_the_hook() {
    fifo_case(
        "queue/00000000000000000001-fifo.json",
        &[("gpupin.count", "1")],
        false,
    );
}

#[test]
fn fifo_as_queue_seq_does_not_hang_a_waiting_request() {
    fifo_case(
        "queue-seq",
        &[("gpupin.count", "1"), ("gpupin.wait", "2s")],
        false,
    );
}

#[test]
fn fifo_as_the_lock_does_not_hang_the_hook() {
    fifo_case("lock", &[("gpupin.count", "1")], false);
}

#[test]
fn fifo_as_the_bundles_config_json_is_refused_in_time() {
    let env = Env::new();
    let bundle = env.bundle("c1", &[("gpupin.count", "1")]);
    std::fs::remove_file(bundle.join("config.json")).unwrap();
    mkfifo(&bundle.join("config.json"));
    let run = env.create(&bundle, "c1");
    assert_refused(&run, "runtime: FIFO as config.json");
    // The hook reads the bundle's config.json too (a dead pid: nothing to inject into).
    let input = state_json("c2", dead_pid(), &bundle, json!({"gpupin.count": "1"}));
    let run = env.gpupin(&["hook", "prestart"], &input);
    assert_refused(&run, "hook: FIFO as config.json");
    assert!(env.record_files().is_empty(), "something is held");
}

#[test]
fn fifo_as_the_config_file_is_refused_in_time() {
    let env = Env::new();
    let bundle = env.bundle("c1", &[("gpupin.count", "1")]);
    let fifo = env.path("fifo.toml");
    mkfifo(&fifo);
    let mut cmd = Command::new(RUNTIME);
    cmd.arg("--gpupin-config")
        .arg(&fifo)
        .args(["create", "--bundle"])
        .arg(&bundle)
        .arg("c1");
    assert_refused(
        &run_bounded(&mut cmd, b"", LIMIT),
        "runtime: FIFO as config",
    );
    let mut cmd = Command::new(GPUPIN);
    cmd.arg("--config").arg(&fifo).arg("status");
    assert_refused(&run_bounded(&mut cmd, b"", LIMIT), "status: FIFO as config");
    let input = state_json("c2", dead_pid(), &bundle, json!({"gpupin.count": "1"}));
    let mut cmd = Command::new(GPUPIN);
    cmd.arg("--config").arg(&fifo).args(["hook", "prestart"]);
    assert_refused(
        &run_bounded(&mut cmd, &input, LIMIT),
        "hook: FIFO as config",
    );
    assert!(!env.state.exists() || env.record_files().is_empty());
}

// ---------------------------------------------------------------------------------------
// State dir: garbage, huge and foreign records

/// After `gc` and `release NAME` (each exit 0, or 1 with one line), allocation works.
fn cleared_by_gc_or_release(env: &Env, name: &str, what: &str) {
    assert_zero_or_refused(&env.gpupin(&["gc"], b""), &format!("{what}: gc"));
    let release = env.gpupin(&["release", name], b"");
    assert_zero_or_refused(&release, &format!("{what}: release {name:?}"));
    let run = env.create(&env.bundle("after", &[("gpupin.count", "1")]), "after");
    assert_eq!(
        run.code,
        Some(0),
        "{what}: allocation after clearing: {}",
        run.describe()
    );
}

#[test]
fn record_with_an_invalid_id_is_cleared_by_gc_or_release() {
    let env = Env::new();
    let template = env.record_template();
    // Its holder is gone: every reap and gc must deal with it.
    env.plant_record(&template, "bad id.json", "bad id", Some(dead_pid()));
    cleared_by_gc_or_release(&env, "bad id", "record `bad id.json`");
}

#[test]
fn directory_named_like_a_record_is_cleared_by_gc_or_release() {
    let env = Env::new();
    env.make_state_dir();
    std::fs::create_dir_all(env.state.join("holders/x.json")).unwrap();
    cleared_by_gc_or_release(&env, "x", "directory x.json");
}

#[test]
fn huge_record_is_refused_without_reading_it_whole() {
    let env = Env::new();
    let template = env.record_template();
    let path = env.plant_record(&template, "huge.json", "huge", None);
    let mut record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["source"] = json!("x".repeat(20 << 20));
    std::fs::write(&path, record.to_string()).unwrap();
    let baseline = env.gpupin(&["status"], b"");
    let before = env.ledger();
    let run = env.create(&env.bundle("c1", &[("gpupin.count", "1")]), "c1");
    assert_refused(&run, "20 MiB record");
    assert_eq!(env.ledger(), before);
    // Read whole and parsed, 20 MiB costs at least 40 MiB; gpupin's reader stops at 16.
    let grown_mib = (run.max_rss_kib - baseline.max_rss_kib) / 1024;
    assert!(
        grown_mib < 24,
        "peak memory grew by {grown_mib} MiB over `gpupin status` on an empty ledger"
    );
}

#[test]
fn foreign_record_fails_closed_naming_the_path() {
    if !need_root("foreign_record_fails_closed_naming_the_path") {
        return;
    }
    let env = Env::new();
    let template = env.record_template();
    let sleeper = Sleeper::start();
    let path = env.plant_record(&template, "theirs.json", "theirs", Some(sleeper.pid()));
    chown(&path, NOBODY);
    let before = env.ledger();
    let run = env.create(&env.bundle("c1", &[("gpupin.count", "1")]), "c1");
    assert_refused(&run, "foreign record");
    assert_eq!(env.ledger(), before);
    assert_names_path_and_remedy(&run.stderr, &path);
}

#[test]
fn garbage_record_fails_closed_naming_the_path() {
    let env = Env::new();
    env.make_state_dir();
    let path = env.state.join("holders/junk.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "{\"id\": \"junk\", \u{1f4a3}\n").unwrap();
    let before = env.ledger();
    let run = env.create(&env.bundle("c1", &[("gpupin.count", "1")]), "c1");
    assert_refused(&run, "garbage record");
    assert_eq!(env.ledger(), before);
    assert_names_path_and_remedy(&run.stderr, &path);
}

#[track_caller]
fn assert_names_path_and_remedy(stderr: &str, path: &Path) {
    assert!(
        stderr.contains(path.to_str().unwrap()),
        "does not name {}: {stderr}",
        path.display()
    );
    assert!(
        ["gpupin release", "gpupin gc", "remove"]
            .iter()
            .any(|r| stderr.contains(r)),
        "does not say how to clear it: {stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// Defect 4: a full disk

/// A tmpfs mounted on a path for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size_kib: u32) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size_kib}k,mode=0755"))
            .arg("tmpfs")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs on {}", path.display());
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem of `dir` with `dir/filler` until ENOSPC, then frees one page.
fn fill_leaving_one_page(dir: &Path) {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let page = [0u8; 4096];
    // A short write or ENOSPC: the filesystem is full.
    while let Ok(4096) = f.write(&page) {}
    let pages = f.metadata().unwrap().len() / 4096;
    f.set_len((pages - 1) * 4096).unwrap();
}

#[test]
fn full_disk_after_the_record_never_holds_without_a_record_of_the_event() {
    if !need_root("full_disk_after_the_record_never_holds_without_a_record_of_the_event") {
        return;
    }
    let env = Env::new();
    let _tmpfs = Tmpfs::mount(&env.state, 256);
    // Warm the state dir: lock, holders/, cursor and audit.log exist, nothing held.
    allocate_one(&env, "warm");
    assert_eq!(
        env.gpupin(&["release", "--force", "warm"], b"").code,
        Some(0)
    );
    // One free page: the new record fits, the cursor's temp file beside the old one not.
    fill_leaving_one_page(&env.state);
    let bundle = env.bundle("c1", &[("gpupin.count", "1")]);
    let before = env.ledger();
    let run = env.create(&bundle, "c1");
    assert_zero_or_refused(&run, "full disk");
    if run.code == Some(1) {
        let mut after = env.ledger();
        after.remove("filler");
        let mut before = before;
        before.remove("filler");
        assert_eq!(after, before, "held after exit 1: {}", run.stderr);
    } else {
        let record = env.record("c1").expect("exit 0 without a complete record");
        assert_eq!(record["id"], "c1");
        let audit = std::fs::read_to_string(env.state.join("audit.log")).unwrap();
        assert!(audit.contains("c1"), "no audit line for c1: {audit}");
    }
}

// ---------------------------------------------------------------------------------------
// Defects 10, 11: gc

#[test]
fn gc_removes_temp_files_of_dead_processes_only() {
    let env = Env::new();
    allocate_one(&env, "first");
    let live = Sleeper::start();
    let dead = dead_pid();
    let holders = env.state.join("holders");
    let dead_tmp = holders.join(format!(".x.json.gpupin-{dead}-0.tmp"));
    let live_tmp = holders.join(format!(".y.json.gpupin-{}-0.tmp", live.pid()));
    let dead_cursor_tmp = env.state.join(format!(".cursor.gpupin-{dead}-1.tmp"));
    for p in [&dead_tmp, &live_tmp, &dead_cursor_tmp] {
        std::fs::write(p, "{").unwrap();
    }
    let run = env.gpupin(&["gc"], b"");
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert!(!dead_tmp.exists(), "gc left a dead process's temp record");
    assert!(
        !dead_cursor_tmp.exists(),
        "gc left a dead process's temp cursor"
    );
    assert!(live_tmp.exists(), "gc removed a live process's temp file");
}

#[test]
fn gc_reaps_an_unbound_record_created_in_the_future() {
    let env = Env::new();
    allocate_one(&env, "future");
    let path = env.state.join("holders/future.json");
    let mut record = env.record("future").unwrap();
    assert_eq!(
        record["pid"],
        Value::Null,
        "a runtime record is unbound until prestart"
    );
    record["created_at"] = json!(unix_now() + 86_400);
    std::fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
    let run = env.gpupin(&["gc"], b"");
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert!(
        env.record("future").is_none(),
        "a record from tomorrow is never stale"
    );
}

// ---------------------------------------------------------------------------------------
// Defect 12: several bad keys, one stable message

#[test]
fn several_bad_keys_give_the_same_message_every_time() {
    let env = Env::new();
    let bundle = env.bundle("c1", &[]);
    let annotations = json!({
        "gpupin.count": "0", "gpupin.policy": "best", "gpupin.memory": "lots",
        "gpupin.share": "maybe", "gpupin.bogus": "1", "gpupin.wait": "forever",
    });
    let input = state_json("c1", dead_pid(), &bundle, annotations);
    let mut messages = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let run = env.gpupin(&["hook", "prestart"], &input);
        assert_refused(&run, "several bad keys");
        messages.insert(run.stderr);
    }
    assert_eq!(
        messages.len(),
        1,
        "messages differ between runs: {messages:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// Defect 13: a stdout nobody reads

#[track_caller]
fn assert_no_panic(run: &Run, what: &str) {
    assert!(!run.timed_out, "{what}: hung");
    assert_ne!(run.code, Some(101), "{what}: panicked: {}", run.stderr);
    assert!(
        run.stderr.trim_end().lines().count() <= 1,
        "{what}: more than one stderr line: {:?}",
        run.stderr
    );
}

#[test]
fn status_into_a_full_device_does_not_panic() {
    let env = Env::new();
    allocate_one(&env, "c1");
    for args in [&["status"][..], &["status", "--json"]] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut cmd = Command::new(GPUPIN);
        cmd.arg("--config").arg(&env.config).args(args);
        let run = run_bounded_to(&mut cmd, b"", LIMIT, full.into());
        let what = format!("{args:?} > /dev/full");
        assert_no_panic(&run, &what);
        assert_eq!(run.signal, None, "{what}: {}", run.describe());
        assert_ne!(
            run.code,
            Some(0),
            "{what}: success though nothing was written"
        );
    }
}

#[test]
fn status_into_a_closed_pipe_does_not_panic() {
    let env = Env::new();
    allocate_one(&env, "c1");
    for args in [&["status"][..], &["status", "--json"]] {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors pipe(2) returns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors are ours, just created; the read end is closed first,
        // so the child's first write meets a pipe without readers.
        let write_end = unsafe {
            libc::close(fds[0]);
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
        };
        let mut cmd = Command::new(GPUPIN);
        cmd.arg("--config").arg(&env.config).args(args);
        let run = run_bounded_to(&mut cmd, b"", LIMIT, write_end.into());
        let what = format!("{args:?} | (closed)");
        assert_no_panic(&run, &what);
        // Dying of SIGPIPE is what `status | head` expects of a Unix tool; nothing else.
        if let Some(sig) = run.signal {
            assert_eq!(sig, libc::SIGPIPE, "{what}: {}", run.describe());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Defect 16: a relative --gpupin-config

#[test]
fn relative_gpupin_config_never_reaches_the_spec_as_a_relative_path() {
    let env = Env::new();
    let bundle = env.bundle("c1", &[("gpupin.count", "1")]);
    let mut cmd = Command::new(RUNTIME);
    cmd.current_dir(env.dir.path())
        .args(["--gpupin-config", "gpupin.toml", "create", "--bundle"])
        .arg(&bundle)
        .arg("c1");
    let run = run_bounded(&mut cmd, b"", LIMIT);
    assert_zero_or_refused(&run, "relative --gpupin-config");
    let spec: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    if run.code == Some(1) {
        assert!(env.record("c1").is_none(), "held after a refusal");
        return;
    }
    let hooks = spec["hooks"].as_object().expect("hooks in the edited spec");
    for (stage, list) in hooks {
        for hook in list.as_array().unwrap() {
            let args: Vec<&str> = hook["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            for pair in args.windows(2) {
                if pair[0] == "--config" {
                    assert!(
                        Path::new(pair[1]).is_absolute(),
                        "{stage} hook gets a relative config: {args:?}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Hostile bundles

#[test]
fn config_json_symlinked_to_another_file_is_refused() {
    let env = Env::new();
    let bundle = env.bundle("c1", &[("gpupin.count", "1")]);
    let target = env.path("other-config.json");
    std::fs::rename(bundle.join("config.json"), &target).unwrap();
    std::os::unix::fs::symlink(&target, bundle.join("config.json")).unwrap();
    let before = std::fs::read(&target).unwrap();
    let run = env.create(&bundle, "c1");
    assert_refused(&run, "config.json as a symlink");
    assert_eq!(
        std::fs::read(&target).unwrap(),
        before,
        "the link's target changed"
    );
    assert!(
        std::fs::symlink_metadata(bundle.join("config.json"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced"
    );
    assert!(env.record_files().is_empty(), "something is held");
}

#[test]
fn config_json_symlink_in_a_runc_bundle_is_refused() {
    let Some(sb) = Sandbox::new(GPUPIN, "config_json_symlink_in_a_runc_bundle_is_refused") else {
        return;
    };
    let id = sb.id("linked");
    let bundle = sb.bundle_dir(&id);
    gpupin_sandbox::write_bundle(&bundle, &sb.spec().annotation("gpupin.count", "1")).unwrap();
    let target = sb.gpupin.dir.path().join("linked-config.json");
    std::fs::rename(bundle.join("config.json"), &target).unwrap();
    std::os::unix::fs::symlink(&target, bundle.join("config.json")).unwrap();
    let before = std::fs::read(&target).unwrap();
    refusal(
        sb.runc.run_detached(&id, &bundle),
        "config.json as a symlink",
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        before,
        "the link's target changed"
    );
    assert!(sb.gpupin.holder(&id).is_none());
}

#[test]
fn non_json_config_json_is_refused() {
    let env = Env::new();
    let bundle = env.bundle("c1", &[("gpupin.count", "1")]);
    std::fs::write(
        bundle.join("config.json"),
        "ociVersion: 1.0.2\n\u{0}\u{1f4a3}",
    )
    .unwrap();
    assert_refused(&env.create(&bundle, "c1"), "runtime: non-JSON config.json");
    let input = state_json("c2", dead_pid(), &bundle, json!({"gpupin.count": "1"}));
    assert_refused(
        &env.gpupin(&["hook", "prestart"], &input),
        "hook: non-JSON config.json",
    );
    assert!(env.record_files().is_empty(), "something is held");
}

#[test]
fn config_json_of_20_mib_is_refused() {
    let env = Env::new();
    let mut spec = spec_json(json!({"gpupin.count": "1"}), &[]);
    spec["annotations"]["org.example.padding"] = json!("x".repeat(20 << 20));
    let bundle = env.bundle_with("c1", &spec);
    let run = env.create(&bundle, "c1");
    assert_refused(&run, "runtime: 20 MiB config.json");
    assert!(env.record_files().is_empty(), "something is held");
}

#[test]
fn dev_symlinked_to_a_host_dir_gets_nothing_created_there() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "dev_symlinked_to_a_host_dir_gets_nothing_created_there",
    ) else {
        return;
    };
    let rootfs = sb.gpupin.dir.path().join("rootfs-devlink");
    let busybox = gpupin_sandbox::find_static_busybox().unwrap();
    gpupin_sandbox::build_busybox_rootfs(&busybox, &rootfs).unwrap();
    let host_dir = sb.gpupin.dir.path().join("host-dir");
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::remove_dir(rootfs.join("dev")).unwrap();
    std::os::unix::fs::symlink(&host_dir, rootfs.join("dev")).unwrap();
    let mut spec = sb
        .spec()
        .annotation("gpupin.count", "1")
        .without_dev_tmpfs();
    spec.rootfs = rootfs;
    let id = sb.id("devlink");
    let result = sb.start(&id, &spec);
    // runc itself puts its /dev symlinks (fd, stdin, ...) there: not gpupin's doing.
    let created: Vec<_> = std::fs::read_dir(&host_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("nvidia"))
        .collect();
    match result {
        Ok(c) => c.stop().unwrap(),
        Err(err) => {
            let err = err.to_string();
            if let Some(message) = hook_message(&err) {
                assert!(!message.contains('\n'), "{message}");
            }
            assert!(
                sb.gpupin.holder(&id).is_none(),
                "held after a refused start"
            );
        }
    }
    assert!(created.is_empty(), "created in the host dir: {created:?}");
}

#[test]
fn rootfs_at_the_hosts_root_is_refused() {
    let Some(sb) = Sandbox::new(GPUPIN, "rootfs_at_the_hosts_root_is_refused") else {
        return;
    };
    let host_nodes = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir("/dev")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("nvidia"))
            .collect();
        names.sort();
        names
    };
    let before = host_nodes();
    let id = sb.id("hostroot");
    let mut config = sb.spec().annotation("gpupin.count", "1").to_config();
    config["root"]["path"] = json!("/");
    // runc's /dev tmpfs stays: should gpupin create nodes, they land there, not on the
    // host. The cgroup mount goes: runc cannot mount it over the host's own /sys.
    config["mounts"]
        .as_array_mut()
        .unwrap()
        .retain(|m| m["destination"] != "/sys/fs/cgroup");
    let bundle = sb.bundle_dir(&id);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    refusal(sb.runc.run_detached(&id, &bundle), "rootfs /");
    assert!(
        sb.gpupin.holder(&id).is_none(),
        "held after a refused start"
    );
    assert_eq!(host_nodes(), before, "nodes appeared in the host's /dev");
}

#[test]
fn snapshots_record_a_fifo_without_opening_it() {
    // A guard on this suite's own tool: a snapshot that opened a FIFO would hang here.
    let env = Env::new();
    env.make_state_dir();
    mkfifo(&env.state.join("cursor"));
    assert_eq!(env.ledger().get("cursor"), Some(&Entry::Special("fifo")));
}
