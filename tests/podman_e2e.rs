//! gpupin with real podman: hooks.d files written by `gpupin install podman`, the
//! precreate stage, and the ledger on a simulated 8-GPU machine. Root, podman, runc and
//! busybox-static are needed; elsewhere the tests say why they skip (under CI=true they
//! fail instead).

mod podman_support;

use podman_support::{Options, Podman, assert_success, combined, env_value, gpu_nodes, setup};
use std::collections::BTreeSet;
use std::time::Duration;

const CONTROL_NODES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// The container sees exactly the GPUs the ledger gives its id, by node and by env.
fn assert_sees_its_gpus(podman: &Podman, name: &str, id: &str, count: usize) {
    let held = podman.gpus_of(id);
    assert_eq!(held.len(), count, "status: {:#}", podman.status());
    let (dev, env) = podman.inside(name);
    let mut wanted: Vec<String> = held
        .iter()
        .map(|(_, minor)| format!("nvidia{minor}"))
        .collect();
    wanted.sort();
    assert_eq!(
        gpu_nodes(dev.iter().map(String::as_str)),
        wanted,
        "/dev: {dev:?}"
    );
    for control in CONTROL_NODES {
        assert!(
            dev.iter().any(|d| d == control),
            "{control} missing: {dev:?}"
        );
    }
    let visible = env_value(&env, "NVIDIA_VISIBLE_DEVICES").expect("NVIDIA_VISIBLE_DEVICES");
    let visible: BTreeSet<&str> = visible.split(',').collect();
    let uuids: BTreeSet<&str> = held.iter().map(|(uuid, _)| uuid.as_str()).collect();
    assert_eq!(visible, uuids);
}

#[test]
fn annotated_container_sees_exactly_its_two_gpus() {
    let Some(podman) = setup(
        "annotated_container_sees_exactly_its_two_gpus",
        Options::default(),
    ) else {
        return;
    };
    let name = podman.name(0);
    let id = podman.start(&name, &["--annotation", "gpupin.count=2"]);
    assert_sees_its_gpus(&podman, &name, &id, 2);
    let holders = podman.holders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(
        holders[0]["pid"].as_i64().is_some_and(|p| p > 0),
        "{holders:?}"
    );
    podman.remove(&name);
}

#[test]
fn status_and_audit_name_a_podman_container_by_its_name_and_image() {
    let Some(podman) = setup(
        "status_and_audit_name_a_podman_container_by_its_name_and_image",
        Options::default(),
    ) else {
        return;
    };
    let image = "localhost/gpupin-test:named";
    podman.import_image(image);
    let name = podman.name(0);
    let id = podman.start_image(&name, image, &["--annotation", "gpupin.count=1"]);
    let status = podman.status();
    let holder = &podman.holders()[0];
    assert_eq!(holder["id"], id.as_str(), "{status:#}");
    assert_eq!(holder["kind"], "container", "{status:#}");
    // Podman (4.3 here) puts only its mark into the spec; the name and the image come
    // from containers/storage, whose entry the spec's root names.
    assert_eq!(
        holder["container"],
        serde_json::json!({"engine": "podman", "name": name, "image": image}),
        "{status:#}"
    );
    let allocation = podman
        .audit_lines()
        .into_iter()
        .find(|l| l["event"] == "allocate")
        .unwrap_or_else(|| panic!("no allocate line: {}", podman.audit_log()));
    assert_eq!(allocation["engine"], "podman", "{allocation}");
    let table = podman.gpupin(&["status", "--long"]);
    assert_success("gpupin status", &table);
    let table = String::from_utf8(table.stdout).unwrap();
    let row = table
        .lines()
        .find(|l| l.contains(" podman "))
        .unwrap_or_else(|| panic!("no podman row: {table}"));
    // The long table cuts names to its column.
    assert!(row.contains(&name[..20]), "{table}");
    assert!(
        !table.contains(&id[..16]),
        "a long id in the table: {table}"
    );
    let short = podman.gpupin(&["status"]);
    let short = String::from_utf8(short.stdout).unwrap();
    assert!(short.contains(&name[..20]), "{short}");
    assert_eq!(allocation["name"], name.as_str(), "{allocation}");
    assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
    podman.remove(&name);
}

#[test]
fn rm_f_of_a_detached_container_releases() {
    let Some(podman) = setup("rm_f_of_a_detached_container_releases", Options::default()) else {
        return;
    };
    let name = podman.name(0);
    let id = podman.start(&name, &["--annotation", "gpupin.count=1"]);
    assert_eq!(podman.gpus_of(&id).len(), 1);
    podman.remove(&name);
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());
    assert!(
        podman
            .audit_events()
            .contains(&("release".to_string(), id.clone())),
        "{}",
        podman.audit_log()
    );
}

