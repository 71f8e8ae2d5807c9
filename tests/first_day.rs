//! A student's and an admin's first day (issue 32): what a user who follows the docs
//! sees from the `gpupin` command against a real `gpupin serve`, as throwaway users.

#[allow(dead_code)]
mod exec_support;

use exec_support::{Daemon, Job, User, gpupin, ok, requirements, scratch, until_clean};
use gpupin_sandbox::harness;
use std::process::{Command, Stdio};

/// A user with only `GPUPIN_SOCKET` set (as the Python client's docs have them do)
/// reaches the daemon from `gpupin exec` too: no `--config`, no `GPUPIN_CONFIG`, so the
/// config alone would point at /run/gpupin.
#[test]
fn gpupin_socket_alone_takes_gpupin_exec_to_the_daemon() {
    let test = "gpupin_socket_alone_takes_gpupin_exec_to_the_daemon";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let user = User::create("sock");
    let _daemon = Daemon::start(&g);
    let mut cmd = Command::new(&g.bin);
    cmd.args([
        "exec",
        "--count",
        "1",
        "--",
        "sh",
        "-c",
        "echo GOT $CUDA_VISIBLE_DEVICES",
    ])
    .current_dir(scratch(&g))
    .env_remove("GPUPIN_CONFIG")
    .env("GPUPIN_SOCKET", g.state_dir.join("gpupin.sock"))
    .stdin(Stdio::null());
    user.owns(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "gpupin exec failed: {}",
        harness::stderr(&out)
    );
    assert!(
        harness::stdout(&out).starts_with("GOT "),
        "{}",
        harness::stdout(&out)
    );
}

/// `gpupin config check` on the mistakes of a first config: a count of GPUs written as a
/// word, and a typo in a user's limits table, each named as the admin wrote it.
#[test]
fn config_check_names_a_word_for_a_count_and_a_typo_in_a_users_table_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let file = dir.path().join("config.toml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(exec_support::GPUPIN)
            .args(["config", "check"])
            .arg(&file)
            .env_remove("GPUPIN_CONFIG")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let line = harness::stderr(&out);
        line.replace(&file.display().to_string(), "FILE")
    };
    assert_eq!(
        check("inventory = \"sim:nvswitch8\"\n[limits]\nmax_gpus_per_user = \"two\"\n"),
        "gpupin: invalid config FILE: line 3 in [limits]: max_gpus_per_user = \"two\" is not a whole number: expected a whole number of GPUs, such as max_gpus_per_user = 2\n"
    );
    assert_eq!(
        check("inventory = \"sim:nvswitch8\"\n[limits.user.alice]\nmax_gpus = 2\n"),
        "gpupin: invalid config FILE: line 2 in [limits.user.alice]: unknown key \"user\"; did you mean \"users\"?\n"
    );
}

/// `--memory 40gb` and `40GB`, as GPU names write sizes, ask for what `40GiB` does.
#[test]
fn memory_in_gb_as_card_names_write_it_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        format!(
            "inventory = \"sim:nvswitch8\"\nstate_dir = \"{}\"\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let pick = |memory: &str| {
        let out = Command::new(exec_support::GPUPIN)
            .arg("--config")
            .arg(&file)
            .args(["pick", "--count", "1", "--memory", memory])
            .output()
            .unwrap();
        assert!(out.status.success(), "{memory}: {}", harness::stderr(&out));
        harness::stdout(&out)
    };
    let wanted = pick("40GiB");
    assert_eq!(pick("40gb"), wanted);
    assert_eq!(pick("40GB"), wanted);
}

