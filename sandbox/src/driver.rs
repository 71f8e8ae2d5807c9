//! What NVIDIA's container toolkit would find on a real GPU host, built in a temp dir:
//! a driver root (`usr/lib/x86_64-linux-gnu/libcuda.so.<ver>`, `libnvidia-ml.so.<ver>`,
//! `usr/bin/nvidia-smi`, the GSP firmware, and character nodes under `dev/` with the
//! simulated machine's numbers), a CDI spec in the form `nvidia-ctk cdi generate
//! --driver-root <root>` writes (toolkit >= 1.19: devices by index and by UUID, `all`,
//! common nodes, mounts and createContainer hooks), and a stand-in `nvidia-cdi-hook` that
//! logs the calls it gets. OCI hooks run on the host, so the stand-in is a host script.
//! `gpupin demo` shows a container getting it (it cannot depend on the Go test peers);
//! the end-to-end tests use NVIDIA's nvidia-ctk and nvidia-cdi-hook (`harness::toolkit`).

use serde_json::Value;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The simulated machines' numbers (the contract of `sim:nvswitch8` and `sim:pcie8`):
/// GPU nodes `195:<minor>`, minors 0..7, and three control nodes.
pub const GPU_MAJOR: u32 = 195;
pub const CONTROL_NODES: &[(&str, u32, u32)] = &[
    ("nvidiactl", 195, 255),
    ("nvidia-uvm", 510, 0),
    ("nvidia-uvm-tools", 510, 1),
];

/// The driver version the fake root carries.
pub const DRIVER_VERSION: &str = "570.133.20";
/// Where nvidia-ctk puts the driver's libraries on Debian and Ubuntu.
pub const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";
/// What the stand-in `nvidia-smi` prints.
pub const NVIDIA_SMI_OUTPUT: &str = "fake nvidia-smi from the test driver root";
/// Major of the DRM nodes (`/dev/dri/card<N>`, `renderD<N>`).
pub const DRM_MAJOR: u32 = 226;

/// Indentation of list items in a device entry's edits and in the spec-wide edits,
/// nvidia-ctk's four-space layout.
const DEVICE_ITEM: usize = 12;
const COMMON_ITEM: usize = 8;

/// One GPU of the simulated machine, as `gpupin status --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGpu {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
}

impl FakeGpu {
    /// The GPUs of a `gpupin status --json` answer.
    pub fn from_status(status: &Value) -> Vec<FakeGpu> {
        status["gpus"]
            .as_array()
            .expect("status has gpus")
            .iter()
            .map(|g| FakeGpu {
                index: g["index"].as_u64().unwrap() as u32,
                uuid: g["uuid"].as_str().unwrap().to_string(),
                minor: g["minor"].as_u64().unwrap() as u32,
            })
            .collect()
    }

    /// Its DRM nodes, as nvidia-ctk names them: card<minor+1>, renderD<128+minor>.
    pub fn drm_nodes(&self) -> [(String, u32); 2] {
        [
            (format!("card{}", self.minor + 1), self.minor + 1),
            (format!("renderD{}", 128 + self.minor), 128 + self.minor),
        ]
    }

    /// A PCI bus id for the DRM by-path links (the simulated machines have their own;
    /// any distinct one does here).
    pub fn bus_id(&self) -> String {
        format!("0000:{:02x}:00.0", self.minor + 0x17)
    }
}

/// A fake driver root with its stand-in hook and its hook log.
pub struct DriverRoot {
    /// The root, as nvidia-ctk's `--driver-root`.
    pub root: PathBuf,
    /// What the stand-in nvidia-cdi-hook appends to: `<container id> <args>` per call.
    pub hook_log: PathBuf,
    /// The stand-in, at `<root>/usr/bin/nvidia-cdi-hook`.
    pub hook: PathBuf,
}

/// The driver's files, container paths (the same paths under the root on the host).
pub fn driver_files() -> Vec<String> {
    vec![
        format!("{LIB_DIR}/libcuda.so.{DRIVER_VERSION}"),
        format!("{LIB_DIR}/libnvidia-ml.so.{DRIVER_VERSION}"),
        "/usr/bin/nvidia-smi".to_string(),
        format!("/lib/firmware/nvidia/{DRIVER_VERSION}/gsp_ga10x.bin"),
    ]
}

/// The control nodes nvidia-ctk lists for every device, with the numbers the simulated
/// machines use (`CONTROL_NODES`) and nvidia-modeset (195:254), which CDI adds.
pub fn control_nodes() -> Vec<(&'static str, u32, u32)> {
    let mut nodes = vec![("nvidia-modeset", GPU_MAJOR, 254)];
    nodes.extend(CONTROL_NODES.iter().copied());
    nodes
}

