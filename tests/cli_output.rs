//! The binaries as a shell sees them: output to a full disk or a closed pipe, errors that
//! stay on one line, and config paths that stay valid wherever the hooks later run.
//! Needs neither root nor runc, but for the one test of a user stopped by root's permissions.

use gpupin_sandbox::harness::{Gpupin, stderr, stdout};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

const RUNTIME: &str = env!("CARGO_BIN_EXE_gpupin-runtime");

/// Every command that prints, with what it needs to run without changing anything.
fn printing_commands(dir: &Path) -> Vec<Vec<String>> {
    let daemon_json = dir.join("daemon.json").display().to_string();
    let hooks = dir.join("hooks.d").display().to_string();
    let cases: &[&[&str]] = &[
        &["status"],
        &["status", "--json"],
        &["inventory"],
        &["inventory", "--json"],
        &["pick", "--count", "2"],
        &["pick", "--count", "2", "--json"],
        &["pick", "--count", "2", "--explain"],
        &["gc"],
        &["release", "--ignore-missing", "nobody"],
        &["log"],
        &["usage"],
        &["usage", "--json"],
        &[
            "install",
            "docker",
            "--dry-run",
            "--daemon-json",
            &daemon_json,
        ],
        &[
            "uninstall",
            "docker",
            "--dry-run",
            "--daemon-json",
            &daemon_json,
        ],
        &[
            "doctor",
            "--daemon-json",
            &daemon_json,
            "--hooks-dir",
            &hooks,
        ],
        &[
            "doctor",
            "--json",
            "--daemon-json",
            &daemon_json,
            "--hooks-dir",
            &hooks,
        ],
        &["install", "podman", "--dry-run", "--dir", &hooks],
        &["uninstall", "podman", "--dry-run", "--dir", &hooks],
    ];
    cases
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect()
}

