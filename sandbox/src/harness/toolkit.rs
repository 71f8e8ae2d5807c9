//! NVIDIA's container toolkit itself, as tests/peers/build builds it from the Go module
//! proxy (`<cache>/toolkit/`: nvidia-ctk, nvidia-container-runtime,
//! nvidia-container-runtime-hook, nvidia-cdi-hook), run against NVIDIA's mock NVML
//! (`<cache>/mocknvml/`, go-nvml's mock servers behind the peers' cgo bridge) and a fake
//! driver root: the CDI specs the tests hand gpupin are the ones `nvidia-ctk cdi generate`
//! writes, naming the real `nvidia-cdi-hook`, not text written here in its form.
//!
//! The driver root has what the existing stand-in has (libcuda, libnvidia-ml, nvidia-smi,
//! GSP firmware, the device nodes) at the mock's driver version, since nvidia-ctk looks
//! the libraries and firmware up by the version NVML reports.

use crate::driver::{GPU_MAJOR, LIB_DIR, NVIDIA_SMI_OUTPUT, control_nodes, mknod, write};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The peers' cache: `$GPUPIN_PEERS_CACHE`, else `~/.cache/gpupin-peers`.
pub fn peers_cache() -> Result<PathBuf, String> {
    match std::env::var_os("GPUPIN_PEERS_CACHE").filter(|c| !c.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(
            PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
                .join(".cache/gpupin-peers"),
        ),
    }
}

/// Where tests/peers/build put NVIDIA's toolkit and the mock NVML.
#[derive(Debug, Clone)]
pub struct Peers {
    /// `<cache>/toolkit/`, with the four binaries.
    pub toolkit: PathBuf,
    /// `<cache>/mocknvml/`, with libnvidia-ml.so.1 and mocknvml-profile.
    pub mock: PathBuf,
}

impl Peers {
    /// The built peers, or why they are not there (then: run tests/peers/build).
    pub fn find() -> Result<Peers, String> {
        let cache = peers_cache()?;
        let peers = Peers {
            toolkit: cache.join("toolkit"),
            mock: cache.join("mocknvml"),
        };
        let needed = [
            peers.tool("nvidia-ctk"),
            peers.tool("nvidia-cdi-hook"),
            peers.tool("nvidia-container-runtime"),
            peers.tool("nvidia-container-runtime-hook"),
            peers.mock.join("libnvidia-ml.so.1"),
            peers.mock.join("mocknvml-profile"),
        ];
        match needed.iter().find(|p| !p.exists()) {
            Some(missing) => Err(format!(
                "no {}: run tests/peers/build (needs Go)",
                missing.display()
            )),
            None => Ok(peers),
        }
    }