#[test]
fn run_rm_releases_when_the_container_exits() {
    let Some(podman) = setup(
        "run_rm_releases_when_the_container_exits",
        Options::default(),
    ) else {
        return;
    };
    let out = podman.run(
        &[],
        &podman.name(0),
        &["--rm", "--annotation", "gpupin.count=1"],
        &["sh", "-c", "ls /dev; env"],
    );
    assert_success("podman run --rm", &out);
    let output = combined(&out);
    assert_eq!(gpu_nodes(output.lines()).len(), 1);
    assert!(output.contains("NVIDIA_VISIBLE_DEVICES=GPU-"), "{output}");
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());
    let log = podman.audit_log();
    let events = podman.audit_events();
    let seen = |event: &str, holder: &str| {
        events
            .iter()
            .any(|(e, h)| e == event && h.starts_with(holder))
    };
    // Allocated under a claim before create, bound to the container, released at its end.
    assert!(seen("allocate", "claim-"), "no allocate of a claim:\n{log}");
    assert!(
        log.contains("\"reason\":\"claim claim-"),
        "no bind of the claim:\n{log}"
    );
    assert!(seen("bind", ""), "no bind:\n{log}");
    assert!(seen("release", ""), "no release:\n{log}");
}

#[test]
fn eight_containers_started_at_once_get_eight_distinct_gpus() {
    let Some(podman) = setup(
        "eight_containers_started_at_once_get_eight_distinct_gpus",
        Options::default(),
    ) else {
        return;
    };
    let ids: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let podman = &podman;
                s.spawn(move || {
                    let name = podman.name(i);
                    let id = podman.start(&name, &["--annotation", "gpupin.count=1"]);
                    (name, id)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = BTreeSet::new();
    for (name, id) in &ids {
        assert_sees_its_gpus(&podman, name, id, 1);
        all.extend(podman.gpus_of(id));
    }
    assert_eq!(all.len(), 8, "{all:?}");
    assert_eq!(podman.status()["free"], 0);
    for (name, _) in &ids {
        podman.remove(name);
    }
    assert_eq!(podman.status()["free"], 8);
}

#[test]
fn container_without_annotation_never_runs_the_hook() {
    let Some(podman) = setup(
        "container_without_annotation_never_runs_the_hook",
        Options::default(),
    ) else {
        return;
    };
    let name = podman.name(0);
    // podman's debug log says, per hooks.d file, whether it matched the container.
    let out = podman.run(
        &["--log-level", "debug"],
        &name,
        &["-d", "--annotation", "org.example.team=ml"],
        &["sleep", "1000"],
    );
    assert_success("podman run -d", &out);
    let log = String::from_utf8_lossy(&out.stderr);
    for stage in ["precreate", "prestart", "poststop"] {
        let line = format!("hook gpupin-{stage}.json did not match");
        assert!(
            log.contains(&line),
            "{line:?} missing from podman's log:\n{log}"
        );
    }
    assert!(!log.contains("matched; adding to stages"), "{log}");
    let (dev, env) = podman.inside(&name);
    assert!(!dev.iter().any(|d| d.starts_with("nvidia")), "{dev:?}");
    assert!(!env.iter().any(|e| e.starts_with("NVIDIA_")), "{env:?}");
    podman.remove(&name);
    // gpupin creates its state dir on first use: it was never called.
    assert!(!podman.state_dir().exists());
}

#[test]
fn failed_allocation_fails_the_run_with_gpupins_message() {
    let Some(podman) = setup(
        "failed_allocation_fails_the_run_with_gpupins_message",
        Options::default(),
    ) else {
        return;
    };
    let out = podman.run(
        &[],
        &podman.name(0),
        &["--rm", "--annotation", "gpupin.count=9"],
        &["true"],
    );
    assert!(!out.status.success());
    let output = combined(&out);
    assert!(
        output.contains("gpupin: count 9 is more than the 8 GPUs of this machine"),
        "{output}"
    );
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());

    // All GPUs held: the next container is refused, the holder keeps its GPUs.
    let holder = podman.start(&podman.name(1), &["--annotation", "gpupin.count=8"]);
    let out = podman.run(
        &[],
        &podman.name(2),
        &["--rm", "--annotation", "gpupin.count=1"],
        &["true"],
    );
    assert!(!out.status.success());
    let output = combined(&out);
    assert!(output.contains("8 of 8 GPUs held, 0 free"), "{output}");
    // Refused while it is still a claim, a container from an image is named as podman
    // named it (containers/storage tells; a `--rootfs` container has no entry there).
    let image = "localhost/gpupin-test:refused";
    podman.import_image(image);
    let out = podman
        .podman()
        .args([
            "run",
            "--rm",
            "--name",
            &podman.name(3),
            "--network",
            "none",
        ])
        .args(["--annotation", "gpupin.count=1", image, "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let output = combined(&out);
    assert!(
        output.contains(&format!(
            "gpupin: cannot allocate 1 GPU for {}: 8 of 8 GPUs held",
            podman.name(3)
        )),
        "{output}"
    );
    let holders = podman.holders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["id"], holder.as_str());
    podman.remove(&podman.name(1));
}

#[test]
fn claim_of_a_container_that_never_started_is_reaped_after_the_grace() {
    let grace = Duration::from_secs(2);
    let options = Options {
        claim_grace: Some("2s"),
        ..Options::default()
    };
    let Some(mut podman) = setup(
        "claim_of_a_container_that_never_started_is_reaped_after_the_grace",
        options,
    ) else {
        return;
    };
    let runtime = podman.failing_runtime();
    podman.set_runtime(&runtime);
    let out = podman.run(
        &[],
        &podman.name(0),
        &["--rm", "--annotation", "gpupin.count=1"],
        &["true"],
    );
    assert!(!out.status.success());
    assert!(
        combined(&out).contains("failing-runtime: refusing create"),
        "{}",
        combined(&out)
    );
    let holders = podman.holders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let claim = holders[0]["id"].as_str().unwrap().to_string();
    assert!(claim.starts_with("claim-"), "{claim}");
    assert!(holders[0]["pid"].is_null(), "{holders:?}");

    // created_at has whole seconds: one more second makes sure the grace has passed.
    std::thread::sleep(grace + Duration::from_secs(1));
    let out = podman.gpupin(&["gc"]);
    assert_success("gpupin gc", &out);
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());
    assert!(
        podman
            .audit_events()
            .contains(&("reap".to_string(), claim.to_string())),
        "{}",
        podman.audit_log()
    );
}

#[test]
fn env_request_works_with_the_always_hooks() {
    let options = Options {
        always: true,
        ..Options::default()
    };
    let Some(podman) = setup("env_request_works_with_the_always_hooks", options) else {
        return;
    };
    let name = podman.name(0);
    let id = podman.start(&name, &["-e", "GPUPIN_COUNT=1"]);
    assert_sees_its_gpus(&podman, &name, &id, 1);
    podman.remove(&name);
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());
}

