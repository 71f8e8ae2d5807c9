//! Podman's and CRI-O's hooks.d files (`install::podman` writes them): all three stages
//! present, each running an existing gpupin-hook with the config doctor judged, and no
//! NVIDIA prestart hook sorted before gpupin's.

use super::docker::{config_finding, flag_value, same_file};
use super::{Finding, Setup, Status, not_runnable};
use crate::base::binaries;
use crate::base::safe_open::{self, Links};
use crate::engines::install::podman::{self, STAGES};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub(super) const CHECK: &str = "hooks";

/// Where podman reads hooks.d files (packages', then the administrator's, which wins for
/// a file of the same name); CRI-O's default `hooks_dir` is the first.
pub const DEFAULT_HOOKS_DIRS: [&str; 2] = [VENDOR_HOOKS_DIR, podman::HOOKS_DIR];

/// Where packages put hooks: the gpupin package's files there are dpkg's, and a file of the
/// same name in podman::HOOKS_DIR takes their place.
const VENDOR_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";

/// One of gpupin's file names in a dir, as found.
enum Found {
    Absent,
    Ours(Value),
    /// A file under gpupin's name that gpupin did not write.
    Foreign,
    Unreadable(String),
}

pub(super) fn check(setup: &Setup) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut any = false;
    for dir in &setup.hooks_dirs {
        let files: Vec<(&str, PathBuf, Found)> = STAGES
            .iter()
            .map(|stage| {
                let path = dir.join(podman::file_name(stage));
                let found = read(&path, stage);
                (*stage, path, found)
            })
            .collect();
        if files.iter().all(|(_, _, f)| matches!(f, Found::Absent)) {
            continue;
        }
        any = true;
        findings.extend(check_dir(setup, dir, &files));
    }
    if !any {
        let dirs: Vec<String> = setup
            .hooks_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let engines: Vec<&str> = ["podman", "crio"]
            .into_iter()
            .filter(|p| setup.find_program(Path::new(p)).is_some())
            .collect();
        findings.push(match engines.is_empty() {
            true => Finding::ok(
                CHECK,
                format!(
                    "hooks: no gpupin hooks in {}, and no podman or crio on PATH: nothing to check",
                    dirs.join(", ")
                ),
            ),
            false => Finding::warn(
                CHECK,
                format!(
                    "hooks: no gpupin hooks in {}: {} start{} containers without gpupin",
                    dirs.join(", "),
                    engines.join(" and "),
                    if engines.len() == 1 { "s" } else { "" }
                ),
            )
            .fix(setup.gpupin("install podman")),
        });
    }
    findings
}

fn read(path: &Path, stage: &str) -> Found {
    // Admins link hooks into place: a link is followed, a FIFO refused rather than read.
    match safe_open::read(path, Links::Follow) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if podman::is_gpupin_hook(&v, stage) => Found::Ours(v),
            _ => Found::Foreign,
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Found::Absent,
        Err(err) => Found::Unreadable(err.to_string()),
    }
}

/// How to put gpupin's hooks right in `dir`. Never by writing into the packages' dir: its
/// files are dpkg's (the issue: doctor told admins to overwrite them); files of the same
/// name in /etc/containers/oci/hooks.d take their place instead.
fn install_command(setup: &Setup, dir: &Path) -> String {
    if dir == Path::new(VENDOR_HOOKS_DIR) {
        return format!(
            "{} (its files in {} take the place of the package's of the same name)",
            setup.gpupin("install podman"),
            podman::HOOKS_DIR
        );
    }
    let mut args = "install podman".to_string();
    if dir != Path::new(podman::HOOKS_DIR) {
        args.push_str(&format!(" --dir {}", dir.display()));
    }
    setup.gpupin(&args)
}

