//! `gpupin doctor`: checks a host and says what is wrong and how to fix it, one finding
//! (`finding::Finding`: status, what, fix) per line. Read only: doctor opens, stats and
//! lists, never writes, locks or reaps (the ledger through `Ledger::survey`, the
//! inventory probed without its cache). Nothing here prints; `cli/doctor.rs` does.
//!
//! The checks, in the order they report:
//! - `config`, `binaries`: which config, and the three binaries side by side;
//! - `driver` (driver.rs): kernel module and NVML, their versions; NVML beside
//!   `nvidia-smi -q -x` (smi.rs, xml.rs) where NVML answers;
//! - `inventory` (inventory.rs): the backend in use, NVML and procfs agreeing;
//! - `nodes` (nodes.rs): /dev/nvidia* against /proc/devices and the inventory;
//! - `cgroups` (cgroups.rs): v1, v2 or both, and what that means for each integration;
//! - `state_dir`, `ledger` (state.rs): the lock directory and what it holds;
//! - `docker` (docker.rs), `hooks` (hooks.rs): the engines' files gpupin writes;
//! - `toolkit`, `cdi` (toolkit.rs): NVIDIA's container toolkit and CDI specs.

mod access;
mod cgroups;
mod docker;
mod driver;
mod finding;
mod hardware;
mod hooks;
mod inventory;
mod nodes;
mod serve;
pub(crate) mod smi;
mod state;
mod toolkit;
mod xml;

pub(crate) use finding::Status;
pub use finding::{Finding, Report};
pub(crate) use hardware::Hardware;

use crate::base::binaries;
use crate::input::config::{Config, DEFAULT_CONFIG_PATH};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where docker's daemon.json is unless `--daemon-json` says otherwise.
pub const DEFAULT_DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// What doctor looks at: the config and every path a check reads, overridable for tests
/// and for a host's non-default layout.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The config the checks judge (the defaults when it could not be read).
    pub config: Config,
    /// Why the config file could not be read, when it could not.
    pub config_error: Option<String>,
    /// The config as given to gpupin (`--config`, `$GPUPIN_CONFIG`), absolute: the fix
    /// commands name it, as an engine must.
    pub config_arg: Option<PathBuf>,
    /// The gpupin binary running doctor: its siblings are the ones engines should run.
    pub exe: PathBuf,
    pub daemon_json: PathBuf,
    /// hooks.d directories of podman and CRI-O, in the order podman reads them.
    pub hooks_dirs: Vec<PathBuf>,
    /// Where `hooks_dirs` came from.
    pub hooks_source: HooksSource,
    /// The host's root: containers.conf and gpupin's own hooks dirs are under it.
    pub root: PathBuf,
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub dev: PathBuf,
    /// `nvidia-smi`: a path, or a name looked up on `path`.
    pub nvidia_smi: PathBuf,
    /// The PATH programs are looked up on.
    pub path: OsString,
}

/// Where doctor's hooks dirs came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HooksSource {
    /// Podman's own list, from containers.conf under the root; `error`: it could not be
    /// read (podman's default is checked then).
    Conf { error: Option<String> },
    /// Named on the command line (`--hooks-dir`): checked as given.
    Given,
}

/// The hooks dirs podman reads on the host under `root`, as containers.conf says.
pub(crate) fn podman_hooks_dirs(root: &Path) -> (Vec<PathBuf>, HooksSource) {
    use crate::engines::install::containers_conf::{ContainersConf, PODMAN_DEFAULT};
    match ContainersConf::at(root).hooks_dirs(false) {
        Ok(dirs) => (
            dirs.iter()
                .map(|d| root.join(d.strip_prefix("/").unwrap_or(d)))
                .collect(),
            HooksSource::Conf { error: None },
        ),
        Err(err) => (
            vec![root.join(PODMAN_DEFAULT.trim_start_matches('/'))],
            HooksSource::Conf {
                error: Some(crate::base::message::one_line(&err)),
            },
        ),
    }
}

impl Setup {
    /// This host's default places, for `config` and the binary `exe`.
    pub fn host(config: Config, exe: PathBuf) -> Setup {
        let (hooks_dirs, hooks_source) = podman_hooks_dirs(Path::new("/"));
        Setup {
            config,
            config_error: None,
            config_arg: None,
            exe,
            daemon_json: PathBuf::from(DEFAULT_DAEMON_JSON),
            hooks_dirs,
            hooks_source,
            root: PathBuf::from("/"),
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
            nvidia_smi: PathBuf::from("nvidia-smi"),
            path: std::env::var_os("PATH").unwrap_or_else(|| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
            }),
        }
    }

    /// `program` as a runnable file: a path as it is, a bare name found on `path`.
    fn find_program(&self, program: &Path) -> Option<PathBuf> {
        if program.components().count() > 1 {
            return is_executable(program).then(|| program.to_path_buf());
        }
        std::env::split_paths(&self.path)
            .map(|dir| dir.join(program))
            .find(|p| is_executable(p))
    }

    /// The gpupin command line that does `args` for this config.
    fn gpupin(&self, args: &str) -> String {
        match &self.config_arg {
            Some(config) => format!("{} --config {} {args}", binaries::CLI, config.display()),
            None => format!("{} {args}", binaries::CLI),
        }
    }

    /// The config file named in fixes: the one read, else where the default would be.
    fn config_file(&self) -> PathBuf {
        self.config
            .path
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }

    /// A sibling of this binary (`binaries::beside`).
    fn sibling(&self, name: &str) -> PathBuf {
        binaries::beside(&self.exe, name)
    }
}