impl DriverRoot {
    /// Builds the root under `dir` for `gpus`; the nodes need root (mknod).
    pub fn create(dir: &Path, gpus: &[FakeGpu]) -> Result<DriverRoot, String> {
        let root = dir.join("driver-root");
        for file in driver_files() {
            let path = root.join(file.trim_start_matches('/'));
            write(&path, &format!("fake {file}\n"), 0o644)?;
        }
        let smi = root.join("usr/bin/nvidia-smi");
        write(
            &smi,
            &format!("#!/bin/sh\necho '{NVIDIA_SMI_OUTPUT}'\n"),
            0o755,
        )?;
        for gpu in gpus {
            mknod(
                &root.join(format!("dev/nvidia{}", gpu.minor)),
                GPU_MAJOR,
                gpu.minor,
            )?;
            for (name, minor) in gpu.drm_nodes() {
                mknod(&root.join("dev/dri").join(name), DRM_MAJOR, minor)?;
            }
        }
        for (name, major, minor) in control_nodes() {
            mknod(&root.join("dev").join(name), major, minor)?;
        }
        let hook_log = dir.join("nvidia-cdi-hook.log");
        let hook = root.join("usr/bin/nvidia-cdi-hook");
        // createContainer hooks get the container's state on stdin: its id goes first.
        // The hook's env is the spec's (NVIDIA_CTK_DEBUG only): PATH is set here.
        let script = format!(
            "#!/bin/sh\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\nid=$(sed -n 's/.*\"id\" *: *\"\\([^\"]*\\)\".*/\\1/p')\necho \"$id $*\" >> '{}'\nexit 0\n",
            hook_log.display()
        );
        write(&hook, &script, 0o755)?;
        Ok(DriverRoot {
            root,
            hook_log,
            hook,
        })
    }

    /// Host path of a driver file given by its container path.
    pub fn host_path(&self, container_path: &str) -> PathBuf {
        self.root.join(container_path.trim_start_matches('/'))
    }

    /// Writes `<dir>/nvidia.yaml` for `gpus` and returns its path.
    pub fn write_cdi_spec(&self, dir: &Path, gpus: &[FakeGpu]) -> Result<PathBuf, String> {
        let path = dir.join("nvidia.yaml");
        write(&path, &self.cdi_spec(gpus), 0o644)?;
        Ok(path)
    }

    /// The spec text, as nvidia-ctk >= 1.19 writes it with `--driver-root`: hostPath
    /// under the root, containerPath and path the host's real paths.
    pub fn cdi_spec(&self, gpus: &[FakeGpu]) -> String {
        let mut y = String::from("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n");
        for gpu in gpus {
            for name in [format!("\"{}\"", gpu.index), gpu.uuid.clone()] {
                let _ = writeln!(y, "    - name: {name}\n      containerEdits:");
                y += &self.device_edits(&[gpu]);
            }
        }
        y += "    - name: all\n      containerEdits:\n";
        y += &self.device_edits(&gpus.iter().collect::<Vec<_>>());
        y += "containerEdits:\n    env:\n";
        let _ = writeln!(y, "        - NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}");
        y += "        - NVIDIA_VISIBLE_DEVICES=void\n    deviceNodes:\n";
        for (name, major, minor) in control_nodes() {
            y += &self.node(COMMON_ITEM, &format!("/dev/{name}"), major, minor);
        }
        y += "    hooks:\n";
        let libcuda = format!("libcuda.so.1::{LIB_DIR}/libcuda.so");
        let compat = format!("--host-driver-version={DRIVER_VERSION}");
        for args in [
            vec!["create-symlinks", "--link", &libcuda],
            vec!["enable-cuda-compat", &compat],
            vec!["update-ldcache", "--folder", LIB_DIR],
            vec!["disable-device-node-modification"],
        ] {
            y += &self.hook_entry(COMMON_ITEM, &args);
        }
        y += "    mounts:\n";
        for file in driver_files() {
            let _ = write!(
                y,
                "        - hostPath: {}\n          containerPath: {file}\n          options:\n",
                self.host_path(&file).display()
            );
            for option in ["ro", "nosuid", "nodev", "rbind", "rprivate"] {
                let _ = writeln!(y, "            - {option}");
            }
        }
        y
    }