fn gpupin(g: &Gpupin, args: &[String], stdout: Stdio) -> Output {
    Command::new(GPUPIN)
        .env_remove("GPUPIN_CONFIG")
        .arg("--config")
        .arg(&g.config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// The one stderr line of a failed command.
fn one_error_line(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(
        err.starts_with("gpupin: ") && err.ends_with('\n'),
        "{err:?}"
    );
    err.trim_end().to_string()
}

#[test]
fn a_full_stdout_is_one_error_line_not_a_panic() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    for args in printing_commands(g.dir.path()) {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = gpupin(&g, &args, Stdio::from(full));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let line = one_error_line(&out);
        assert!(
            line.contains("writing to stdout") && line.contains("No space left on device"),
            "{args:?}: {line}"
        );
    }
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    for args in printing_commands(g.dir.path()) {
        // `gpupin status | true`, with `true` long gone before gpupin writes.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = gpupin(&g, &args, Stdio::from(writer));
        // 141 = 128 + SIGPIPE: what a shell reports for a tool the pipe signal ended.
        assert_eq!(out.status.code(), Some(141), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

#[test]
fn a_newline_in_a_path_does_not_start_a_second_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpupin\nfake: second line.toml");
    let out = Command::new(GPUPIN)
        .arg("--config")
        .arg(&config)
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let line = one_error_line(&out);
    assert!(line.contains(r"gpupin\nfake: second line.toml"), "{line}");
}

#[test]
fn a_usage_error_is_one_line() {
    for args in [
        &["hook"][..],
        &["--bogus\nfake: line", "status"],
        &["pick", "--count"],
    ] {
        let out = Command::new(GPUPIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let line = one_error_line(&out);
        assert!(line.ends_with(" --help)"), "{line}");
    }
}

/// A mistyped command or flag gets what was meant and the help of the command at hand;
/// the request options' errors speak in flags; `--gpus` is `--count`.
#[test]
fn a_mistake_on_the_command_line_gets_a_hint_in_its_own_words() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let run = |args: &[&str]| {
        gpupin(
            &g,
            &args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            Stdio::piped(),
        )
    };
    for (args, code, wanted) in [
        (
            &["stat"][..],
            2,
            "gpupin: unrecognized subcommand 'stat'; did you mean 'install' or 'status'? (see gpupin --help)",
        ),
        (
            &["pick", "--cout", "1"],
            2,
            "gpupin: unexpected argument '--cout' found; did you mean '--count'? (see gpupin pick --help)",
        ),
        (
            &["pick", "--count", "1", "--devices", "0"],
            1,
            "gpupin: --count and --devices exclude each other: give one of them",
        ),
        (
            &["pick", "--memory", "4GiB"],
            1,
            "gpupin: --memory was given without --count or --devices",
        ),
        (
            &["pick", "--count", "0"],
            1,
            "gpupin: invalid --count=\"0\": expected a positive integer or \"all\"",
        ),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert_eq!(one_error_line(&out), wanted, "{args:?}");
    }
    let by_count: Value =
        serde_json::from_str(&stdout(&run(&["pick", "--count", "2", "--json"]))).unwrap();
    let by_gpus: Value =
        serde_json::from_str(&stdout(&run(&["pick", "--gpus", "2", "--json"]))).unwrap();
    assert_eq!(by_count, by_gpus);
}

/// A copy of `g`'s config as `cfg.toml` in a fresh working directory.
fn relative_config(g: &Gpupin, extra: &str) -> tempfile::TempDir {
    let cwd = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&g.config).unwrap();
    std::fs::write(cwd.path().join("cfg.toml"), text + extra).unwrap();
    cwd
}

#[test]
fn install_docker_writes_an_absolute_config_path() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let cwd = relative_config(&g, "");
    let absolute = cwd.path().join("cfg.toml");
    let dry_run = [
        "install",
        "docker",
        "--dry-run",
        "--daemon-json",
        "daemon.json",
    ];
    // From --config and from $GPUPIN_CONFIG alike: dockerd sees neither our cwd nor our env.
    let by_flag = Command::new(GPUPIN)
        .env_remove("GPUPIN_CONFIG")
        .args(["--config", "cfg.toml"])
        .args(dry_run)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let by_env = Command::new(GPUPIN)
        .env("GPUPIN_CONFIG", "cfg.toml")
        .args(dry_run)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    for out in [by_flag, by_env] {
        assert!(out.status.success(), "{}", stderr(&out));
        let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(
            doc["runtimes"]["gpupin"]["runtimeArgs"],
            json!(["--gpupin-config", absolute])
        );
    }
}

#[test]
fn install_podman_writes_an_absolute_config_path() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let cwd = relative_config(&g, "");
    let absolute = cwd.path().join("cfg.toml").display().to_string();
    let dry_run = ["install", "podman", "--dry-run", "--dir", "hooks.d"];
    let by_flag = Command::new(GPUPIN)
        .env_remove("GPUPIN_CONFIG")
        .args(["--config", "cfg.toml"])
        .args(dry_run)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let by_env = Command::new(GPUPIN)
        .env("GPUPIN_CONFIG", "cfg.toml")
        .args(dry_run)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    for out in [by_flag, by_env] {
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(text.contains(&format!("{absolute:?}")), "{text}");
        assert!(!text.contains("\"cfg.toml\""), "{text}");
    }
}

/// A bundle asking for one GPU by annotation, and a stand-in for runc that does nothing.
fn bundle_and_fake_runc(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let spec = json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sleep", "1"], "env": ["PATH=/bin"]},
        "root": {"path": "rootfs"},
        "annotations": {"gpupin.count": "1"},
    });
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    let runc = dir.join("fake-runc");
    std::fs::write(&runc, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&runc, std::fs::Permissions::from_mode(0o755)).unwrap();
    (bundle, runc)
}

