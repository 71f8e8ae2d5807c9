//! Logging as an admin sees it (issue 9): off unless `GPUPIN_LOG` or the config's `log`
//! key turns it on, then the decision lines on stderr, never on stdout, and never a line
//! a container's text could break or forge. Needs neither root nor runc: the prestart
//! hook is refused before it would touch a container, precreate only edits a spec, and
//! the shim runs a fake runtime.

use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const RUNTIME: &str = env!("CARGO_BIN_EXE_gpupin-runtime");
const LEVELS: [&str; 5] = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"];

/// A simulated eight-GPU machine: a config (with `extra` keys), a state dir, a bundle.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new(extra: &str) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("fake-runc");
        // The real runtime stands in as a script that only says it ran.
        std::fs::write(&runtime, "#!/bin/sh\necho fake-runc ran\n").unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = format!(
            "state_dir = \"state\"\naudit_log = \"state/audit.log\"\ninventory = \"sim:nvswitch8\"\nruntime = \"{}\"\n{extra}\n",
            runtime.display()
        );
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        std::fs::create_dir(dir.path().join("bundle")).unwrap();
        let m = Machine { dir };
        m.write_spec(&spec(json!({})));
        m
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    fn write_spec(&self, spec: &Value) {
        std::fs::write(self.bundle().join("config.json"), spec.to_string()).unwrap();
    }

    /// The OCI state of container `c1` with `annotations`, as runc hands it to a hook.
    fn state(&self, annotations: Value) -> Vec<u8> {
        json!({
            "ociVersion": "1.0.2", "id": "c1", "status": "created",
            "pid": std::process::id(), "bundle": self.bundle(),
            "annotations": annotations,
        })
        .to_string()
        .into_bytes()
    }

    /// `gpupin ARGS` with `stdin`, in the environment a runtime gives a hook (nearly
    /// empty) plus `env`.
    fn gpupin(&self, env: &[(&str, &str)], args: &[&str], stdin: &[u8]) -> Output {
        let mut cmd = Command::new(GPUPIN);
        cmd.arg("--config").arg(self.config()).args(args);
        run(cmd, env, stdin)
    }

    fn hook(&self, env: &[(&str, &str)], stage: &str, stdin: &[u8]) -> Output {
        self.gpupin(env, &["hook", stage], stdin)
    }

    /// `gpupin-runtime create` of container `c1` on the bundle.
    fn create(&self, env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(RUNTIME);
        cmd.arg("--gpupin-config")
            .arg(self.config())
            .args(["create", "--bundle"])
            .arg(self.bundle())
            .arg("c1");
        run(cmd, env, b"")
    }
}

fn run(mut cmd: Command, env: &[(&str, &str)], stdin: &[u8]) -> Output {
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn spec(annotations: Value) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": ["PATH=/bin"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// Log lines (`<time> LEVEL target: message fields`) on stderr, and the other lines.
fn split(err: &str) -> (Vec<&str>, Vec<&str>) {
    err.lines().partition(|l| is_log_line(l))
}

fn is_log_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let time = words.next().unwrap_or_default();
    let level = words.next().unwrap_or_default();
    time.starts_with("20") && time.ends_with('Z') && LEVELS.contains(&level)
}

/// The log line whose message is `message`.
fn event<'a>(logs: &[&'a str], message: &str) -> &'a str {
    logs.iter()
        .find(|l| l.contains(&format!(": {message} ")) || l.ends_with(&format!(": {message}")))
        .unwrap_or_else(|| panic!("no {message:?} line in {logs:#?}"))
}

const TOO_MANY: &str = "gpupin: count 9 is more than the 8 GPUs of this machine\n";

#[test]
fn without_logging_a_refusal_is_exactly_the_usual_one_line() {
    let m = Machine::new("");
    let out = m.hook(&[], "prestart", &m.state(json!({"gpupin.count": "9"})));
    assert!(!out.status.success());
    assert_eq!(stderr(&out), TOO_MANY);
    assert!(out.stdout.is_empty());
}

