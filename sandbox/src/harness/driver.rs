//! The fake NVIDIA driver root (`crate::driver`), and what a container that got it
//! through CDI must show.

pub use crate::driver::*;

/// What a container holding `chosen` (of the machine's `gpus`) must show when it got
/// the driver through this root's CDI spec; `sh` runs a script in it and returns stdout.
/// Panics with what is wrong.
pub fn assert_driver_inside(
    sh: &dyn Fn(&str) -> String,
    root: &DriverRoot,
    chosen: &FakeGpu,
    gpus: &[FakeGpu],
    container_id: &str,
) {
    let files = driver_files();
    let mut script = String::from(
        "ls /dev; echo ---; ls /dev/dri; echo ---; cat /proc/mounts; echo ---; \
         tr '\\0' '\\n' < /proc/1/environ; echo ---; /usr/bin/nvidia-smi 2>&1; echo ---; ",
    );
    for file in &files {
        script += &format!(
            "if (echo x >> {file}) 2>/dev/null; then echo written; else echo refused; fi; cat {file}; "
        );
    }
    let out = sh(&script);
    let parts: Vec<&str> = out.split("---\n").collect();
    assert_eq!(parts.len(), 6, "{out}");
    let words = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };

    let nvidia: Vec<String> = words(parts[0])
        .into_iter()
        .filter(|n| n.starts_with("nvidia"))
        .collect();
    let mut expected: Vec<String> = control_nodes()
        .iter()
        .map(|(n, _, _)| n.to_string())
        .collect();
    expected.push(format!("nvidia{}", chosen.minor));
    expected.sort();
    let mut seen = nvidia.clone();
    seen.sort();
    assert_eq!(seen, expected, "/dev: {}", parts[0]);
    let mut drm: Vec<String> = chosen.drm_nodes().into_iter().map(|(n, _)| n).collect();
    drm.sort();
    assert_eq!(words(parts[1]), drm, "/dev/dri of GPU {}", chosen.minor);

    for file in &files {
        let line = parts[2]
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(file.as_str()))
            .unwrap_or_else(|| panic!("{file} is not a mount point: {}", parts[2]));
        let options = line.split_whitespace().nth(3).unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "{file} not read-only: {line}"
        );
        assert!(options.split(',').any(|o| o == "nosuid"), "{file}: {line}");
    }
    let env = words(parts[3]);
    assert!(
        env.iter().any(|e| e == "NVIDIA_VISIBLE_DEVICES=void"),
        "env: {env:?}"
    );
    assert!(!env.iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=") && e != "NVIDIA_VISIBLE_DEVICES=void"), "env: {env:?}");
    assert!(
        env.contains(&format!("NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}")),
        "env: {env:?}"
    );
    assert_eq!(parts[4].trim(), NVIDIA_SMI_OUTPUT);
    let mut checks = parts[5].lines();
    for file in &files {
        assert_eq!(
            checks.next(),
            Some("refused"),
            "writing {file} in the container"
        );
        if file.ends_with("nvidia-smi") {
            checks.next();
            checks.next();
        } else {
            assert_eq!(checks.next(), Some(format!("fake {file}").as_str()));
        }
    }

    let calls: Vec<String> = root
        .hook_calls()
        .into_iter()
        .filter(|(id, _)| id == container_id)
        .map(|(_, args)| args)
        .collect();
    let mut links = Vec::new();
    for ((name, _), kind) in chosen.drm_nodes().into_iter().zip(["card", "render"]) {
        links.push(format!(
            "--link ../{name}::/dev/dri/by-path/pci-{}-{kind}",
            chosen.bus_id()
        ));
    }
    let expected = [
        format!("create-symlinks --link libcuda.so.1::{LIB_DIR}/libcuda.so"),
        format!("enable-cuda-compat --host-driver-version={DRIVER_VERSION}"),
        format!("update-ldcache --folder {LIB_DIR}"),
        "disable-device-node-modification".to_string(),
        format!("create-symlinks {}", links.join(" ")),
    ];
    assert_eq!(calls, expected, "nvidia-cdi-hook calls of {container_id}");
    for other in gpus.iter().filter(|g| g.minor != chosen.minor) {
        assert!(
            !calls.iter().any(|c| c.contains(&other.bus_id())),
            "GPU {} leaked: {calls:?}",
            other.minor
        );
    }
}