/// A user outside the config's `socket_group`: `gpupin exec`, the Python client and
/// `gpupin doctor` each name the group and the command an admin runs.
#[test]
fn a_user_outside_the_socket_group_is_told_the_group_and_how_to_join() {
    let test = "a_user_outside_the_socket_group_is_told_the_group_and_how_to_join";
    if !requirements(test) {
        return;
    }
    let user = User::create("outg");
    let group = exec_support::Group::create("sockg", &[]);
    let g = gpupin(&format!("socket_group = \"{}\"", group.name));
    let _daemon = Daemon::start(&g);
    let out = exec_support::run(&g, Some(&user), &["exec", "--count", "1", "--", "true"]);
    assert!(!out.status.success());
    let socket = g.state_dir.join("gpupin.sock");
    assert_eq!(
        harness::stderr(&out),
        format!(
            "gpupin: cannot reach gpupin serve at {}: permission denied: only members of group {group} may use it (ask an admin to add you: usermod -aG {group} {user}; then log in again)\n",
            socket.display(),
            group = group.name,
            user = user.name
        )
    );
    let out = exec_support::run(&g, Some(&user), &["doctor"]);
    let doctor = harness::stdout(&out);
    let line = doctor
        .lines()
        .find(|l| l.contains("gpupin serve at"))
        .unwrap_or_else(|| panic!("no line on gpupin serve:\n{doctor}"));
    assert!(
        line.contains(&format!(
            "you may not use it: only members of group {} may run gpupin exec, hold or release as themselves",
            group.name
        )),
        "{doctor}"
    );
    assert!(
        doctor.contains(&format!(
            "ask an admin to add you: usermod -aG {} {}; then log in again",
            group.name, user.name
        )),
        "{doctor}"
    );
}

/// `gpupin hold --for 3h` (an admin's maintenance hold) shows when it ends in `status
/// --long`, where a hold without a process would say "until released".
#[test]
fn a_hold_for_three_hours_shows_its_end_not_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        format!(
            "inventory = \"sim:nvswitch8\"\nstate_dir = \"{0}/state\"\naudit_log = \"{0}/audit.log\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    if !harness::need_root("a_hold_for_three_hours_shows_its_end_not_until_released") {
        return;
    }
    let gpupin = |args: &[&str]| {
        let out = Command::new(exec_support::GPUPIN)
            .arg("--config")
            .arg(&file)
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", harness::stderr(&out));
        harness::stdout(&out)
    };
    gpupin(&["hold", "maint", "--devices", "0", "--for", "3h"]);
    let status = gpupin(&["status", "--long"]);
    let row = status
        .lines()
        .find(|l| l.contains("maint"))
        .unwrap_or_else(|| panic!("no row for maint:\n{status}"));
    assert!(
        row.contains(" until ") && row.contains(" UTC") && !row.contains("until released"),
        "{status}"
    );
}

/// `gpupin manpage DIR` lays pages out as man(1) looks for them, so `MANPATH=DIR man
/// gpupin-exec` works; the hidden commands get no page and no completion.
#[test]
fn man_pages_land_where_manpath_finds_them_and_hidden_commands_stay_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(exec_support::GPUPIN)
        .arg("manpage")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", harness::stderr(&out));
    for page in [
        "man1/gpupin.1",
        "man1/gpupin-exec.1",
        "man5/gpupin.toml.5",
        "man8/gpupin-hook.8",
        "man8/gpupin-runtime.8",
    ] {
        assert!(dir.path().join(page).is_file(), "no {page}");
    }
    let hidden = ["nvml", "exec-gate", "manpage", "holders"];
    for name in hidden {
        assert!(!dir.path().join(format!("man1/gpupin-{name}.1")).exists());
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(exec_support::GPUPIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", harness::stderr(&out));
        let script = harness::stdout(&out);
        assert!(script.contains("exec"), "{shell}: {script}");
        for name in hidden {
            // How each shell's script offers a command: bash in its opts list, zsh as
            // 'name:description', fish as -a "name".
            let offered = match shell {
                "bash" => script
                    .lines()
                    .filter(|l| l.trim_start().starts_with("opts=\""))
                    .any(|l| l.split(['"', ' ']).any(|w| w == name)),
                "zsh" => script.contains(&format!("'{name}:")),
                _ => script.contains(&format!("-a \"{name}\"")),
            };
            assert!(!offered, "{shell} completes the hidden {name}");
        }
    }
}