#[test]
fn gpupin_log_debug_shows_why_the_hook_refused() {
    let m = Machine::new("");
    let state = m.state(json!({"gpupin.count": "9"}));
    let out = m.hook(&[("GPUPIN_LOG", "debug")], "prestart", &state);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "logs never go to stdout");
    let err = stderr(&out);
    let (logs, others) = split(&err);
    assert_eq!(others, [TOO_MANY.trim_end()], "{err}");
    assert!(err.ends_with(TOO_MANY), "the usual line comes last: {err}");
    let hook = event(&logs, "hook");
    assert!(
        hook.contains(" DEBUG ")
            && hook.contains("stage=\"prestart\"")
            && hook.contains("container=c1"),
        "{hook}"
    );
    let request = event(&logs, "request");
    assert!(
        request.contains("origin=Annotations") && request.contains("Count(9)"),
        "{request}"
    );
    let machine = event(&logs, "machine");
    assert!(
        machine.contains("inventory=sim:nvswitch8") && machine.contains("live_read=false"),
        "{machine}"
    );
    let choosing = event(&logs, "choosing");
    assert!(
        choosing.contains("policy=\"topology\"")
            && choosing.contains("free=[0, 1, 2, 3, 4, 5, 6, 7]"),
        "{choosing}"
    );
    let refused = event(&logs, "refused");
    assert!(
        refused.contains(" WARN ")
            && refused.contains("error=count 9 is more than the 8 GPUs of this machine"),
        "{refused}"
    );
}

#[test]
fn the_config_key_turns_logging_on_for_hooks_in_an_empty_environment() {
    let m = Machine::new("log = \"debug\"");
    let out = m.hook(&[], "prestart", &m.state(json!({"gpupin.count": "9"})));
    let err = stderr(&out);
    let (logs, others) = split(&err);
    assert_eq!(others, [TOO_MANY.trim_end()], "{err}");
    event(&logs, "choosing");
    event(&logs, "refused");
}

#[test]
fn the_env_var_wins_over_the_config_key() {
    let m = Machine::new("log = \"debug\"");
    let state = m.state(json!({"gpupin.count": "9"}));
    let off = m.hook(&[("GPUPIN_LOG", "off")], "prestart", &state);
    assert_eq!(stderr(&off), TOO_MANY);
    let warn = m.hook(&[("GPUPIN_LOG", "warn")], "prestart", &state);
    let err = stderr(&warn);
    let (logs, _) = split(&err);
    assert_eq!(logs.len(), 1, "{err}");
    assert!(
        logs[0].contains(" WARN ") && logs[0].contains("refused"),
        "{err}"
    );
}

#[test]
fn an_invalid_gpupin_log_is_one_warning_and_logging_stays_off() {
    let m = Machine::new("log = \"debug\"");
    let state = m.state(json!({"gpupin.count": "9"}));
    let out = m.hook(&[("GPUPIN_LOG", "loud\nDEBUG forged")], "prestart", &state);
    assert_eq!(
        stderr(&out),
        format!(
            "gpupin: warning: invalid log level \"loud\\nDEBUG forged\": expected one of error, warn, info, debug, trace, off; logging off\n{TOO_MANY}"
        )
    );
}

#[test]
fn an_invalid_config_key_is_one_line_naming_it() {
    let m = Machine::new("log = \"verbose\"");
    let out = m.hook(&[], "prestart", &m.state(json!({"gpupin.count": "1"})));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("log \"verbose\": expected one of error, warn, info, debug, trace, off"),
        "{err}"
    );
}

#[test]
fn a_container_without_a_request_logs_nothing_and_reads_no_config() {
    let m = Machine::new("log = \"debug\"");
    // The config is not even read: a broken one would be an error.
    std::fs::write(m.config(), "log = \"verbose\"").unwrap();
    let out = m.hook(&[], "prestart", &m.state(json!({"org.example": "1"})));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stderr.is_empty() && out.stdout.is_empty());
}