/// Why the program at `path` cannot be run, if it cannot; a bare name is looked up on
/// `setup.path` (as dockerd does for a runtime's path).
fn not_runnable(setup: &Setup, path: &Path) -> Option<&'static str> {
    if path.components().count() == 1 {
        return setup
            .find_program(path)
            .is_none()
            .then_some("which is not on PATH");
    }
    match path.metadata() {
        Err(_) => Some("which does not exist"),
        Ok(m) if !m.is_file() => Some("which is not a file"),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Some("which is not executable"),
        Ok(_) => None,
    }
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Checks the host `setup` describes, asking its driver.
pub fn examine(setup: &Setup) -> Report {
    let hardware = Hardware::probe(&setup.proc, &setup.sys, &setup.dev);
    examine_with(setup, &hardware)
}

/// Checks the host with the driver's answers already in hand.
pub(crate) fn examine_with(setup: &Setup, hardware: &Hardware) -> Report {
    let mut report = Report::default();
    let findings = &mut report.findings;
    findings.push(config(setup));
    findings.push(siblings(setup));
    findings.extend(driver::check(setup, hardware));
    let in_use = inventory::check(setup, hardware, findings);
    if let Some(inventory) = &in_use {
        findings.extend(nodes::check(setup, inventory));
        findings.push(access::check(setup, inventory));
    }
    report.nvml_vs_nvidia_smi = driver::compare_with_smi(setup, hardware, findings);
    findings.extend(cgroups::check(setup));
    findings.extend(state::check(setup));
    findings.push(serve::check(setup));
    findings.extend(docker::check(setup));
    findings.extend(hooks::check(setup));
    findings.extend(toolkit::check(setup, in_use.as_ref()));
    report
}

fn config(setup: &Setup) -> Finding {
    let c = &setup.config;
    if let Some(err) = &setup.config_error {
        return Finding::problem(
            "config",
            format!("{err}; the checks below use the defaults"),
        )
        .fix(format!("correct {}", setup.config_file().display()));
    }
    let file = match &c.path {
        Some(path) => format!("config {}", path.display()),
        None => format!("config: no {DEFAULT_CONFIG_PATH}, the defaults"),
    };
    Finding::ok(
        "config",
        format!(
            "{file}: inventory {}, driver {}, confine {}, state dir {}",
            c.inventory,
            driver_name(c.driver),
            c.confine,
            c.state_dir.display()
        ),
    )
}

fn driver_name(driver: crate::input::config::Driver) -> &'static str {
    match driver {
        crate::input::config::Driver::Auto => "auto",
        crate::input::config::Driver::Cdi => "cdi",
        crate::input::config::Driver::None => "none",
    }
}

