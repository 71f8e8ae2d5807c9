//! A gpupin configuration with its own state dir in a temp dir, and for the runc tests a
//! busybox rootfs and a private runc root beside it.

use crate::{
    BundleSpec, Container, HookCommand, Requirements, Runc, SandboxError, build_busybox_rootfs,
    write_bundle,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// A gpupin configuration in a temp dir: state dir, inventory, and the binary to call.
pub struct Gpupin {
    pub dir: tempfile::TempDir,
    pub bin: PathBuf,
    pub config: PathBuf,
    pub state_dir: PathBuf,
}

impl Gpupin {
    /// `bin`: the gpupin binary (or its namesake in `$GPUPIN_BIN_DIR`); `machine`: its
    /// inventory (`sim:nvswitch8`).
    pub fn new(bin: impl AsRef<Path>, machine: &str) -> Gpupin {
        Gpupin::with_extra(bin, machine, "")
    }

    /// As `new`, with more config lines (`max_shared = 2`, `live_file = "..."`).
    pub fn with_extra(bin: impl AsRef<Path>, machine: &str, extra: &str) -> Gpupin {
        let dir = tempfile::Builder::new()
            .prefix("gpupin-e2e")
            .tempdir()
            .unwrap();
        let state_dir = dir.path().join("state");
        let config = dir.path().join("gpupin.toml");
        let text = format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = {machine:?}\npolicy = \"pack\"\n{extra}\n",
            state_dir.to_str().unwrap(),
            state_dir.join("audit.log").to_str().unwrap()
        );
        std::fs::write(&config, text).unwrap();
        Gpupin {
            dir,
            bin: super::binary(bin.as_ref().to_str().expect("a UTF-8 binary path")),
            config,
            state_dir,
        }
    }

    /// `gpupin --config <ours> ARGS`, stdin from `input`.
    pub fn run(&self, args: &[&str], input: &str) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--config").arg(&self.config).args(args);
        super::run_with_input(&mut cmd, input)
    }

    /// `gpupin status --json`, which must succeed.
    pub fn status(&self) -> Value {
        super::status::query(&self.bin, &self.config)
    }

    /// The ledger's record of `id` as `status --json` shows it.
    pub fn holder(&self, id: &str) -> Option<Value> {
        super::status::holder(&self.status(), id)
    }

    /// Minors of the GPUs `id` holds, sorted.
    pub fn held_minors(&self, id: &str) -> Vec<u32> {
        super::status::held_minors(&self.status(), id)
    }

    /// Every file under <state_dir>/holders with its bytes: "the ledger" for before/after
    /// comparisons.
    pub fn ledger_snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        super::ledger::holder_files(&self.state_dir)
    }
}

/// A gpupin configuration plus what real containers need.
pub struct Sandbox {
    pub gpupin: Gpupin,
    pub runc: Runc,
    pub rootfs: PathBuf,
    pub hook: HookCommand,
    test: String,
}

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

impl Sandbox {
    /// `None` (after saying why on stderr) where root, runc or busybox is missing; under
    /// CI=true a missing requirement fails the test instead.
    pub fn new(bin: impl AsRef<Path>, test: &str) -> Option<Sandbox> {
        Sandbox::with_machine(bin, test, "sim:nvswitch8")
    }

    pub fn with_machine(bin: impl AsRef<Path>, test: &str, machine: &str) -> Option<Sandbox> {
        Sandbox::with_config(bin, test, machine, "")
    }

    /// A sandbox whose gpupin config has `extra` lines besides state dir and machine.
    pub fn with_config(
        bin: impl AsRef<Path>,
        test: &str,
        machine: &str,
        extra: &str,
    ) -> Option<Sandbox> {
        let reqs = super::required(test, Requirements::check())?;
        super::announce_engines();
        let gpupin = Gpupin::with_extra(bin, machine, extra);
        let root = gpupin.dir.path().join("runc-root");
        let rootfs = gpupin.dir.path().join("rootfs");
        build_busybox_rootfs(&reqs.busybox, &rootfs).unwrap();
        let hook = HookCommand::beside(&gpupin.bin, Some(gpupin.config.clone()));
        Some(Sandbox {
            runc: Runc::new(&reqs.runc, &root),
            rootfs,
            hook,
            test: test.to_string(),
            gpupin,
        })
    }

    /// A container id unique to this test run: cgroups are named after container ids and
    /// are global to the machine.
    pub fn id(&self, name: &str) -> String {
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        format!("e2e-{}-{n}-{name}", std::process::id())
    }

    /// A `sleep 1000` container on the shared rootfs with gpupin's hooks.
    pub fn spec(&self) -> BundleSpec {
        BundleSpec::sleeper(&self.rootfs).with_hook(&self.hook)
    }

    /// Writes a bundle for `id` and runs it detached.
    pub fn start(&self, id: &str, spec: &BundleSpec) -> Result<Container, SandboxError> {
        let bundle = self.bundle_dir(id);
        write_bundle(&bundle, spec)?;
        self.runc.run_detached(id, &bundle)
    }

    pub fn bundle_dir(&self, id: &str) -> PathBuf {
        self.gpupin.dir.path().join("bundles").join(id)
    }

    pub fn test(&self) -> &str {
        &self.test
    }
}
