//! `gpupin inventory import` on the fixtures: the text nvidia-smi prints for machines
//! users have (tests/fixtures/NAME.topo.txt, with NAME.gpus.txt where there is a GPU
//! list) becomes the inventory file beside it (NAME.json), which describes the same
//! machine as `sim:NAME`. Needs neither root nor GPUs.

use gpupin::parts::{Inventory, InventorySource, NvmlAccess, inventory};
use std::path::{Path, PathBuf};
use std::process::Command;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `gpupin inventory import` as a user runs it; the config is never read.
fn import(args: &[&Path]) -> Inventory {
    let out = Command::new(GPUPIN)
        .env("GPUPIN_CONFIG", "/nonexistent/gpupin.toml")
        .args(["inventory", "import"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    inventory::from_json(&text, Path::new("imported")).unwrap()
}

fn file(name: &str) -> Inventory {
    gpupin::parts::load_inventory(
        &InventorySource::File(fixture(&format!("{name}.json"))),
        Path::new("/nonexistent"),
        &NvmlAccess::InProcess,
    )
    .unwrap()
}

fn sim(name: &str) -> Inventory {
    gpupin::parts::load_inventory(
        &InventorySource::Sim(name.into()),
        Path::new("/nonexistent"),
        &NvmlAccess::InProcess,
    )
    .unwrap()
}

/// Equal but for what a file cannot know: its source, and `local_cpus` (a simulated
/// machine takes them from the host that runs it).
fn same_machine(mut a: Inventory, mut b: Inventory) {
    for inv in [&mut a, &mut b] {
        inv.source.clear();
        inv.gpus.iter_mut().for_each(|g| g.local_cpus = None);
    }
    assert_eq!(a, b);
}

#[test]
fn matrices_with_a_csv_gpu_list_become_the_simulated_machines() {
    for name in ["dgxa100", "hgxh200", "gh200pair", "pcie8pxb"] {
        let topo = fixture(&format!("{name}.topo.txt"));
        let gpus = fixture(&format!("{name}.gpus.txt"));
        let got = import(&[&topo, Path::new("--gpus"), &gpus]);
        let mut want = file(name);
        want.source = got.source.clone();
        assert_eq!(got, want, "{name}");
        same_machine(got, sim(name));
    }
}

#[test]
fn dash_l_gives_names_and_uuids_but_no_memory_or_bus() {
    let got = import(&[
        &fixture("nvbridge4.topo.txt"),
        Path::new("--gpus"),
        &fixture("nvbridge4.gpus.txt"),
    ]);
    let mut want = file("nvbridge4");
    want.source = got.source.clone();
    assert_eq!(got, want);
    let sim = sim("nvbridge4");
    assert_eq!(got.links, sim.links);
    for (g, s) in got.gpus.iter().zip(&sim.gpus) {
        assert_eq!(
            (&g.uuid, &g.name, g.numa_node),
            (&s.uuid, &s.name, s.numa_node)
        );
        assert_eq!(g.memory_bytes, 0);
    }
}

/// `nvidia-smi -L` on a GPU cut into MIG instances lists them indented under it: the
/// import gives the instances of `sim:dgxa100mig` (UUIDs, profiles, addresses), without
/// the GI and CI ids the list does not print.
#[test]
fn dash_l_with_mig_devices_gives_the_instances_under_their_gpu() {
    let got = import(&[
        &fixture("dgxa100.topo.txt"),
        Path::new("--gpus"),
        &fixture("dgxa100mig.gpus.txt"),
    ]);
    let sim = sim("dgxa100mig");
    let shown = |inv: &Inventory| -> Vec<(String, String, String)> {
        inv.mig_instances()
            .map(|m| (m.address(), m.uuid.clone(), m.profile_name().to_string()))
            .collect()
    };
    assert_eq!(shown(&got), shown(&sim));
    assert!(got.mig_instances().all(|m| m.access.is_none()));
    assert_eq!(got.gpus[0].uuid, sim.gpus[0].uuid);
    assert!(!got.gpus[1].in_mig_mode());
    // `gpupin inventory` on the imported file shows them under their parent.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("machine.json");
    std::fs::write(&file, inventory::to_json(&got)).unwrap();
    let config = dir.path().join("gpupin.toml");
    std::fs::write(
        &config,
        format!(
            "inventory = {:?}\nstate_dir = {:?}\n",
            file.display().to_string(),
            dir.path().join("state").display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(GPUPIN)
        .env("GPUPIN_CONFIG", &config)
        .arg("inventory")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[1].contains("NVIDIA A100-SXM4-80GB [MIG mode]"),
        "{text}"
    );
    assert!(
        lines[2].starts_with(" 0:0") && lines[2].contains("MIG 3g.40gb"),
        "{text}"
    );
    assert!(
        lines[5].contains("MIG 1g.10gb") && lines[5].contains("(no gi/ci)"),
        "{text}"
    );
    assert!(lines[6].starts_with("1 "), "{text}");
    assert!(text.contains("8 GPUs, 4 MIG instances"), "{text}");
}

#[test]
fn an_old_driver_without_a_list_keeps_the_links() {
    let got = import(&[&fixture("cubemesh8-legacy.topo.txt")]);
    let mut want = file("cubemesh8-legacy");
    want.source = got.source.clone();
    assert_eq!(got, want);
    assert_eq!(got.links, sim("cubemesh8").links);
    assert_eq!(got.gpus[4].local_cpus.as_deref(), Some("20-39,60-79"));
    assert_eq!(got.gpus[0].name, "unknown");
}

#[test]
fn writes_the_file_and_reads_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("machine.json");
    let status = Command::new(GPUPIN)
        .args(["inventory", "import", "-", "--output"])
        .arg(&out)
        .stdin(std::fs::File::open(fixture("hgxh200.topo.txt")).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let written = inventory::from_json(&std::fs::read_to_string(&out).unwrap(), &out).unwrap();
    assert_eq!(written.links, sim("hgxh200").links);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
}

#[test]
fn a_bad_matrix_is_one_line_naming_the_cell() {
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("topo.txt");
    std::fs::write(&topo, "\tGPU0\tGPU1\nGPU0\t X \tNV-1\nGPU1\tNV-1\t X \n").unwrap();
    let out = Command::new(GPUPIN)
        .args(["inventory", "import"])
        .arg(&topo)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("row GPU0, column GPU1: \"NV-1\" is not a link"),
        "{err}"
    );
}