/// Needs neither root nor podman: only files.
#[test]
fn install_is_idempotent_and_uninstall_removes_exactly_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks.d");
    std::fs::create_dir(&hooks).unwrap();
    let other = hooks.join("oci-other.json");
    std::fs::write(&other, "{}").unwrap();
    let config = dir.path().join("gpupin.toml");
    std::fs::write(&config, "inventory = \"sim:nvswitch8\"\n").unwrap();
    let gpupin = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpupin"))
            .current_dir(dir.path())
            .env_remove("GPUPIN_CONFIG")
            // Relative on purpose: the hooks must get it absolute.
            .args(["--config", "gpupin.toml"])
            .args(args)
            .arg(&hooks)
            .output()
            .unwrap()
    };
    let names = [
        "gpupin-precreate.json",
        "gpupin-prestart.json",
        "gpupin-poststop.json",
    ];

    let first = gpupin(&["install", "podman", "--dir"]);
    assert_success("install", &first);
    assert_eq!(
        String::from_utf8_lossy(&first.stdout)
            .matches("wrote ")
            .count(),
        3
    );
    let contents: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(hooks.join(n)).unwrap())
        .collect();
    let precreate: serde_json::Value = serde_json::from_slice(&contents[0]).unwrap();
    // The lean hook binary beside the gpupin that installed it.
    assert_eq!(precreate["hook"]["path"], env!("CARGO_BIN_EXE_gpupin-hook"));
    let config = config.to_str().unwrap();
    assert_eq!(
        precreate["hook"]["args"],
        serde_json::json!(["gpupin-hook", "--config", config, "precreate"])
    );

    let again = gpupin(&["install", "podman", "--dir"]);
    assert_success("install again", &again);
    assert_eq!(
        String::from_utf8_lossy(&again.stdout)
            .matches("unchanged ")
            .count(),
        3
    );
    let after: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(hooks.join(n)).unwrap())
        .collect();
    assert_eq!(after, contents);

    let removed = gpupin(&["uninstall", "podman", "--dir"]);
    assert_success("uninstall", &removed);
    assert_eq!(
        String::from_utf8_lossy(&removed.stdout)
            .matches("removed ")
            .count(),
        3
    );
    let left: Vec<_> = std::fs::read_dir(&hooks)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(left, [other]);
}