fn check_dir(setup: &Setup, dir: &Path, files: &[(&str, PathBuf, Found)]) -> Vec<Finding> {
    let install = install_command(setup, dir);
    let mut findings = Vec::new();
    let mut ours = Vec::new();
    for (stage, path, found) in files {
        match found {
            Found::Ours(content) => ours.push((*stage, path, content)),
            Found::Absent => findings.push(
                Finding::problem(
                    CHECK,
                    format!(
                        "hooks: {} is missing beside gpupin's other hooks: {}",
                        path.display(),
                        missing_stage(stage)
                    ),
                )
                .fix(install.clone()),
            ),
            Found::Foreign => findings.push(
                Finding::warn(
                    CHECK,
                    format!(
                        "hooks: {} is not a hook gpupin wrote for {stage}",
                        path.display()
                    ),
                )
                .fix(format!("move it away, then {install}")),
            ),
            Found::Unreadable(err) => findings.push(Finding::problem(
                CHECK,
                format!("hooks: reading {}: {err}", path.display()),
            )),
        }
    }
    let mut programs = Vec::new();
    let mut configs = Vec::new();
    for (_, path, content) in &ours {
        let program = PathBuf::from(content["hook"]["path"].as_str().unwrap_or_default());
        let args: Vec<&str> = content["hook"]["args"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let config = flag_value(&args, "--config").map(PathBuf::from);
        findings.extend(check_program(setup, path, &program, &install));
        if !configs.contains(&config) {
            configs.push(config);
        }
        if !programs.contains(&program) {
            programs.push(program);
        }
    }
    for config in &configs {
        findings.extend(config_finding(
            setup,
            config.as_deref(),
            CHECK,
            "gpupin-hook",
            &install,
        ));
    }
    for name in podman::nvidia_hooks_before_gpupin(dir) {
        findings.push(
            Finding::warn(
                CHECK,
                format!(
                    "hooks: {} runs NVIDIA's hook at prestart before gpupin's, so on the prestart path (CRI-O) it cannot see gpupin's choice",
                    dir.join(&name).display()
                ),
            )
            .fix("rename it to sort after gpupin-prestart.json (the toolkit's name is oci-nvidia-hook.json)"),
        );
    }
    if findings.iter().all(|f| f.status == Status::Ok) {
        let trigger = match ours
            .first()
            .map(|(_, _, c)| c["when"].get("always").is_some())
        {
            Some(true) => "every container",
            // The one way a request goes unseen: say it where the admin looks.
            _ => {
                "containers with a gpupin.* annotation (podman --label and -e GPUPIN_* never reach it: use --annotation, or `gpupin install podman --always` for env requests)"
            }
        };
        let shown: Vec<String> = programs.iter().map(|p| p.display().to_string()).collect();
        findings.push(Finding::ok(
            CHECK,
            format!(
                "hooks: {}: precreate, prestart and poststop run {} for {trigger}",
                dir.display(),
                shown.join(", ")
            ),
        ));
    }
    findings
}

/// The hook program a file runs: there, runnable, and the one beside this gpupin.
fn check_program(setup: &Setup, file: &Path, program: &Path, install: &str) -> Option<Finding> {
    // oci-hooks(5): the path is absolute, never looked up on PATH.
    let broken = match program.is_absolute() {
        true => not_runnable(setup, program),
        false => Some("which is not an absolute path"),
    };
    let runs = format!("hooks: {} runs {}", file.display(), program.display());
    if let Some(why) = broken {
        return Some(Finding::problem(CHECK, format!("{runs}, {why}")).fix(install));
    }
    // Older gpupins wrote hooks that run the CLI itself (`gpupin hook STAGE`).
    let ours = same_file(program, &setup.sibling(binaries::HOOK)) || same_file(program, &setup.exe);
    (!ours).then(|| {
        Finding::warn(
            CHECK,
            format!("{runs}, not the {} beside this gpupin", binaries::HOOK),
        )
        .fix(install)
    })
}

/// What a container loses when `stage`'s hook does not run.
fn missing_stage(stage: &str) -> &'static str {
    match stage {
        "precreate" => {
            "podman starts containers without gpupin's precreate edit, so the prestart hook must do it all"
        }
        "prestart" => {
            "containers edited at precreate are never bound to their process, so their GPUs go back to the pool after claim_grace while they still run"
        }
        _ => {
            "GPUs are not released when a container stops, only when gpupin gc or the next allocation reaps them"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packages' hooks dir is dpkg's: the fix never writes into it.
    #[test]
    fn the_fix_for_the_packages_hooks_dir_writes_to_etc() {
        let setup = Setup::host(
            crate::input::config::Config::default(),
            "/usr/bin/gpupin".into(),
        );
        let vendor = install_command(&setup, Path::new(VENDOR_HOOKS_DIR));
        assert!(!vendor.contains("--dir"), "{vendor}");
        assert!(
            vendor.ends_with(
                "(its files in /etc/containers/oci/hooks.d take the place of the package's of the same name)"
            ),
            "{vendor}"
        );
        let elsewhere = install_command(&setup, Path::new("/opt/hooks.d"));
        assert!(
            elsewhere.contains("install podman --dir /opt/hooks.d"),
            "{elsewhere}"
        );
        let etc = install_command(&setup, Path::new(podman::HOOKS_DIR));
        assert!(etc.ends_with("install podman"), "{etc}");
    }
}
