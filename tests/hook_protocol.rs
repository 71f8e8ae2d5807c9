//! `gpupin hook` fed OCI state JSON directly, as runc would, for the requests that must be
//! refused before anything is allocated. Needs neither root nor runc (but for the test of a
//! hook without capabilities, which needs root): none of these get as
//! far as touching a container.

use gpupin::parts::{Admission, Config, HolderId, HolderMeta, admit, request};
use gpupin_sandbox::harness::{Gpupin, Sleeper, stderr};
use serde_json::json;
use std::path::Path;
use std::process::Output;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// A bundle with a config.json whose env is `env` and an empty rootfs.
fn bundle(dir: &Path, env: &[&str]) -> std::path::PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs/dev")).unwrap();
    let spec = json!({
        "ociVersion": "1.0.2", "process": {"args": ["sleep", "1"], "env": env},
        "root": {"path": "rootfs"},
    });
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    bundle
}

fn state(id: &str, pid: i32, bundle: &Path, annotations: serde_json::Value) -> String {
    json!({
        "ociVersion": "1.0.2", "id": id, "status": "creating", "pid": pid,
        "bundle": bundle, "annotations": annotations,
    })
    .to_string()
}

/// Puts a live holder of one GPU into the ledger, so that "unchanged" means something.
/// It goes through the library's admission pipeline with no container to give the GPU
/// to (what `gpupin demo --no-containers` does), which needs no root.
fn hold_one_gpu(g: &Gpupin) -> Sleeper {
    let sleeper = Sleeper::start();
    let request = request::from_env(&["GPUPIN_COUNT=1"]).unwrap();
    let admission = Admission {
        holder: &HolderId::new("holder").unwrap(),
        request: &request.expect("a request"),
        meta: HolderMeta {
            source: "test".into(),
            pid: Some(sleeper.pid()),
            ..HolderMeta::default()
        },
        claim: None,
        slurm_job: None,
        labels: Default::default(),
    };
    let config = Config::load(&g.config).unwrap();
    let (record, ()) = admit::admit(&config, admission, |_| {
        Ok::<_, gpupin::parts::ApplyError>(())
    })
    .unwrap();
    assert_eq!(record.gpus.len(), 1);
    sleeper
}

/// Runs prestart with `input`, expects a one-line refusal containing every `needle`, and
/// checks that the ledger (holding one GPU for another container) did not change.
fn assert_refused(g: &Gpupin, input: &str, needles: &[&str]) -> Output {
    let _holder = hold_one_gpu(g);
    let before = g.ledger_snapshot();
    assert_eq!(before.len(), 1, "the ledger should hold one record");
    let out = g.run(&["hook", "prestart"], input);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("gpupin: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
    assert!(out.stdout.is_empty(), "a hook must not write to stdout");
    assert_eq!(g.ledger_snapshot(), before, "the ledger changed");
    release_all(g);
    out
}

/// Empties the ledger between cases, through the CLI as an operator would: the holder's
/// process still runs, so with --force.
fn release_all(g: &Gpupin) {
    let out = g.run(&["release", "--force", "holder"], "");
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn malformed_state_json_is_refused() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    assert_refused(&g, "{\"id\": \"c1\", ", &["OCI state"]);
    assert_refused(&g, "", &["OCI state"]);
}

#[test]
fn missing_bundle_is_refused_naming_it() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let sleeper = Sleeper::start();
    let missing = g.dir.path().join("no-such-bundle");
    let input = state("c1", sleeper.pid(), &missing, json!({"gpupin.count": "1"}));
    assert_refused(&g, &input, &[missing.to_str().unwrap()]);
}

#[test]
fn bad_counts_are_refused() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let sleeper = Sleeper::start();
    let b = bundle(g.dir.path(), &[]);
    for value in ["0", "-1", "two"] {
        let input = state("c1", sleeper.pid(), &b, json!({"gpupin.count": value}));
        let key = format!("gpupin.count={value:?}");
        assert_refused(&g, &input, &[&key, "positive integer"]);
    }
    let input = state("c1", sleeper.pid(), &b, json!({"gpupin.count": "99"}));
    assert_refused(&g, &input, &["99"]);
}

#[test]
fn bad_count_in_env_is_refused() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let sleeper = Sleeper::start();
    let b = bundle(g.dir.path(), &["GPUPIN_COUNT=0"]);
    let input = state("c1", sleeper.pid(), &b, json!({}));
    assert_refused(&g, &input, &["GPUPIN_COUNT=\"0\"", "positive integer"]);
}

#[test]
fn unknown_policy_is_refused() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let sleeper = Sleeper::start();
    let b = bundle(g.dir.path(), &[]);
    let annotations = json!({"gpupin.count": "1", "gpupin.policy": "random"});
    let input = state("c1", sleeper.pid(), &b, annotations);
    assert_refused(
        &g,
        &input,
        &[
            "random",
            "expected one of topology, pack, spread, least-loaded, most-free",
        ],
    );
}

#[test]
fn path_like_container_id_is_refused() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let sleeper = Sleeper::start();
    let b = bundle(g.dir.path(), &[]);
    let input = state("../../etc", sleeper.pid(), &b, json!({"gpupin.count": "1"}));
    assert_refused(&g, &input, &["../../etc", "container id"]);
    assert!(!g.dir.path().join("etc.json").exists());
}

#[test]
fn poststop_of_a_container_that_holds_nothing_succeeds() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let b = bundle(g.dir.path(), &[]);
    let input = state("never-held", 0, &b, json!({"gpupin.count": "1"}));
    let out = g.run(&["hook", "poststop"], &input);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(g.ledger_snapshot().is_empty());
}

/// A runtime that drops capabilities from its hooks: prestart says which one it misses
/// before anything is allocated. Needs root (to have the capabilities to drop) and setpriv.
#[test]
fn a_hook_without_the_capabilities_to_inject_is_refused_before_allocating() {
    let test = "a_hook_without_the_capabilities_to_inject_is_refused_before_allocating";
    if !gpupin_sandbox::harness::need_root(test) {
        return;
    }
    let Some(setpriv) = gpupin_sandbox::harness::required(
        test,
        which("setpriv").ok_or_else(|| "setpriv (util-linux) is not installed".to_string()),
    ) else {
        return;
    };
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let sleeper = Sleeper::start();
    let b = bundle(g.dir.path(), &[]);
    let input = state("c1", sleeper.pid(), &b, json!({"gpupin.count": "1"}));
    let mut cmd = std::process::Command::new(setpriv);
    cmd.args(["--bounding-set=-mknod", "--"])
        .arg(&g.bin)
        .arg("--config")
        .arg(&g.config)
        .args(["hook", "prestart"]);
    let out = gpupin_sandbox::harness::run_with_input(&mut cmd, &input);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "gpupin: cannot give container c1 its GPUs at prestart: this hook runs without CAP_MKNOD (it enters the container's mount namespace and makes device nodes); run the runtime's hooks as root with full capabilities"
    );
    assert!(g.ledger_snapshot().is_empty(), "nothing may be held");
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}
