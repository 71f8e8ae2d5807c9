//! MIG instances end to end, as a user checks them: a runc container given an instance
//! of the simulated A100 (`sim:dgxa100mig`) sees exactly its GPU's node and its two
//! capability nodes (`ls /dev/nvidia-caps`) and the instance's UUID; a `gpupin exec` job
//! on an instance opens its own nodes only (fake nodes, a real device cgroup) and is told
//! the instance's UUID. Needs root and runc (the job: a cgroup hierarchy too).

#[allow(dead_code)]
mod exec_support;

use gpupin_sandbox::harness::{self, CONTROL_NODES, GPU_MAJOR, Sandbox, char_node, stat_node};
use std::collections::BTreeSet;
use std::process::Command;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
/// The stand-in `nvidia-caps` major of the simulated machines with MIG.
const CAPS_MAJOR: u32 = 511;

/// The sim's instances: (address, GI access minor, CI access minor).
const INSTANCES: [(&str, u32, u32); 4] = [
    ("0:0", 21, 22),
    ("0:1", 30, 31),
    ("0:2", 84, 85),
    ("0:3", 93, 94),
];

fn ls(c: &gpupin_sandbox::Container, dir: &str) -> BTreeSet<String> {
    c.exec_stdout(&["ls", dir])
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_container_given_an_instance_sees_its_gpu_its_two_caps_and_its_uuid() {
    let test = "a_container_given_an_instance_sees_its_gpu_its_two_caps_and_its_uuid";
    let Some(sb) = Sandbox::with_machine(GPUPIN, test, "sim:dgxa100mig") else {
        return;
    };
    let id = sb.id("mig");
    let c = sb
        .start(&id, &sb.spec().annotation("gpupin.mig", "1g.10gb"))
        .unwrap();
    let holder = sb.gpupin.holder(&id).expect("held while running");
    let uuids: Vec<String> = serde_json::from_value(holder["gpus"].clone()).unwrap();
    assert_eq!(uuids.len(), 1);
    assert!(uuids[0].starts_with("MIG-"), "{uuids:?}");
    // Pack: the first 1g.10gb, 0:2 (GI 9).
    assert_eq!(
        ls(&c, "/dev/nvidia-caps"),
        BTreeSet::from(["nvidia-cap84".to_string(), "nvidia-cap85".to_string()])
    );
    for minor in [84, 85] {
        assert_eq!(
            stat_node(&c, &format!("/dev/nvidia-caps/nvidia-cap{minor}")),
            char_node(CAPS_MAJOR, minor)
        );
    }
    let gpus: BTreeSet<String> = ls(&c, "/dev")
        .into_iter()
        .filter(|n| n.starts_with("nvidia") && n != "nvidia-caps")
        .collect();
    let mut want: BTreeSet<String> = CONTROL_NODES
        .iter()
        .map(|(n, _, _)| n.to_string())
        .collect();
    want.insert("nvidia0".into());
    assert_eq!(gpus, want);
    assert_eq!(stat_node(&c, "/dev/nvidia0"), char_node(GPU_MAJOR, 0));
    let env = c.exec_stdout(&["env"]).unwrap();
    let config = std::fs::read_to_string(sb.bundle_dir(&id).join("config.json")).unwrap();
    assert!(
        env.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuids[0]))
            || config.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuids[0])),
        "NVIDIA_VISIBLE_DEVICES is not {}: {env}",
        uuids[0]
    );
    // A second container on the same GPU gets the other 1g.10gb, never GPU 0 whole.
    let id2 = sb.id("mig2");
    let c2 = sb
        .start(&id2, &sb.spec().annotation("gpupin.mig", "1g.10gb"))
        .unwrap();
    assert_eq!(
        ls(&c2, "/dev/nvidia-caps"),
        BTreeSet::from(["nvidia-cap93".to_string(), "nvidia-cap94".to_string()])
    );
    c2.stop().unwrap();
    c.stop().unwrap();
    assert!(
        sb.gpupin.holder(&id).is_none(),
        "still held after runc delete"
    );
}