    /// One device entry's edits: its nodes and the DRM by-path links hook.
    fn device_edits(&self, gpus: &[&FakeGpu]) -> String {
        let mut y = String::from("        deviceNodes:\n");
        let mut links = Vec::new();
        for gpu in gpus {
            let node = format!("/dev/nvidia{}", gpu.minor);
            y += &self.node(DEVICE_ITEM, &node, GPU_MAJOR, gpu.minor);
            for ((name, minor), kind) in gpu.drm_nodes().into_iter().zip(["card", "render"]) {
                y += &self.node(DEVICE_ITEM, &format!("/dev/dri/{name}"), DRM_MAJOR, minor);
                links.push("--link".to_string());
                links.push(format!(
                    "../{name}::/dev/dri/by-path/pci-{}-{kind}",
                    gpu.bus_id()
                ));
            }
        }
        let mut args = vec!["create-symlinks"];
        args.extend(links.iter().map(String::as_str));
        y += "        hooks:\n";
        y += &self.hook_entry(DEVICE_ITEM, &args);
        y
    }

    /// A deviceNodes item indented `item` spaces; minor left out when 0 (Go's
    /// omitempty, as nvidia-ctk writes it).
    fn node(&self, item: usize, path: &str, major: u32, minor: u32) -> String {
        let (dash, field) = (" ".repeat(item), " ".repeat(item + 2));
        let host = self.root.join(path.trim_start_matches('/'));
        let mut y = format!(
            "{dash}- path: {path}\n{field}hostPath: {}\n{field}major: {major}\n",
            host.display()
        );
        if minor != 0 {
            let _ = writeln!(y, "{field}minor: {minor}");
        }
        let _ = write!(y, "{field}fileMode: 438\n{field}permissions: rwm\n");
        y
    }

    /// A createContainer hook item of the stand-in, `argv[0]` `nvidia-cdi-hook`.
    fn hook_entry(&self, item: usize, args: &[&str]) -> String {
        let (dash, field, sub) = (" ".repeat(item), " ".repeat(item + 2), " ".repeat(item + 4));
        let mut y = format!(
            "{dash}- hookName: createContainer\n{field}path: {}\n{field}args:\n{sub}- nvidia-cdi-hook\n",
            self.hook.display()
        );
        for arg in args {
            let _ = writeln!(y, "{sub}- {}", quote(arg));
        }
        let _ = write!(y, "{field}env:\n{sub}- NVIDIA_CTK_DEBUG=false\n");
        y
    }

    /// The stand-in's calls: (container id, args after `argv[0]`) per line.
    pub fn hook_calls(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(&self.hook_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(id, args)| (id.to_string(), args.to_string()))
            .collect()
    }
}

/// Quoted as nvidia-ctk's YAML writer quotes a string with `:` in it.
fn quote(arg: &str) -> String {
    if arg.contains(':') {
        format!("\"{arg}\"")
    } else {
        arg.to_string()
    }
}

pub(crate) fn write(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::create_dir_all(path.parent().unwrap()).map_err(fail)?;
    std::fs::write(path, text).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

/// A character node `major:minor` at `path` (needs CAP_MKNOD).
pub(crate) fn mknod(path: &Path, major: u32, minor: u32) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    std::fs::create_dir_all(path.parent().unwrap())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mknod with a NUL-terminated path we own.
    let rc = unsafe {
        libc::mknod(
            c_path.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "mknod {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> Vec<FakeGpu> {
        (0..2)
            .map(|i| FakeGpu {
                index: i,
                uuid: format!("GPU-test-{i}"),
                minor: i,
            })
            .collect()
    }

    #[test]
    fn the_spec_has_index_uuid_and_all_entries_with_paths_under_the_root() {
        let root = DriverRoot {
            root: PathBuf::from("/r"),
            hook_log: PathBuf::from("/log"),
            hook: PathBuf::from("/r/usr/bin/nvidia-cdi-hook"),
        };
        let spec = root.cdi_spec(&gpus());
        for name in [
            "- name: \"0\"",
            "- name: GPU-test-0",
            "- name: \"1\"",
            "- name: all",
        ] {
            assert!(spec.contains(name), "{name}\n{spec}");
        }
        assert!(spec.contains(&format!(
            "        - hostPath: /r{LIB_DIR}/libcuda.so.{DRIVER_VERSION}\n          containerPath: {LIB_DIR}/libcuda.so.{DRIVER_VERSION}\n"
        )));
        assert!(spec.contains(
            "                - --link\n                - \"../card2::/dev/dri/by-path/pci-0000:18:00.0-card\"\n"
        ));
        assert!(spec.contains("            - path: /dev/nvidia1\n              hostPath: /r/dev/nvidia1\n              major: 195\n              minor: 1\n"), "{spec}");
        // minor 0 is left out, as Go's omitempty does.
        assert!(spec.contains("            - path: /dev/nvidia0\n              hostPath: /r/dev/nvidia0\n              major: 195\n              fileMode: 438\n"), "{spec}");
    }
}
