//! A one-layer busybox image as a `docker save` archive, made here because no registry is
//! reachable: the layer is the busybox rootfs tarred, the config names its digest and a
//! `sleep` command (which serves as the pod's pause process too).

use gpupin_sandbox::{build_busybox_rootfs, find_static_busybox};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the image's containers run unless told otherwise: long enough for any test.
const CMD: [&str; 2] = ["sleep", "100000"];

/// Writes the archive of image `reference` under `dir`; returns its path.
pub fn busybox_archive(dir: &Path, reference: &str) -> PathBuf {
    let rootfs = dir.join("rootfs");
    build_busybox_rootfs(&find_static_busybox().unwrap(), &rootfs).unwrap();
    let image = dir.join("image");
    std::fs::create_dir_all(&image).unwrap();
    let layer = image.join("layer.tar");
    tar(&rootfs, &layer, &["."]);
    let diff_id = format!(
        "sha256:{}",
        hex(&Sha256::digest(std::fs::read(&layer).unwrap()))
    );
    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": CMD},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    std::fs::write(image.join("config.json"), config.to_string()).unwrap();
    let manifest = serde_json::json!([{
        "Config": "config.json",
        "RepoTags": [reference],
        "Layers": ["layer.tar"],
    }]);
    std::fs::write(image.join("manifest.json"), manifest.to_string()).unwrap();
    let archive = dir.join("image.tar");
    tar(
        &image,
        &archive,
        &["manifest.json", "config.json", "layer.tar"],
    );
    archive
}

/// `tar -cf OUT -C DIR PATHS`, owners as numbers (the image must not depend on the
/// host's user names).
fn tar(dir: &Path, out: &Path, paths: &[&str]) {
    let status = Command::new("tar")
        .arg("--numeric-owner")
        .arg("-cf")
        .arg(out)
        .arg("-C")
        .arg(dir)
        .args(paths)
        .status()
        .expect("running tar");
    assert!(
        status.success(),
        "tar of {} failed: {status}",
        dir.display()
    );
}

/// The image-spec name of this machine's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
