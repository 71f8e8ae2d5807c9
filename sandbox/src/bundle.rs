//! A runc bundle: config.json from `runc spec`'s defaults (runc 1.1), changed only where a
//! detached, non-interactive test container needs it, plus gpupin's hooks.

use super::SandboxError;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// runc kills a hook that runs longer; a stuck hook must fail a test, not hang it.
const HOOK_TIMEOUT_S: u64 = 30;

/// How the bundle's hooks call gpupin: `gpupin-hook [--config CONFIG] STAGE`, as gpupin
/// writes its own hooks into specs it edits, or, when `exe` is the CLI (file name
/// `gpupin`), `gpupin [--config CONFIG] hook STAGE`.
#[derive(Debug, Clone)]
pub struct HookCommand {
    /// Absolute path of the `gpupin-hook` binary.
    pub exe: PathBuf,
    /// Passed on the command line: runc runs hooks with an empty environment.
    pub config: Option<PathBuf>,
}

impl HookCommand {
    /// The `gpupin-hook` installed beside `gpupin` (cargo builds them side by side).
    pub fn beside(gpupin: &Path, config: Option<PathBuf>) -> Self {
        HookCommand {
            exe: gpupin.with_file_name("gpupin-hook"),
            config,
        }
    }

    /// argv, `argv[0]` (the file name of `exe`) included.
    pub fn args(&self, stage: &str) -> Vec<String> {
        let name = self.exe.file_name().unwrap_or_default().to_string_lossy();
        let mut args = vec![name.to_string()];
        if let Some(config) = &self.config {
            args.push("--config".into());
            args.push(config.display().to_string());
        }
        if name == "gpupin" {
            args.push("hook".into());
        }
        args.push(stage.to_string());
        args
    }
}

/// One entry of `hooks.<stage>` in OCI form, with the arguments gpupin writes into specs
/// itself (`argv[0]` is the program name).
fn hook_entry(hook: &HookCommand, stage: &str) -> Value {
    json!({
        "path": hook.exe,
        "args": hook.args(stage),
        "timeout": HOOK_TIMEOUT_S,
    })
}

/// What differs between the containers of the demo and the tests.
#[derive(Debug, Clone)]
pub struct BundleSpec {
    pub args: Vec<String>,
    /// `KEY=VALUE`, after runc's default PATH and TERM.
    pub env: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    /// `None`: no hooks at all, a plain container.
    pub hook: Option<HookCommand>,
    /// Host path of the root filesystem; absolute, so one rootfs can serve many bundles.
    pub rootfs: PathBuf,
    /// runc's default tmpfs on /dev. Without it the container sees the rootfs's own /dev.
    pub dev_tmpfs: bool,
}

impl BundleSpec {
    /// A container that runs `sleep 1000` on `rootfs`, without hooks or requests.
    pub fn sleeper(rootfs: &Path) -> Self {
        BundleSpec {
            args: vec!["sleep".into(), "1000".into()],
            env: Vec::new(),
            annotations: BTreeMap::new(),
            hook: None,
            rootfs: rootfs.to_path_buf(),
            dev_tmpfs: true,
        }
    }

    pub fn with_hook(mut self, hook: &HookCommand) -> Self {
        self.hook = Some(hook.clone());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push(format!("{key}={value}"));
        self
    }

    pub fn without_dev_tmpfs(mut self) -> Self {
        self.dev_tmpfs = false;
        self
    }

    /// The whole config.json.
    pub fn to_config(&self) -> Value {
        let mut env = vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            "TERM=xterm".to_string(),
        ];
        env.extend(self.env.iter().cloned());
        let mut config = json!({
            "ociVersion": "1.0.2-dev",
            "process": {
                // Detached runc hands its own stdio to the container; no terminal.
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": self.args,
                "env": env,
                "cwd": "/",
                "capabilities": default_capabilities(),
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
                "noNewPrivileges": true,
            },
            // Writable: `ls` and friends need nothing, but a read-only root would also stop
            // runc from creating missing mount points.
            "root": {"path": self.rootfs, "readonly": false},
            "hostname": "gpupin-sandbox",
            "annotations": self.annotations,
            "mounts": default_mounts(self.dev_tmpfs),
            "linux": default_linux(),
        });
        if let Some(hook) = &self.hook {
            config["hooks"] = json!({
                "prestart": [hook_entry(hook, "prestart")],
                "poststop": [hook_entry(hook, "poststop")],
            });
        }
        config
    }
}

/// Creates `dir` and writes `dir/config.json`; returns `dir`.
pub fn write_bundle(dir: &Path, spec: &BundleSpec) -> Result<PathBuf, SandboxError> {
    std::fs::create_dir_all(dir).map_err(SandboxError::io("creating", dir))?;
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&spec.to_config()).expect("a json! value serializes");
    std::fs::write(&path, text).map_err(SandboxError::io("writing", &path))?;
    Ok(dir.to_path_buf())
}

fn default_capabilities() -> Value {
    let caps = json!(["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]);
    json!({
        "bounding": caps, "effective": caps, "permitted": caps, "ambient": caps,
    })
}

fn default_mounts(dev_tmpfs: bool) -> Value {
    let mut mounts = vec![json!({"destination": "/proc", "type": "proc", "source": "proc"})];
    if dev_tmpfs {
        mounts.push(json!({
            "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        }));
    }
    mounts.extend([
        json!({
            "destination": "/dev/pts", "type": "devpts", "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        }),
        json!({
            "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        }),
        json!({
            "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        }),
        json!({
            "destination": "/sys", "type": "sysfs", "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        }),
        json!({
            "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        }),
    ]);
    Value::Array(mounts)
}

fn default_linux() -> Value {
    json!({
        // Deny everything but runc's defaults, as `runc spec` does: a GPU the container can
        // open is then one gpupin granted.
        "resources": {"devices": [{"allow": false, "access": "rwm"}]},
        "namespaces": [
            {"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
        ],
        "maskedPaths": [
            "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
        ],
        "readonlyPaths": [
            "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_call_gpupin_with_its_config() {
        let hook = HookCommand::beside(Path::new("/usr/bin/gpupin"), Some("/etc/g.toml".into()));
        let c = BundleSpec::sleeper(Path::new("/r"))
            .with_hook(&hook)
            .to_config();
        assert_eq!(c["hooks"]["prestart"][0]["path"], "/usr/bin/gpupin-hook");
        assert_eq!(
            c["hooks"]["poststop"][0]["args"],
            json!(["gpupin-hook", "--config", "/etc/g.toml", "poststop"])
        );
        let cli = HookCommand {
            exe: "/usr/bin/gpupin".into(),
            config: None,
        };
        assert_eq!(cli.args("prestart"), ["gpupin", "hook", "prestart"]);
    }

    #[test]
    fn plain_container_has_no_hooks_and_keeps_dev_tmpfs() {
        let c = BundleSpec::sleeper(Path::new("/r")).to_config();
        assert!(c.get("hooks").is_none());
        assert!(
            c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["destination"] == "/dev")
        );
        let c = BundleSpec::sleeper(Path::new("/r"))
            .without_dev_tmpfs()
            .to_config();
        assert!(
            !c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["destination"] == "/dev")
        );
    }

    #[test]
    fn env_and_annotations_are_added() {
        let c = BundleSpec::sleeper(Path::new("/r"))
            .env("GPUPIN_COUNT", "2")
            .annotation("gpupin.policy", "spread")
            .to_config();
        assert_eq!(c["process"]["env"][2], "GPUPIN_COUNT=2");
        assert_eq!(c["annotations"]["gpupin.policy"], "spread");
    }
}