#[test]
fn gpupin_runtime_refuses_a_relative_config() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let scratch = tempfile::tempdir().unwrap();
    let (bundle, runc) = bundle_and_fake_runc(scratch.path());
    let cwd = relative_config(&g, &format!("runtime = {:?}\n", runc.to_str().unwrap()));
    let spec_before = std::fs::read(bundle.join("config.json")).unwrap();
    let create = ["create", "--bundle", bundle.to_str().unwrap(), "ctr1"];
    let by_flag = Command::new(RUNTIME)
        .env_remove("GPUPIN_CONFIG")
        .args(["--gpupin-config", "cfg.toml"])
        .args(create)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let by_env = Command::new(RUNTIME)
        .env("GPUPIN_CONFIG", "cfg.toml")
        .args(create)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    for out in [by_flag, by_env] {
        // Under dockerd the cwd is the bundle: the hooks would look for cfg.toml there.
        let spec: Value =
            serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
        assert!(
            !spec.to_string().contains("\"cfg.toml\""),
            "relative config injected: {spec:#}"
        );
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let line = one_error_line(&out);
        assert!(
            line.contains("\"cfg.toml\"") && line.contains("absolute"),
            "{line}"
        );
        assert_eq!(
            std::fs::read(bundle.join("config.json")).unwrap(),
            spec_before
        );
        assert_eq!(g.ledger_snapshot().len(), 0, "nothing held after a refusal");
    }
    // The same config named by its absolute path is taken, and so the hooks get.
    let absolute = cwd.path().join("cfg.toml");
    let out = Command::new(RUNTIME)
        .env_remove("GPUPIN_CONFIG")
        .arg("--gpupin-config")
        .arg(&absolute)
        .args(create)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let spec = std::fs::read_to_string(bundle.join("config.json")).unwrap();
    assert!(
        spec.contains(&format!("{:?}", absolute.display().to_string())),
        "{spec}"
    );
}

/// A user who is not root, stopped by a permission only root has (the ledger, daemon.json),
/// is told to use sudo rather than shown a bare "Permission denied" on a temp file.
#[test]
fn a_user_stopped_by_roots_permissions_is_told_to_use_sudo() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !gpupin_sandbox::harness::need_root(
        "a_user_stopped_by_roots_permissions_is_told_to_use_sudo",
    ) {
        return;
    }
    let open = tempfile::Builder::new()
        .prefix("gpupin-cli-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let closed = open.path().join("root-only");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = open.path().join("gpupin.toml");
    std::fs::write(
        &config,
        format!(
            "inventory = \"sim:nvswitch8\"\nstate_dir = {:?}\n",
            closed.join("state").display().to_string()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let daemon_json = closed.join("daemon.json").display().to_string();
    for args in [
        &["gc"][..],
        &["install", "docker", "--daemon-json", &daemon_json],
    ] {
        let out = Command::new(GPUPIN)
            .arg("--config")
            .arg(&config)
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let line = one_error_line(&out);
        assert!(
            line.starts_with("gpupin: this needs root: run it with sudo: ")
                && line.contains("Permission denied"),
            "{args:?}: {line}"
        );
    }
}

/// `gpupin config check FILE`: a good file is printed whole as gpupin uses it (the
/// defaults included, as TOML that reads back the same: here through check itself), a bad
/// one is one line with its line and the key meant, exit 1.
#[test]
fn config_check_prints_the_configuration_or_the_one_line_that_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "policy = \"spread\"\n[limits]\nmax_gpus_per_user = 2\n",
    )
    .unwrap();
    let check = |file: &Path| {
        Command::new(GPUPIN)
            .env_remove("GPUPIN_CONFIG")
            .args(["config", "check"])
            .arg(file)
            .output()
            .unwrap()
    };
    let out = check(&good);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = stdout(&out);
    assert!(
        printed.starts_with(&format!("# {} is valid;", good.display())),
        "{printed}"
    );
    for line in [
        "policy = \"spread\"",
        "state_dir = \"/run/gpupin\"",
        "max_gpus_per_user = 2",
        "max_waiting_per_user = 4",
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "{line} not in {printed}"
        );
    }
    let again = dir.path().join("again.toml");
    std::fs::write(&again, &printed).unwrap();
    let reprinted = stdout(&check(&again));
    assert_eq!(
        reprinted.lines().skip(1).collect::<Vec<_>>(),
        printed.lines().skip(1).collect::<Vec<_>>()
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[limits]\nmax_gpus_per_user = 2\npolcy = \"pack\"\n").unwrap();
    let out = check(&bad);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        one_error_line(&out),
        format!(
            "gpupin: invalid config {}: line 3 in [limits]: unknown key \"polcy\" in [limits]; did you mean the top-level \"policy\"? Top-level keys go above the first [table]",
            bad.display()
        )
    );
}

