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

use crate::driver::{
    DRM_MAJOR, GPU_MAJOR, LIB_DIR, NVIDIA_SMI_OUTPUT, control_nodes, mknod, write,
};
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
        self.profile_with_mig(profile, None)
    }

    /// As `profile`, with the GPUs cut into MIG instances as `mig` says (the bridge's
    /// GPUPIN_MOCK_MIG): each GPU in MIG mode then has `"mig": [{"index", "uuid", "name",
    /// "profile", "memory_bytes", "gi", "ci"}]`.
    pub fn profile_with_mig(&self, profile: &str, mig: Option<&str>) -> Result<Value, String> {
        let out = Command::new(self.mock.join("mocknvml-profile"))
            .arg(profile)
            .env("GPUPIN_MOCK_MIG", mig.unwrap_or_default())
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
    /// NVML's bus id, `0000:00:00.0` as the mock serves it.
    pub pci_bus_id: String,
}

impl MockGpu {
    /// Its DRM nodes as the fake root has them: card<minor+1>, renderD<128+minor>.
    pub fn drm_nodes(&self) -> [(String, u32); 2] {
        [
            (format!("card{}", self.minor + 1), self.minor + 1),
            (format!("renderD{}", 128 + self.minor), 128 + self.minor),
        ]
    }

    /// The by-path links udev makes for them, which nvidia-ctk finds a GPU's DRM nodes
    /// by: `pci-<bus id>-card`, `pci-<bus id>-render`.
    pub fn drm_links(&self) -> [String; 2] {
        ["card", "render"].map(|kind| format!("pci-{}-{kind}", self.pci_bus_id.to_lowercase()))
    }
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
    /// The MIG geometry the mock serves (GPUPIN_MOCK_MIG), if any.
    mig: Option<String>,
}

/// The `nvidia-caps` major of a MIG driver root's capability nodes.
pub const CAPS_MAJOR: u32 = 508;

/// The capability minors the driver gives GPU instance `gi` and its compute instance `ci`
/// on the GPU with minor `gpu_minor`: its fixed table (`/proc/driver/nvidia-caps/mig-minors`).
pub fn mig_cap_minors(gpu_minor: u64, gi: u64, ci: u64) -> (u32, u32) {
    let gi_minor = (3 + gpu_minor * 15 * 9 + gi * 9) as u32;
    (gi_minor, gi_minor + 1 + ci as u32)
}

impl MockDriver {
    /// Builds `<dir>/driver-root` for `profile`; the nodes need root (mknod).
    pub fn create(dir: &Path, peers: &Peers, profile: &str) -> Result<MockDriver, String> {
        Self::create_with_mig(dir, peers, profile, None)
    }