#[test]
fn newlines_in_a_containers_annotations_stay_inside_their_log_line() {
    let m = Machine::new("");
    let forged =
        "\n2026-01-01T00:00:00.000000Z  INFO gpupin::state::ledger: released holder=victim";
    for annotations in [
        json!({"gpupin.count": "1", format!("gpupin.count{forged}"): "1"}),
        json!({"gpupin.count": format!("1{forged}")}),
        json!({"gpupin.count": "1", "gpupin.model": format!("H100{forged}")}),
    ] {
        let out = m.hook(
            &[("GPUPIN_LOG", "trace")],
            "prestart",
            &m.state(annotations.clone()),
        );
        let err = stderr(&out);
        let (logs, others) = split(&err);
        assert_eq!(others.len(), 1, "{annotations}: {err}");
        assert!(others[0].starts_with("gpupin: "), "{err}");
        assert!(!err.contains("\n2026-01-01"), "a forged line: {err}");
        assert!(event(&logs, "refused").contains(r"\n2026-01-01"), "{err}");
    }
}

#[test]
fn precreate_logs_on_stderr_and_keeps_stdout_the_spec() {
    let m = Machine::new("");
    let input = spec(json!({"gpupin.count": "2"})).to_string();
    let out = m.hook(&[("GPUPIN_LOG", "debug")], "precreate", input.as_bytes());
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let edited: Value = serde_json::from_slice(&out.stdout).expect("stdout is the spec alone");
    let assigned = edited["annotations"]["gpupin.assigned"].as_str().unwrap();
    let (logs, others) = split(&err);
    assert_eq!(others.len(), 1, "the usual line: {err}");
    assert!(others[0].ends_with(&format!("holds {assigned}")), "{err}");
    assert!(
        event(&logs, "hook").contains("stage=\"precreate\""),
        "{err}"
    );
    assert!(event(&logs, "chose").contains("chose=[0, 1]"), "{err}");
    let allocated = event(&logs, "allocated");
    for uuid in assigned.split(',') {
        assert!(allocated.contains(uuid), "{allocated}");
    }
}

#[test]
fn pick_shows_what_the_policy_saw_and_chose_and_stdout_is_unchanged() {
    let m = Machine::new("");
    let quiet = m.gpupin(&[], &["pick", "--count", "2"], b"");
    let loud = m.gpupin(&[("GPUPIN_LOG", "debug")], &["pick", "--count", "2"], b"");
    assert!(quiet.status.success() && quiet.stderr.is_empty());
    assert_eq!(loud.stdout, quiet.stdout);
    let err = stderr(&loud);
    let (logs, others) = split(&err);
    assert!(others.is_empty(), "{err}");
    assert!(event(&logs, "chose").contains("chose=[0, 1]"), "{err}");
}

#[test]
fn the_shim_says_whether_it_passes_a_create_through_or_edits_the_spec() {
    let m = Machine::new("");
    let debug = [("GPUPIN_LOG", "debug")];
    let plain = m.create(&debug);
    let err = stderr(&plain);
    assert!(plain.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "fake-runc ran\n");
    event(&split(&err).0, "no request: passing through unchanged");

    m.write_spec(&spec(json!({"gpupin.count": "1"})));
    let asks = m.create(&debug);
    let err = stderr(&asks);
    assert!(asks.status.success(), "{err}");
    let (logs, others) = split(&err);
    assert!(others.is_empty(), "{err}");
    let edited = event(&logs, "spec edited; running the real runtime");
    assert!(
        edited.contains("container=c1") && edited.contains("GPU-"),
        "{edited}"
    );

    // Without logging the shim says nothing on stderr.
    m.write_spec(&spec(json!({})));
    let quiet = m.create(&[]);
    assert!(quiet.status.success() && quiet.stderr.is_empty());
}

#[test]
fn reaping_a_stale_holder_is_logged_at_info() {
    // A claim no container bound within claim_grace is stale. No driver: the notice
    // that a container gets no driver files is a line of its own (tested below).
    let m = Machine::new("claim_grace = \"1ms\"\ndriver = \"none\"");
    let all = spec(json!({"gpupin.count": "8"})).to_string();
    let first = m.hook(&[], "precreate", all.as_bytes());
    assert!(first.status.success(), "{}", stderr(&first));
    std::thread::sleep(std::time::Duration::from_millis(10));
    let out = m.hook(&[("GPUPIN_LOG", "info")], "precreate", all.as_bytes());
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let (logs, _) = split(&err);
    assert_eq!(
        logs.len(),
        1,
        "info shows the reap and no debug line: {err}"
    );
    let reaped = event(&logs, "reaped a stale holder");
    assert!(
        reaped.contains(" INFO ")
            && reaped.contains("holder=claim-")
            && reaped.contains("pid=None"),
        "{reaped}"
    );
}