/// What bash offers after `words` (the last one is being completed), with gpupin's
/// completion script loaded and the test's gpupin first on PATH.
fn bash_completes(g: &Gpupin, words: &[&str]) -> Vec<String> {
    let script = g.dir.path().join("gpupin.bash");
    let out = gpupin(g, &["completions".into(), "bash".into()], Stdio::piped());
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(&script, &out.stdout).unwrap();
    let mut line = vec!["gpupin", "--config"];
    let config = g.config.display().to_string();
    line.push(&config);
    line.extend_from_slice(words);
    let quoted: Vec<String> = line.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; \
         _gpupin_holders_or_clap gpupin \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        line.len() - 1
    );
    let bin_dir = Path::new(GPUPIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-c", &program])
        .env("PATH", path)
        .env_remove("GPUPIN_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut offered: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    offered.retain(|w| !w.is_empty());
    offered
}

#[test]
fn tab_after_release_evict_key_and_log_holder_offers_the_holders_status_shows() {
    if !gpupin_sandbox::harness::need_root(
        "tab_after_release_evict_key_and_log_holder_offers_the_holders_status_shows",
    ) {
        return;
    }
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    for (id, device) in [("maint-gpu7", "7"), ("alpha", "0")] {
        let args: Vec<String> = ["hold", id, "--devices", device, "--until-release"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = gpupin(&g, &args, Stdio::piped());
        assert!(out.status.success(), "{}", stderr(&out));
    }
    for command in ["release", "evict", "key"] {
        assert_eq!(
            bash_completes(&g, &[command, ""]),
            ["alpha", "maint-gpu7"],
            "{command}"
        );
    }
    assert_eq!(
        bash_completes(&g, &["release", "--force", "m"]),
        ["maint-gpu7"]
    );
    assert_eq!(
        bash_completes(&g, &["log", "--holder", ""]),
        ["alpha", "maint-gpu7"]
    );
    // Flags stay clap's, and hold's new id is not an existing holder's.
    assert_eq!(
        bash_completes(&g, &["release", "--ig"]),
        ["--ignore-missing"]
    );
    assert!(!bash_completes(&g, &["hold", ""]).contains(&"alpha".to_string()));
    // The same arguments in zsh and fish ask `gpupin holders`; hold's id does not.
    let script = |shell: &str| {
        let out = gpupin(&g, &["completions".into(), shell.into()], Stdio::piped());
        stdout(&out)
    };
    let zsh = script("zsh");
    assert!(zsh.starts_with("#compdef gpupin\n"), "{zsh}");
    let asking: Vec<&str> = zsh
        .lines()
        .filter(|l| l.ends_with(":_gpupin_holders' \\"))
        .collect();
    assert_eq!(
        asking.len(),
        4,
        "release, evict, key, log --holder: {asking:#?}"
    );
    assert!(asking.iter().all(|l| !l.contains("slurm-")), "{asking:#?}");
    let fish = script("fish");
    assert!(
        fish.contains("complete -c gpupin -n \"__fish_seen_subcommand_from release evict key\" -f -a \"(gpupin holders 2>/dev/null)\""),
        "{fish}"
    );
}