    /// As `create`, with the mock's GPUs cut as `mig` says: the root also has the
    /// instances' capability nodes (`dev/nvidia-caps/nvidia-cap<N>`), and `<dir>/proc-driver`
    /// the driver's `nvidia-caps/mig-minors`, which `generate` mounts on /proc/driver for
    /// nvidia-ctk (it reads the minors from the host's /proc, not the driver root).
    pub fn create_with_mig(
        dir: &Path,
        peers: &Peers,
        profile: &str,
        mig: Option<&str>,
    ) -> Result<MockDriver, String> {
        let served = peers.profile_with_mig(profile, mig)?;
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
                pci_bus_id: g["pci_bus_id"].as_str().unwrap_or_default().to_string(),
            })
            .collect::<Vec<_>>();
        let driver = MockDriver {
            root: dir.join("driver-root"),
            version,
            gpus,
            peers: peers.clone(),
            profile: profile.to_string(),
            served,
            mig: mig.map(str::to_string),
        };
        for file in driver.files() {
            write(&driver.host_path(&file), &format!("fake {file}\n"), 0o644)?;
        }
        write(
            &driver.host_path("/usr/bin/nvidia-smi"),
            &format!("#!/bin/sh\necho '{NVIDIA_SMI_OUTPUT}'\n"),
            0o755,
        )?;
        let dri = driver.root.join("dev/dri");
        for gpu in &driver.gpus {
            mknod(
                &driver.root.join(format!("dev/nvidia{}", gpu.minor)),
                GPU_MAJOR,
                gpu.minor,
            )?;
            for ((name, minor), link) in gpu.drm_nodes().into_iter().zip(gpu.drm_links()) {
                mknod(&dri.join(&name), DRM_MAJOR, minor)?;
                std::fs::create_dir_all(dri.join("by-path")).map_err(|e| e.to_string())?;
                std::os::unix::fs::symlink(format!("../{name}"), dri.join("by-path").join(&link))
                    .map_err(|e| format!("{link}: {e}"))?;
            }
        }
        for (name, major, minor) in control_nodes() {
            mknod(&driver.root.join("dev").join(name), major, minor)?;
        }
        if driver.mig.is_some() {
            let mut minors = String::from("config 1\nmonitor 2\n");
            for (gpu, m) in driver.mig_instances() {
                let (gi, ci) = (
                    m["gi"].as_u64().unwrap_or_default(),
                    m["ci"].as_u64().unwrap_or_default(),
                );
                let (gi_minor, ci_minor) =
                    mig_cap_minors(gpu["minor"].as_u64().unwrap_or_default(), gi, ci);
                for minor in [gi_minor, ci_minor] {
                    let node = driver
                        .root
                        .join(format!("dev/nvidia-caps/nvidia-cap{minor}"));
                    if !node.exists() {
                        mknod(&node, CAPS_MAJOR, minor)?;
                    }
                }
                let g = gpu["minor"].as_u64().unwrap_or_default();
                minors.push_str(&format!(
                    "gpu{g}/gi{gi}/access {gi_minor}\ngpu{g}/gi{gi}/ci{ci}/access {ci_minor}\n"
                ));
            }
            write(
                &driver.proc_driver().join("nvidia-caps/mig-minors"),
                &minors,
                0o444,
            )?;
        }
        Ok(driver)
    }

    /// The stand-in for /proc/driver that `generate` mounts where the mock has MIG.
    fn proc_driver(&self) -> PathBuf {
        self.root.with_file_name("proc-driver")
    }

    /// Each MIG device the mock serves, with its GPU: `(gpu, mig)` as `mocknvml-profile`
    /// prints them.
    pub fn mig_instances(&self) -> Vec<(Value, Value)> {
        let mut out = Vec::new();
        for gpu in self.served["gpus"].as_array().into_iter().flatten() {
            for m in gpu["mig"].as_array().into_iter().flatten() {
                out.push((gpu.clone(), m.clone()));
            }
        }
        out
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

    /// A gpupin inventory file (docs/reference.md, "Inventory file format") with the mock's GPUs,
    /// so that gpupin hands out the GPUs the spec describes, under their own UUIDs.
    pub fn write_inventory(&self, path: &Path) -> Result<(), String> {
        let gpus: Vec<Value> = self.served["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                let mut gpu = json!({
                    "index": g["index"], "uuid": g["uuid"], "name": g["name"],
                    "memory": g["memory_bytes"], "pci_bus_id": g["pci_bus_id"],
                    "minor": g["minor"],
                });
                // Instances with their GI/CI ids (the minors default to the driver's
                // table, the one the root's nodes follow).
                if let Some(migs) = g["mig"].as_array() {
                    gpu["mig"] = migs
                        .iter()
                        .map(|m| {
                            json!({"index": m["index"], "uuid": m["uuid"], "profile": m["profile"],
                                   "memory": m["memory_bytes"], "gi": m["gi"], "ci": m["ci"]})
                        })
                        .collect();
                }
                gpu
            })
            .collect();
        let mut doc = json!({ "gpus": gpus });
        if self.mig.is_some() {
            doc["caps_major"] = json!(CAPS_MAJOR);
        }
        let text = serde_json::to_string_pretty(&doc).unwrap();
        write(path, &text, 0o644)
    }

    /// `nvidia-ctk cdi generate --driver-root <root> --output <output>` against the mock
    /// NVML, as an admin runs it, with `extra` options (e.g. `--device-name-strategy=uuid`);
    /// the spec names the real nvidia-cdi-hook (`--nvidia-cdi-hook-path`, since it is not
    /// on PATH here). Returns the spec's text.
    pub fn generate(&self, output: &Path, extra: &[&str]) -> Result<String, String> {
        let mut cmd = match &self.mig {
            None => Command::new(self.peers.tool("nvidia-ctk")),
            // nvidia-ctk reads the capability minors from /proc/driver/nvidia-caps: run it
            // where the stand-in is mounted there (needs root, as the nodes do).
            Some(mig) => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg("mount --bind \"$0\" /proc/driver && exec \"$@\"")
                    .arg(self.proc_driver())
                    .arg(self.peers.tool("nvidia-ctk"))
                    .env("GPUPIN_MOCK_MIG", mig);
                cmd
            }
        };
        let out = cmd
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