#[test]
fn bind_and_release_of_a_precreated_container_are_logged() {
    let m = Machine::new("log = \"debug\"");
    let input = spec(json!({"gpupin.count": "1"})).to_string();
    let pre = m.hook(&[], "precreate", input.as_bytes());
    assert!(pre.status.success(), "{}", stderr(&pre));
    let edited: Value = serde_json::from_slice(&pre.stdout).unwrap();
    let gpu = edited["annotations"]["gpupin.assigned"].as_str().unwrap();
    m.write_spec(&edited);
    let state = m.state(edited["annotations"].clone());

    let start = m.hook(&[], "prestart", &state);
    let err = stderr(&start);
    assert!(start.status.success(), "{err}");
    let (logs, _) = split(&err);
    assert!(event(&logs, "hook").contains("task=\"bind\""), "{err}");
    let bound = event(&logs, "bound");
    assert!(
        bound.contains("container=c1") && bound.contains(gpu),
        "{bound}"
    );

    let stop = m.hook(&[], "poststop", &state);
    let err = stderr(&stop);
    assert!(stop.status.success(), "{err}");
    let released = event(&split(&err).0, "released");
    assert!(
        released.contains("holder=c1") && released.contains(gpu),
        "{released}"
    );
}

#[test]
fn with_gpupin_log_a_container_without_a_request_says_so() {
    let m = Machine::new("");
    let out = m.hook(
        &[("GPUPIN_LOG", "debug")],
        "prestart",
        &m.state(json!({"org.example": "1"})),
    );
    let err = stderr(&out);
    assert!(out.status.success() && out.stdout.is_empty(), "{err}");
    let (logs, others) = split(&err);
    assert!(others.is_empty(), "{err}");
    let line = event(&logs, "no request: nothing to do");
    assert!(line.contains("container=\"c1\""), "{line}");
}

#[test]
fn the_choice_says_why_each_other_gpu_was_excluded() {
    let m = Machine::new("max_shared = 1");
    let exclusive = spec(json!({"gpupin.devices": "0"})).to_string();
    let shared = spec(json!({"gpupin.devices": "1", "gpupin.share": "shared"})).to_string();
    for input in [&exclusive, &shared] {
        let out = m.hook(&[], "precreate", input.as_bytes());
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let choosing = |request: Value| {
        let out = m.hook(
            &[("GPUPIN_LOG", "debug")],
            "precreate",
            spec(request).to_string().as_bytes(),
        );
        event(&split(&stderr(&out)).0, "choosing").to_string()
    };
    let line = choosing(json!({"gpupin.count": "1", "gpupin.share": "shared"}));
    assert!(
        line.contains("free=[2, 3, 4, 5, 6, 7]")
            && line.contains(r#"excluded=["0:held", "1:shared-full"]"#),
        "{line}"
    );
    // Filters are checked first: every GPU of this H100 machine fails gpupin.model=A100.
    let line = choosing(json!({"gpupin.count": "1", "gpupin.model": "A100"}));
    assert!(
        line.contains("free=[]") && line.contains(r#""7:model"]"#),
        "{line}"
    );
}

#[test]
fn a_container_without_a_cdi_spec_is_told_once_it_gets_no_driver_files() {
    let m = Machine::new("cdi_spec_dirs = [\"no-cdi-here\"]");
    let one = spec(json!({"gpupin.count": "1"})).to_string();
    let out = m.hook(&[("GPUPIN_LOG", "warn")], "precreate", one.as_bytes());
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    // Besides the log, the hook's own line saying what the claim holds.
    let (logs, _) = split(&err);
    assert_eq!(logs.len(), 1, "{err}");
    let notice = event(
        &logs,
        "no nvidia.com/gpu CDI spec found: the container gets no driver libraries from gpupin",
    );
    assert!(
        notice.contains(" WARN ")
            && notice.contains("gets no driver libraries")
            && notice.contains("no-cdi-here"),
        "{notice}"
    );
}