/// The hook and the shim must sit beside the CLI: each finds the others by file name.
fn siblings(setup: &Setup) -> Finding {
    let missing: Vec<String> = [binaries::HOOK, binaries::RUNTIME]
        .into_iter()
        .map(|name| setup.sibling(name))
        .filter(|path| !is_executable(path))
        .map(|path| path.display().to_string())
        .collect();
    let dir = setup.exe.parent().unwrap_or(Path::new("/"));
    if missing.is_empty() {
        return Finding::ok(
            "binaries",
            format!(
                "binaries: {}, {} and {} side by side in {}",
                binaries::CLI,
                binaries::HOOK,
                binaries::RUNTIME,
                dir.display()
            ),
        );
    }
    Finding::problem(
        "binaries",
        format!(
            "binaries: {} missing or not executable: each of gpupin's binaries finds the others beside itself",
            missing.join(" and ")
        ),
    )
    .fix(format!(
        "install all three binaries into {} (scripts/build-release builds them)",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::hardware::NvmlReading;
    use crate::input::config::InventorySource;
    use crate::model::gpu::Inventory;
    use std::os::unix::fs::PermissionsExt;

    /// What NVML would say about a two-GPU machine, and procfs the same.
    fn hardware(module: &str, nvml_driver: &str) -> Hardware {
        let mut inventory = crate::policy::testing::machine(2);
        inventory.source = "nvml".into();
        Hardware {
            module: Some(module.into()),
            nvml: Ok(NvmlReading {
                driver: nvml_driver.into(),
                nvml: "12.550.54.15".into(),
                cuda: Some("12.4".into()),
                inventory: inventory.clone(),
            }),
            procfs: Ok(Inventory {
                source: "procfs".into(),
                ..inventory
            }),
        }
    }

    /// A setup whose files are all in `dir`, with `nvidia-smi` a script printing `log`.
    fn setup(dir: &Path, log: &str) -> Setup {
        let smi = dir.join("nvidia-smi");
        std::fs::write(&smi, format!("#!/bin/sh\ncat <<'EOF'\n{log}EOF\n")).unwrap();
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = Config {
            state_dir: dir.join("state"),
            inventory: InventorySource::Auto,
            ..Config::default()
        };
        Setup {
            daemon_json: dir.join("daemon.json"),
            hooks_dirs: vec![dir.join("hooks.d")],
            hooks_source: HooksSource::Given,
            nvidia_smi: smi,
            path: dir.as_os_str().to_owned(),
            ..Setup::host(config, dir.join("gpupin"))
        }
    }

    fn smi_log(minor_of_second: u32) -> String {
        let gpu = |i: u32, minor: u32| {
            format!(
                "<gpu id=\"00000000:{0:02X}:00.0\"><uuid>GPU-test-{i}</uuid><minor_number>{minor}</minor_number>\
                 <pci><pci_bus_id>00000000:{0:02X}:00.0</pci_bus_id></pci>\
                 <fb_memory_usage><total>81920 MiB</total></fb_memory_usage></gpu>\n",
                i + 1
            )
        };
        format!(
            "<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<driver_version>550.54.15</driver_version>\n{}{}</nvidia_smi_log>\n",
            gpu(0, 0),
            gpu(1, minor_of_second)
        )
    }

    fn find<'r>(report: &'r Report, check: &str) -> Vec<&'r Finding> {
        report
            .findings
            .iter()
            .filter(|f| f.check == check)
            .collect()
    }

    /// `examine_with` of a script just written: another test's fork may briefly hold it
    /// open for writing, and nvidia-smi then fails to start (ETXTBSY).
    fn examine_fresh(setup: &Setup, hw: &Hardware) -> Report {
        loop {
            let report = examine_with(setup, hw);
            let busy = find(&report, "nvidia_smi")
                .iter()
                .any(|f| f.what.contains("Text file busy"));
            if !busy {
                return report;
            }
        }
    }

    #[test]
    fn with_nvml_the_driver_inventory_and_nvidia_smi_are_checked_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        let setup = setup(dir.path(), &smi_log(1));
        let report = examine_fresh(&setup, &hardware("550.54.15", "550.54.15"));
        let driver = find(&report, "driver");
        assert_eq!(
            driver[0].what,
            "driver 550.54.15: NVML 12.550.54.15 loads, CUDA 12.4"
        );
        let inventory: Vec<&str> = find(&report, "inventory")
            .iter()
            .map(|f| f.what.as_str())
            .collect();
        assert_eq!(
            inventory,
            [
                "inventory auto: NVML answers, 2 GPUs (Test GPU)",
                "NVML and procfs agree on 2 GPUs: UUIDs, minors, bus ids"
            ]
        );
        let smi = find(&report, "nvidia_smi");
        assert_eq!(smi.len(), 1);
        assert_eq!(
            smi[0].what,
            "nvidia-smi -q -x agrees with NVML on 2 GPUs: uuid, minor, bus id, memory"
        );
        assert_eq!(report.nvml_vs_nvidia_smi.len(), 2);
        assert_eq!(
            report.nvml_vs_nvidia_smi[1].fields[2].nvidia_smi.as_deref(),
            Some("00000000:02:00.0")
        );
    }

    #[test]
    fn a_module_other_than_the_driver_and_a_minor_nvidia_smi_disputes_are_problems() {
        let dir = tempfile::tempdir().unwrap();
        let setup = setup(dir.path(), &smi_log(5));
        let report = examine_fresh(&setup, &hardware("550.54.14", "550.54.15"));
        assert!(report.has_problems());
        let driver = find(&report, "driver");
        assert_eq!(driver[0].status, Status::Problem);
        assert!(
            driver[0]
                .what
                .starts_with("driver: kernel module 550.54.14 but user-space driver 550.54.15"),
            "{}",
            driver[0].what
        );
        let smi = find(&report, "nvidia_smi");
        assert_eq!(smi.len(), 1);
        assert_eq!(smi[0].status, Status::Problem);
        assert_eq!(
            smi[0].what,
            "nvidia-smi: GPU 1 differs: minor 1 (NVML) vs 5 (nvidia-smi)"
        );
    }

    #[test]
    fn without_nvidia_smi_nvml_is_not_cross_checked_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut setup = setup(dir.path(), "");
        setup.nvidia_smi = PathBuf::from("nvidia-smi-nowhere");
        let report = examine_with(&setup, &hardware("550.54.15", "550.54.15"));
        let smi = find(&report, "nvidia_smi");
        assert_eq!(smi[0].status, Status::Warn);
        assert!(report.nvml_vs_nvidia_smi.is_empty());
    }
}