/// The spec `nvidia-ctk cdi generate` writes on another machine (NVIDIA's DGX H100 mock,
/// a driver root of its own under `dir`), saved as `<cdi>/nvidia.yaml`: none of its GPUs
/// is one of the simulated machines' of the harnesses, as after a spec was copied from
/// another server. Returns the spec's path.
pub fn another_machines_spec(dir: &Path, peers: &Peers, cdi: &Path) -> Result<PathBuf, String> {
    let driver = MockDriver::create(dir, peers, "dgxh100")?;
    std::fs::create_dir_all(cdi).map_err(|e| format!("{}: {e}", cdi.display()))?;
    let spec = cdi.join("nvidia.yaml");
    driver.generate(&spec, &[])?;
    Ok(spec)
}

/// Points gpupin's config at `inventory` (replacing its `inventory = ...` line, or
/// adding one): the harnesses write a simulated machine, the toolkit's spec is for the
/// mock's GPUs.
pub fn use_inventory(config: &Path, inventory: &Path) {
    let text = std::fs::read_to_string(config).unwrap();
    let line = format!("inventory = {:?}", inventory.display().to_string());
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| {
            !l.trim_start().starts_with("inventory ") && !l.trim_start().starts_with("inventory=")
        })
        .map(String::from)
        .collect();
    lines.insert(0, line);
    std::fs::write(config, lines.join("\n") + "\n").unwrap();
}

/// What a container given `chosen` through nvidia-ctk's spec must see, asked with `sh`
/// (a shell in the container): exactly the chosen GPU's node and the spec's control
/// nodes, never another GPU's (`all`); the driver's files mounted read-only; nvidia-smi
/// runs; the spec's env; and the effects of the real `nvidia-cdi-hook` the spec names:
/// create-symlinks made `libcuda.so -> libcuda.so.1`, update-ldcache wrote the
/// container's /etc/ld.so.cache.
pub fn assert_toolkit_driver_inside(
    sh: &dyn Fn(&str) -> String,
    driver: &MockDriver,
    chosen: &MockGpu,
) {
    let mut nvidia: Vec<String> = sh("ls /dev")
        .split_whitespace()
        .filter(|n| n.starts_with("nvidia"))
        .map(String::from)
        .collect();
    nvidia.sort();
    let mut expected: Vec<String> = control_nodes()
        .iter()
        .map(|(n, _, _)| n.to_string())
        .collect();
    expected.push(format!("nvidia{}", chosen.minor));
    expected.sort();
    assert_eq!(
        nvidia, expected,
        "the GPU nodes of {} ({})",
        chosen.uuid, chosen.minor
    );

    let mounts = sh("cat /proc/mounts");
    for file in driver.files() {
        let line = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(file.as_str()))
            .unwrap_or_else(|| panic!("{file} is not a mount point: {mounts}"));
        let options = line.split_whitespace().nth(3).unwrap_or_default();
        assert!(options.split(',').any(|o| o == "ro"), "{file}: {line}");
        assert_eq!(
            sh(&format!(
                "if (echo x >> {file}) 2>/dev/null; then echo written; else echo refused; fi"
            ))
            .trim(),
            "refused",
            "writing {file} in the container"
        );
        if !file.ends_with("nvidia-smi") {
            assert_eq!(sh(&format!("cat {file}")), format!("fake {file}\n"));
        }
    }
    assert_eq!(sh("/usr/bin/nvidia-smi").trim(), NVIDIA_SMI_OUTPUT);
    // `; echo` keeps sh as pid 1 (a lone command is exec'ed in its place): under ctr run,
    // tr as pid 1 was seen to read an empty /proc/1/environ.
    let env = sh("tr '\\0' '\\n' < /proc/1/environ; echo");
    let env: Vec<&str> = env.lines().collect();
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=void"), "{env:?}");
    assert!(
        env.contains(&format!("NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}").as_str()),
        "{env:?}"
    );
    assert_eq!(
        sh(&format!("readlink {LIB_DIR}/libcuda.so")).trim(),
        "libcuda.so.1",
        "nvidia-cdi-hook create-symlinks did not run"
    );
    assert_eq!(
        sh("test -s /etc/ld.so.cache && echo cached").trim(),
        "cached",
        "nvidia-cdi-hook update-ldcache did not run"
    );
}