#[test]
fn a_job_on_an_instance_opens_only_its_gpu_and_its_own_caps() {
    let test = "a_job_on_an_instance_opens_only_its_gpu_and_its_own_caps";
    if !harness::need_root(test) {
        return;
    }
    let (mode, controllers, what) = match exec_support::hierarchy_mount("") {
        Some(_) => ("v2", "", "a cgroup2 hierarchy"),
        None => ("v1", "devices", "a cgroup v1 devices hierarchy"),
    };
    let mounted = exec_support::hierarchy_mount(controllers)
        .ok_or_else(|| format!("this machine has no {what} mounted"));
    if harness::required(test, mounted).is_none() {
        return;
    }
    let g = gpupin_sandbox::harness::Gpupin::with_extra(
        GPUPIN,
        "sim:dgxa100mig",
        &format!("confine = {mode:?}"),
    );
    exec_support::open_up(&g);
    let dev = exec_support::scratch(&g).join("dev");
    std::fs::create_dir(&dev).unwrap();
    let mknod = |name: String, major: u32, minor: u32| {
        let out = Command::new("mknod")
            .args(["-m", "666"])
            .arg(dev.join(&name))
            .args(["c", &major.to_string(), &minor.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "mknod: {}", harness::stderr(&out));
    };
    for minor in 0..8 {
        mknod(format!("nvidia{minor}"), GPU_MAJOR, minor);
    }
    for (_, gi, ci) in INSTANCES {
        mknod(format!("nvidia-cap{gi}"), CAPS_MAJOR, gi);
        mknod(format!("nvidia-cap{ci}"), CAPS_MAJOR, ci);
    }
    // A cap node numbered like nvidiactl: opening it must follow the caps' own rules.
    let d = dev.display();
    let probe = format!(
        "echo \"CUDA $CUDA_VISIBLE_DEVICES\"; echo \"NV $NVIDIA_VISIBLE_DEVICES\"; \
         for n in $(ls {d}); do echo \"NODE $n $(cat {d}/$n 2>&1)\"; done"
    );
    let out = exec_support::cmd(
        &g,
        None,
        &["exec", "--mig", "2g.20gb", "--", "sh", "-c", &probe],
    )
    .env("LC_ALL", "C")
    .output()
    .unwrap();
    let stdout = harness::stdout(&out);
    assert!(out.status.success(), "{}", harness::stderr(&out));
    let opened: BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("NODE "))
        .filter(|l| l.ends_with("No such device or address"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // 0:1 is the 2g.20gb: GI access 30, CI access 31, on GPU 0.
    assert_eq!(
        opened,
        BTreeSet::from(["nvidia0", "nvidia-cap30", "nvidia-cap31"]),
        "{stdout}"
    );
    let denied = stdout
        .lines()
        .filter(|l| l.starts_with("NODE ") && l.ends_with("Operation not permitted"))
        .count();
    assert_eq!(denied, 7 + 6, "{stdout}");
    let cuda = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CUDA "))
        .unwrap();
    assert!(
        cuda.starts_with("MIG-5a1e000a-0000-4000-8000-000000000001"),
        "{stdout}"
    );
    let nv = stdout.lines().find_map(|l| l.strip_prefix("NV ")).unwrap();
    assert_eq!(nv, cuda);
    exec_support::until_clean(&g);
}

/// `gpupin pick --mig` shows the instances a request would get, by address and UUID;
/// a profile the machine lacks is refused in one line naming the ones it has. No root.
#[test]
fn pick_shows_the_instances_a_mig_request_would_get() {
    let g = gpupin_sandbox::harness::Gpupin::new(GPUPIN, "sim:dgxa100mig");
    let run = |args: &[&str]| {
        Command::new(GPUPIN)
            .arg("--config")
            .arg(&g.config)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["pick", "--mig", "1g.10gb", "--count", "2"]);
    assert!(out.status.success(), "{}", harness::stderr(&out));
    let text = harness::stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].ends_with("would pick MIG instances 0:2,0:3"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("  0:2  MIG-") && lines[1].ends_with("MIG 1g.10gb"),
        "{text}"
    );
    let out = run(&["pick", "--mig", "4g.40gb"]);
    assert_eq!(out.status.code(), Some(1));
    let err = harness::stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("this machine's profiles: 1g.10gb, 2g.20gb, 3g.40gb"),
        "{err}"
    );
    let out = run(&["pick", "--mig", "big"]);
    let err = harness::stderr(&out);
    assert!(
        err.contains("invalid --mig=\"big\": expected a MIG profile such as 1g.10gb"),
        "{err}"
    );
}