/// README's "Try it without GPUs or systemd", run as written: its `sudo` lines as root,
/// the others as a throwaway user, its paths moved into a temp dir. The daemon's line
/// runs in the background (the README says a second terminal), until its socket is there.
#[test]
fn the_readmes_try_it_runs_as_written() {
    let test = "the_readmes_try_it_runs_as_written";
    if !requirements(test) {
        return;
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n## Try it without GPUs or systemd\n")
        .nth(1)
        .expect("README has a section \"Try it without GPUs or systemd\"");
    let section = section.split("\n## ").next().unwrap();
    let lines: Vec<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .collect();
    assert!(
        (4..=10).contains(&lines.len()),
        "ten lines at most: {lines:?}"
    );
    let user = User::create("try");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let etc = dir.path().join("etc");
    let run = dir.path().join("run");
    let bin = std::path::Path::new(exec_support::GPUPIN).parent().unwrap();
    let mut script = format!(
        "set -e\nsudo() {{ command \"$@\"; }}\ngpupin() {{ runuser -u {} -- {} \"$@\"; }}\n",
        user.name,
        exec_support::GPUPIN
    );
    for line in &lines {
        // The README's comments go; a `#` inside the printf's quotes is none of them.
        let line = line.split("  #").next().unwrap().trim_end();
        let line = line
            .replace("/etc/gpupin-try", &etc.display().to_string())
            .replace("/run/gpupin-try", &run.display().to_string());
        if let Some(daemon) = line.strip_prefix("sudo ").filter(|l| l.ends_with(" serve")) {
            // `command`: the background job is gpupin itself, whose pid the trap ends.
            let socket = run.join("gpupin.sock");
            script.push_str(&format!(
                "command {daemon} >{log} 2>&1 &\nserve=$!\ntrap 'kill $serve; wait $serve' EXIT\ntimeout 60 sh -c 'until [ -S {socket} ]; do sleep 0.05; done'\n",
                log = dir.path().join("serve.log").display(),
                socket = socket.display()
            ));
        } else {
            script.push_str(&line);
            script.push('\n');
        }
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display()),
        )
        .env_remove("GPUPIN_CONFIG")
        .env_remove("GPUPIN_SOCKET")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = harness::stdout(&out);
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    assert!(
        stdout.lines().any(|l| l == "0,1"),
        "the job saw no 0,1:\n{script}\n{stdout}{}\nserve: {log}",
        harness::stderr(&out)
    );
    assert!(
        stdout.contains("GPU  MODEL"),
        "no status:\n{stdout}{}",
        harness::stderr(&out)
    );
}

/// `pip install ./python` builds in the source tree (setuptools writes `build/` and
/// `gpupin.egg-info/` there): git ignores both, so the checkout stays clean.
#[test]
fn what_pip_install_leaves_in_python_is_ignored() {
    let root = env!("CARGO_MANIFEST_DIR");
    if !std::path::Path::new(root).join(".git").exists() {
        harness::say("what_pip_install_leaves_in_python_is_ignored: skipped, not a git checkout");
        return;
    }
    for path in [
        "python/build/lib/gpupin/__init__.py",
        "python/gpupin.egg-info/PKG-INFO",
    ] {
        let out = Command::new("git")
            .args(["check-ignore", "--no-index", "-q", path])
            .current_dir(root)
            .output()
            .unwrap();
        assert!(out.status.success(), "git does not ignore {path}");
    }
}