    /// One of the toolkit's binaries.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.toolkit.join(name)
    }

    /// The toolkit's version (`v1.20.2`), as tests/peers/build recorded it.
    pub fn toolkit_version(&self) -> String {
        std::fs::read_to_string(self.toolkit.join("version"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// What the mock serves for `profile` (`dgxa100`, `dgxh100`, `a30pcie`), from NVIDIA's
    /// mock server: `{"driver", "gpus": [{"index", "uuid", "name", "memory_bytes",
    /// "pci_bus_id", "minor"}]}`.
    pub fn profile(&self, profile: &str) -> Result<Value, String> {
        let out = Command::new(self.mock.join("mocknvml-profile"))
            .arg(profile)
            .output()
            .map_err(|e| format!("mocknvml-profile: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mocknvml-profile {profile}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("mocknvml-profile: {e}"))
    }
}

/// One GPU the mock serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockGpu {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
}

/// A fake driver root for a mock NVML profile, and what `nvidia-ctk cdi generate` makes
/// of it.
pub struct MockDriver {
    /// The root, as nvidia-ctk's `--driver-root`.
    pub root: PathBuf,
    /// The driver version the mock reports (and the root's files carry).
    pub version: String,
    pub gpus: Vec<MockGpu>,
    pub peers: Peers,
    profile: String,
    served: Value,
}

impl MockDriver {
    /// Builds `<dir>/driver-root` for `profile`; the nodes need root (mknod).
    pub fn create(dir: &Path, peers: &Peers, profile: &str) -> Result<MockDriver, String> {
        let served = peers.profile(profile)?;
        let version = served["driver"]
            .as_str()
            .ok_or("the profile names no driver version")?
            .to_string();
        let gpus = served["gpus"]
            .as_array()
            .ok_or("the profile has no gpus")?
            .iter()
            .map(|g| MockGpu {
                index: g["index"].as_u64().unwrap_or_default() as u32,
                uuid: g["uuid"].as_str().unwrap_or_default().to_string(),
                minor: g["minor"].as_u64().unwrap_or_default() as u32,
            })
            .collect::<Vec<_>>();
        let driver = MockDriver {
            root: dir.join("driver-root"),
            version,
            gpus,
            peers: peers.clone(),
            profile: profile.to_string(),
            served,
        };
        for file in driver.files() {
            write(&driver.host_path(&file), &format!("fake {file}\n"), 0o644)?;
        }
        write(
            &driver.host_path("/usr/bin/nvidia-smi"),
            &format!("#!/bin/sh\necho '{NVIDIA_SMI_OUTPUT}'\n"),
            0o755,
        )?;
        for gpu in &driver.gpus {
            mknod(
                &driver.root.join(format!("dev/nvidia{}", gpu.minor)),
                GPU_MAJOR,
                gpu.minor,
            )?;
        }
        for (name, major, minor) in control_nodes() {
            mknod(&driver.root.join("dev").join(name), major, minor)?;
        }
        Ok(driver)
    }

    /// The driver's files, container paths (the same paths under the root on the host).
    pub fn files(&self) -> Vec<String> {
        let v = &self.version;
        vec![
            format!("{LIB_DIR}/libcuda.so.{v}"),
            format!("{LIB_DIR}/libnvidia-ml.so.{v}"),
            "/usr/bin/nvidia-smi".to_string(),
            format!("/lib/firmware/nvidia/{v}/gsp_ga10x.bin"),
        ]
    }

    /// Host path of a driver file given by its container path.
    pub fn host_path(&self, container_path: &str) -> PathBuf {
        self.root.join(container_path.trim_start_matches('/'))
    }

    /// A gpupin inventory file (README, "Inventory file format") with the mock's GPUs,
    /// so that gpupin hands out the GPUs the spec describes, under their own UUIDs.
    pub fn write_inventory(&self, path: &Path) -> Result<(), String> {
        let gpus: Vec<Value> = self.served["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                json!({
                    "index": g["index"], "uuid": g["uuid"], "name": g["name"],
                    "memory": g["memory_bytes"], "pci_bus_id": g["pci_bus_id"],
                    "minor": g["minor"],
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&json!({ "gpus": gpus })).unwrap();
        write(path, &text, 0o644)
    }

    /// `nvidia-ctk cdi generate --driver-root <root> --output <output>` against the mock
    /// NVML, as an admin runs it, with `extra` options (e.g. `--device-name-strategy=uuid`);
    /// the spec names the real nvidia-cdi-hook (`--nvidia-cdi-hook-path`, since it is not
    /// on PATH here). Returns the spec's text.
    pub fn generate(&self, output: &Path, extra: &[&str]) -> Result<String, String> {
        let out = Command::new(self.peers.tool("nvidia-ctk"))
            .args(["--quiet", "cdi", "generate", "--driver-root"])
            .arg(&self.root)
            .arg("--nvidia-cdi-hook-path")
            .arg(self.peers.tool("nvidia-cdi-hook"))
            .arg("--output")
            .arg(output)
            .args(extra)
            .env("LD_LIBRARY_PATH", &self.peers.mock)
            .env("GPUPIN_MOCK_NVML_PROFILE", &self.profile)
            .output()
            .map_err(|e| format!("nvidia-ctk: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "nvidia-ctk cdi generate {extra:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::read_to_string(output).map_err(|e| format!("{}: {e}", output.display()))
    }
}
