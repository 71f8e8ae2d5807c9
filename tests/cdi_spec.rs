//! The test support's fake driver root and CDI spec against gpupin's CDI reader: the
//! spec the generator writes for the simulated machine is one gpupin reads, and it gives
//! the chosen GPU its own entry, the common edits, and nothing of the other GPUs.
//! `gpupin demo` builds on both; the end-to-end suites use the spec NVIDIA's nvidia-ctk
//! generates (gpupin-sandbox harness::toolkit).

use gpupin::parts::driver;

use gpupin::parts::{ContainerEdits, Driver, InventorySource, NvmlAccess};
use gpupin_sandbox::harness::driver::{DRIVER_VERSION, DriverRoot, FakeGpu, driver_files};
use gpupin_sandbox::harness::{self, GPU_MAJOR};
use std::path::Path;

#[test]
fn the_generated_spec_gives_gpupins_choice_its_entry_and_the_driver_files() {
    if !harness::need_root("the_generated_spec_gives_gpupins_choice_its_entry") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source: InventorySource = "sim:nvswitch8".parse().unwrap();
    let inv = gpupin::parts::load_inventory(&source, dir.path(), &NvmlAccess::InProcess).unwrap();
    let gpus: Vec<FakeGpu> = inv
        .gpus
        .iter()
        .map(|g| FakeGpu {
            index: g.index,
            uuid: g.uuid.clone(),
            minor: g.minor,
        })
        .collect();
    let root = DriverRoot::create(dir.path(), &gpus).unwrap();
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    root.write_cdi_spec(&cdi, &gpus).unwrap();

    let chosen = inv.gpus[3].uuid.clone();
    let mut edits = ContainerEdits::default();
    driver::add_for_spec(Driver::Cdi, &[cdi], &inv, &[chosen], "c1", &mut edits).unwrap();

    let nodes: Vec<(&str, u32, u32)> = edits
        .nodes
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor))
        .collect();
    assert_eq!(
        nodes,
        [
            ("/dev/nvidia-modeset", GPU_MAJOR, 254),
            ("/dev/nvidiactl", GPU_MAJOR, 255),
            ("/dev/nvidia-uvm", 510, 0),
            ("/dev/nvidia-uvm-tools", 510, 1),
            ("/dev/nvidia3", GPU_MAJOR, 3),
            ("/dev/dri/card4", 226, 4),
            ("/dev/dri/renderD131", 226, 131),
        ]
    );
    let mounts: Vec<(&str, &Path)> = edits
        .mounts
        .iter()
        .map(|m| (m.destination.as_str(), Path::new(&m.source)))
        .collect();
    let files = driver_files();
    let expected: Vec<(&str, std::path::PathBuf)> = files
        .iter()
        .map(|f| (f.as_str(), root.host_path(f)))
        .collect();
    let expected: Vec<(&str, &Path)> = expected.iter().map(|(f, p)| (*f, p.as_path())).collect();
    assert_eq!(mounts, expected);
    assert!(edits.mounts.iter().all(|m| m.options[0] == "ro"));
    let hooks: Vec<String> = edits.hooks.iter().map(|h| h.args[1..].join(" ")).collect();
    assert_eq!(
        hooks,
        [
            "create-symlinks --link libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so".to_string(),
            format!("enable-cuda-compat --host-driver-version={DRIVER_VERSION}"),
            "update-ldcache --folder /usr/lib/x86_64-linux-gnu".to_string(),
            "disable-device-node-modification".to_string(),
            "create-symlinks --link ../card4::/dev/dri/by-path/pci-0000:1a:00.0-card --link ../renderD131::/dev/dri/by-path/pci-0000:1a:00.0-render".to_string(),
        ]
    );
    assert!(
        edits
            .hooks
            .iter()
            .all(|h| h.stage == "createContainer" && h.path == root.hook.display().to_string())
    );
    let env: Vec<String> = edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    assert_eq!(
        env,
        [
            "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",
            "NVIDIA_VISIBLE_DEVICES=void"
        ]
    );
}