/// The refusal of a hold on busy GPUs says `add --wait 10m`, and `hold` takes it: an
/// admin draining a busy GPU queues a hold that takes the GPU once its holder ends; a
/// user's hold through `gpupin serve` waits the same way.
#[test]
fn hold_takes_the_wait_its_refusal_suggests() {
    let test = "hold_takes_the_wait_its_refusal_suggests";
    if !requirements(test) {
        return;
    }
    let user = User::create("hwt");
    let g = gpupin("");
    let _daemon = Daemon::start(&g);
    ok(
        &g,
        None,
        &[
            "hold",
            "busy",
            "--devices",
            "0,1,2,3,4,5,6,7",
            "--until-release",
        ],
    );
    let refusal = exec_support::refused(
        &g,
        None,
        &["hold", "maint", "--count", "1", "--until-release"],
    );
    assert!(refusal.contains("add --wait 10m to wait"), "{refusal}");

    // Root's hold waits in the queue until busy is released.
    let admin = exec_support::cmd(
        &g,
        None,
        &[
            "hold",
            "maint",
            "--devices",
            "1",
            "--until-release",
            "--wait",
            "2m",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    exec_support::until("the admin's hold waits", || {
        (exec_support::queued(&g) == 1).then_some(())
    });
    ok(&g, None, &["release", "busy"]);
    let out = admin.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", harness::stderr(&out));
    assert_eq!(harness::stdout(&out), "maint holds GPU 1 until released\n");

    // A user's hold for their own process, through the daemon, waits for GPU 1 too.
    let mut sleeper = exec_support::Sleeper::start(&user);
    let pid = sleeper.pid().to_string();
    let users = exec_support::cmd(
        &g,
        Some(&user),
        &[
            "hold",
            "mine",
            "--devices",
            "1",
            "--pid",
            &pid,
            "--wait",
            "2m",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    exec_support::until("the user's hold waits", || {
        (exec_support::queued(&g) == 1).then_some(())
    });
    ok(&g, None, &["release", "maint"]);
    let out = users.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", harness::stderr(&out));
    assert_eq!(
        harness::stdout(&out),
        format!("mine holds GPU 1 while pid {pid} runs\n")
    );
    sleeper.stop();
    exec_support::until_clean(&g);
}

/// A MIG box imported from `nvidia-smi topo -m` and `nvidia-smi -L` (no GI or CI ids):
/// `gpupin pick --mig` models it, as `import --help` says; a real hold of such an
/// instance is refused with the keys the file lacks and where to find them.
#[test]
fn an_imported_mig_box_answers_pick_and_a_hold_names_the_missing_keys() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    let machine = dir.path().join("machine.json");
    let out = Command::new(exec_support::GPUPIN)
        .args(["inventory", "import"])
        .arg(format!("{fixtures}/dgxa100.topo.txt"))
        .arg("--gpus")
        .arg(format!("{fixtures}/dgxa100mig.gpus.txt"))
        .arg("-o")
        .arg(&machine)
        .env("GPUPIN_CONFIG", "/nonexistent/gpupin.toml")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", harness::stderr(&out));
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "inventory = \"{}\"\nstate_dir = \"{1}/state\"\naudit_log = \"{1}/audit.log\"\n",
            machine.display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let gpupin = |args: &[&str]| {
        Command::new(exec_support::GPUPIN)
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap()
    };
    let out = gpupin(&["pick", "--mig", "1g.10gb", "--count", "2"]);
    assert!(out.status.success(), "{}", harness::stderr(&out));
    assert!(
        harness::stdout(&out).starts_with("topology would pick MIG instances 0:2,0:3\n"),
        "{}",
        harness::stdout(&out)
    );
    if !harness::need_root("an_imported_mig_box_answers_pick_and_a_hold_names_the_missing_keys") {
        return;
    }
    let out = gpupin(&["hold", "m1", "--mig", "1g.10gb", "--until-release"]);
    assert!(!out.status.success());
    assert_eq!(
        harness::stderr(&out),
        "gpupin: cannot allocate 1 MIG instance of 1g.10gb for m1: 0 of the 2 instances of 1g.10gb can take it; 2 of them have no \"gi\" and \"ci\" in the inventory file, so gpupin does not know their nodes (add both to each instance, from nvidia-smi mig -lgi and -lci; gpupin pick models them as they are)\n"
    );
}

/// What the day's people read after each step: `gpupin status --json`, `queue --json`,
/// `log --json` and `usage --json`, as root reads them.
struct Look {
    status: serde_json::Value,
    queue: Vec<serde_json::Value>,
    log: Vec<serde_json::Value>,
    usage: serde_json::Value,
}

impl Look {
    fn now(g: &gpupin_sandbox::harness::Gpupin) -> Look {
        let json = |args: &[&str]| -> serde_json::Value {
            serde_json::from_str(&ok(g, None, args)).unwrap()
        };
        let log = ok(g, None, &["log", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        Look {
            status: g.status(),
            queue: json(&["queue", "--json"]).as_array().unwrap().clone(),
            log,
            usage: json(&["usage", "--json"]),
        }
    }

    /// The holder's owner as status shows it, or `None` where status does not list it.
    fn owner_of(&self, holder: &str) -> Option<String> {
        self.status["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["id"] == holder)
            .map(|h| h["owner"]["user"].as_str().unwrap_or("-").to_string())
    }

    /// Why `holder` waits, as `gpupin queue --json` says; `None` where it does not wait.
    fn why(&self, holder: &str) -> Option<String> {
        self.queue
            .iter()
            .find(|w| w["holder"] == holder)
            .map(|w| w["reason"].as_str().unwrap_or("-").to_string())
    }

    /// The log's events of `holder`, as (event, reason).
    fn events(&self, holder: &str) -> Vec<(String, String)> {
        self.log
            .iter()
            .filter(|e| e["holder"] == holder)
            .map(|e| {
                let field = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (field("event"), field("reason"))
            })
            .collect()
    }

    /// The users `gpupin usage` has rows for.
    fn users(&self) -> Vec<String> {
        let mut users: Vec<String> = self.usage["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_string())
            .collect();
        users.sort();
        users
    }
}

/// Issue 32's day, scripted: an admin and three students on 8 simulated GPUs with a
/// limit of 3 each, a real `gpupin serve`, the Python client in a "notebook". Each step
/// is read back as its people would: status, queue, log and usage.
#[test]
fn the_first_day_end_to_end() {
    let test = "the_first_day_end_to_end";
    if !requirements(test) {
        return;
    }
    let g = gpupin("[limits]\nmax_gpus_per_user = 3");
    let (alice, bob, carol) = (
        User::create("fda"),
        User::create("fdb"),
        User::create("fdc"),
    );
    let _daemon = Daemon::start(&g);

    // The admin sets GPU 7 aside for a fan check.
    ok(
        &g,
        None,
        &[
            "hold",
            "maint",
            "--devices",
            "7",
            "--until-release",
            "--reason",
            "fan check",
        ],
    );
    let look = Look::now(&g);
    assert_eq!(look.owner_of("maint").as_deref(), Some("root"));
    assert_eq!(look.events("maint"), [("hold".into(), "fan check".into())]);
    assert_eq!(look.users(), ["root"]);

    // Alice and bob start jobs, which run on GPUs of their own.
    let mut alices = Job::start(&g, Some(&alice), "alice1", &["--count", "2"]);
    let mut bobs = Job::start(&g, Some(&bob), "bob1", &["--count", "3"]);
    let (alices_id, bobs_id) = (alices.holder(), bobs.holder());
    let (a, b) = (alices.ready().cuda_indices(), bobs.ready().cuda_indices());
    assert!(a.len() == 2 && b.len() == 3 && a.iter().all(|i| !b.contains(i) && *i != 7));
    let look = Look::now(&g);
    assert_eq!(look.owner_of(&alices_id), Some(alice.name.clone()));
    assert_eq!(look.owner_of(&bobs_id), Some(bob.name.clone()));
    assert_eq!(look.status["free"], 2, "{}", look.status);

    // Carol's notebook: acquire in a cell, the cell run again, one holder.
    let tree = exec_support::python_tree(g.dir.path());
    let mut notebook = Command::new("/usr/bin/python3");
    notebook
        .args([
            "-c",
            "import gpupin, sys, warnings\n\
             warnings.simplefilter('ignore')\n\
             first = gpupin.acquire(count=1)\n\
             again = gpupin.acquire(count=1)\n\
             print(first.holder, again.holder == first.holder, flush=True)\n\
             sys.stdin.read()\n",
        ])
        .current_dir(scratch(&g))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PYTHONPATH", &tree)
        .env("GPUPIN_SOCKET", g.state_dir.join("gpupin.sock"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    carol.owns(&mut notebook);
    let mut kernel = notebook.spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(kernel.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let (cell, same) = line.trim().split_once(' ').expect("the notebook's holder");
    assert_eq!(same, "True", "a cell run again holds no second set");
    let cell = cell.to_string();
    let look = Look::now(&g);
    assert_eq!(look.owner_of(&cell), Some(carol.name.clone()));
    assert_eq!(look.status["free"], 1, "{}", look.status);

    // Two more requests wait: carol's for 2 (one GPU is free), alice's past her limit.
    let wait = ["--count", "2", "--wait", "120s"];
    let carols = Job::start(&g, Some(&carol), "carol2", &wait);
    let alices2 = Job::start(&g, Some(&alice), "alice2", &wait);
    let (carols_id, alices2_id) = (carols.holder(), alices2.holder());
    let look = exec_support::until("both say why they wait", || {
        let look = Look::now(&g);
        let both = look.why(&carols_id).is_some_and(|w| w != "-")
            && look.why(&alices2_id).is_some_and(|w| w != "-");
        both.then_some(look)
    });
    assert_eq!(look.why(&carols_id).as_deref(), Some("too few GPUs free"));
    assert_eq!(look.why(&alices2_id).as_deref(), Some("own limit"));

    // Carol cancels her queued request by the name the queue shows.
    let out = ok(&g, Some(&carol), &["release", &carols_id]);
    assert!(
        out.starts_with(&format!("cancelled {}", carols_id)),
        "{out}"
    );
    let mut carols = carols;
    let (exit, stderr) = carols.wait();
    assert!(!exit.success());
    assert!(
        stderr.contains(&format!("was cancelled by {}", carol.name)),
        "{stderr}"
    );
    let look = Look::now(&g);
    assert_eq!(look.why(&carols_id), None);
    assert_eq!(look.queue.len(), 1, "alice's request still waits");

    // The admin evicts bob's job, and says why; bob reads who and why.
    let out = ok(
        &g,
        None,
        &["evict", &bobs_id, "--reason", "node maintenance"],
    );
    assert!(
        out.starts_with(&format!("evicted {} (stopped with SIGTERM)", bobs_id)),
        "{out}"
    );
    let (exit, stderr) = bobs.wait();
    assert_eq!(exit.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{} was ended by root (gpupin evict): node maintenance",
            bobs_id
        )),
        "{stderr}"
    );
    let look = Look::now(&g);
    assert_eq!(look.owner_of(&bobs_id), None);
    let bobs_events = look.events(&bobs_id);
    assert!(
        bobs_events
            .iter()
            .any(|(e, why)| e == "evict" && why.ends_with("; reason: node maintenance")),
        "{bobs_events:?}"
    );
    assert_eq!(
        look.why(&alices2_id).as_deref(),
        Some("own limit"),
        "4 free, still her limit"
    );

    // Bob may not force alice's job off; root may, and it is stopped before its GPUs go.
    let line = exec_support::refused(&g, Some(&bob), &["release", "--force", &alices_id]);
    assert!(
        line.ends_with(&format!("only {} or root may release it", alice.name)),
        "{line}"
    );
    ok(&g, None, &["release", "--force", &alices_id]);
    let (exit, _) = alices.wait();
    assert!(!exit.success(), "stopped, not finished");
    let mut alices2 = alices2;
    assert_eq!(
        alices2.ready().cuda_indices().len(),
        2,
        "her waiting request got its turn"
    );
    let look = Look::now(&g);
    assert_eq!(look.owner_of(&alices_id), None);
    assert_eq!(look.owner_of(&alices2_id), Some(alice.name.clone()));
    assert!(look.queue.is_empty());

    // The day ends: jobs finish, the kernel shuts down, the fan is fixed.
    let (exit, stderr) = alices2.finish();
    assert!(exit.success(), "{stderr}");
    drop(kernel.stdin.take());
    assert!(kernel.wait().unwrap().success());
    ok(&g, None, &["release", "maint"]);
    until_clean(&g);
    let look = Look::now(&g);
    let mut everyone = vec![
        alice.name.clone(),
        bob.name.clone(),
        carol.name.clone(),
        "root".to_string(),
    ];
    everyone.sort();
    assert_eq!(look.users(), everyone, "{}", look.usage);
    assert!(look.events(&cell).iter().any(|(e, _)| e == "release"));
}