/// `gpupin.cpus=numa` on sim:pcie8 (two sockets; the simulated NUMA nodes map onto this
/// host's real CPUs): the container runs on the CPUs local to its GPUs, as the kernel
/// reports them inside it.
#[test]
fn numa_cpus_container_runs_on_its_sockets_cpus() {
    let options = Options {
        machine: Some("sim:pcie8"),
        ..Options::default()
    };
    let Some(podman) = setup("numa_cpus_container_runs_on_its_sockets_cpus", options) else {
        return;
    };
    let inventory = podman.gpupin(&["inventory", "--json"]);
    assert_success("gpupin inventory", &inventory);
    let inventory: serde_json::Value = serde_json::from_slice(&inventory.stdout).unwrap();
    let local_cpus = |index: usize| {
        inventory["gpus"][index]["local_cpus"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (n, device) in ["1", "6"].into_iter().enumerate() {
        let name = podman.name(n);
        let annotations = [
            "--annotation",
            &format!("gpupin.devices={device}"),
            "--annotation",
            "gpupin.cpus=numa",
        ];
        podman.start(&name, &annotations);
        let out = podman
            .podman()
            .args(["exec", &name, "cat", "/proc/self/status"])
            .output()
            .unwrap();
        assert_success("podman exec cat", &out);
        let status = String::from_utf8(out.stdout).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .unwrap();
        let allowed = line.split(':').nth(1).unwrap().trim().to_string();
        assert_eq!(
            allowed,
            local_cpus(device.parse().unwrap()),
            "GPU {device}: {line}"
        );
        podman.remove(&name);
    }
}

/// The prestart path (CRI-O, or podman without the precreate file) beside NVIDIA's legacy
/// hook, installed as the toolkit names it (`oci-nvidia-hook.json`, sorted after gpupin's
/// files, so run after them): gpupin allocates at prestart and leaves
/// NVIDIA_VISIBLE_DEVICES with its UUIDs in the bundle's config.json, which NVIDIA's real
/// `nvidia-container-runtime-hook` (tests/peers/build) reads and hands to
/// `nvidia-container-cli` (libnvidia-container, C, in no registry here: a stand-in that
/// logs its arguments).
#[test]
fn nvidia_hook_after_gpupins_prestart_reads_its_uuids() {
    let test = "nvidia_hook_after_gpupins_prestart_reads_its_uuids";
    let Some(podman) = setup(test, Options::default()) else {
        return;
    };
    let Some(peers) =
        gpupin_sandbox::harness::required(test, gpupin_sandbox::harness::toolkit::Peers::find())
    else {
        return;
    };
    let hooks = podman.hooks_dir();
    std::fs::remove_file(hooks.join("gpupin-precreate.json")).unwrap();
    let log = podman.path("nvidia-container-cli.log");
    let cli = podman.path("nvidia-container-cli");
    executable(
        &cli,
        &format!("#!/bin/sh\necho \"$*\" >> '{}'\n", log.display()),
    );
    // The hook runs with the hook file's environment only: a wrapper gives it its config.
    let xdg = podman.path("xdg");
    std::fs::create_dir_all(xdg.join("nvidia-container-runtime")).unwrap();
    std::fs::write(
        xdg.join("nvidia-container-runtime/config.toml"),
        format!(
            "[nvidia-container-cli]\npath = {:?}\nenvironment = []\nldconfig = \"@/sbin/ldconfig\"\n",
            cli.display().to_string()
        ),
    )
    .unwrap();
    let nvidia_hook = podman.path("nvidia-container-runtime-hook");
    executable(
        &nvidia_hook,
        &format!(
            "#!/bin/sh\nexport XDG_CONFIG_HOME='{}'\nexec '{}' \"$@\"\n",
            xdg.display(),
            peers.tool("nvidia-container-runtime-hook").display()
        ),
    );
    let nvidia = serde_json::json!({
        "version": "1.0.0",
        "hook": {"path": nvidia_hook, "args": ["nvidia-container-runtime-hook", "prestart"]},
        "when": {"always": true},
        "stages": ["prestart"],
    });
    std::fs::write(hooks.join("oci-nvidia-hook.json"), nvidia.to_string()).unwrap();
    let name = podman.name(0);
    let id = podman.start(&name, &["--annotation", "gpupin.count=1"]);
    let held = podman.gpus_of(&id);
    assert_eq!(held.len(), 1, "status: {:#}", podman.status());
    let calls = std::fs::read_to_string(&log).unwrap();
    let configures: Vec<&str> = calls
        .lines()
        .filter(|l| l.contains(" configure "))
        .collect();
    assert_eq!(configures.len(), 1, "{calls}");
    assert!(
        configures[0].contains(&format!(" --device={} ", held[0].0)),
        "{calls}"
    );
    podman.remove(&name);
    assert!(podman.holders().is_empty());
}

/// An executable script at `path`.
fn executable(path: &std::path::Path, script: &str) {
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}
