//! Podman's and CRI-O's hooks.d files (`install::podman` writes them): all three stages
//! present, each running an existing gpupin-hook with the config doctor judged, and no
//! NVIDIA prestart hook sorted before gpupin's.

use super::docker::{config_finding, flag_value, same_file};
use super::{Finding, HooksSource, Setup, Status, not_runnable};
use crate::base::binaries;
use crate::base::safe_open::{self, Links};
use crate::engines::install::containers_conf;
use crate::engines::install::podman::{self, STAGES};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub(super) const CHECK: &str = "hooks";

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
    if let HooksSource::Conf { error: Some(error) } = &setup.hooks_source {
        findings.push(Finding::problem(CHECK, format!("hooks: {error}")));
    }
    // Podman reads the dirs in order, a later file of a name taking the place of an
    // earlier one: what runs is the last of each name.
    let last = setup.hooks_dirs.last().cloned().unwrap_or_default();
    let mut files: Vec<(&str, PathBuf, Found)> = STAGES
        .iter()
        .map(|stage| (*stage, last.join(podman::file_name(stage)), Found::Absent))
        .collect();
    for dir in &setup.hooks_dirs {
        for (stage, path, found) in files.iter_mut() {
            let here = dir.join(podman::file_name(stage));
            let read = read_file(&here, stage);
            if !matches!(read, Found::Absent) {
                *path = here;
                *found = read;
            }
        }
    }
    if setup.hooks_source != HooksSource::Given {
        findings.extend(unread_dirs(setup));
        findings.extend(crio_refuses_precreate(setup));
    }
    let any = files.iter().any(|(_, _, f)| !matches!(f, Found::Absent));
    if any {
        findings.extend(check_dir(setup, &files));
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

fn read_file(path: &Path, stage: &str) -> Found {
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

/// gpupin's hooks in a dir of gpupin's that podman does not read: podman 4.3 reads only
/// /usr/share/containers/oci/hooks.d unless containers.conf's hooks_dir says otherwise
/// (`containers_conf`), so files there do nothing without the drop-in.
fn unread_dirs(setup: &Setup) -> Vec<Finding> {
    let read: Vec<String> = setup
        .hooks_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    [containers_conf::ADMIN_HOOKS_DIR, containers_conf::PACKAGE_HOOKS_DIR]
        .into_iter()
        .map(|dir| setup.root.join(dir.trim_start_matches('/')))
        .filter(|dir| !setup.hooks_dirs.contains(dir))
        .filter(|dir| {
            STAGES.iter().any(|stage| {
                matches!(read_file(&dir.join(podman::file_name(stage)), stage), Found::Ours(_))
            })
        })
        .map(|dir| {
            Finding::problem(
                CHECK,
                format!(
                    "hooks: gpupin's hooks in {} never run: podman reads {} (containers.conf hooks_dir)",
                    dir.display(),
                    read.join(", ")
                ),
            )
            .fix(format!(
                "{} (writes {} naming it)",
                setup.gpupin("install podman"),
                containers_conf::ContainersConf::at(&setup.root).drop_in().display()
            ))
        })
        .collect()
}

/// gpupin's precreate file in CRI-O's default hooks dir: CRI-O refuses a dir with a hook
/// for a stage it does not know, and with it every hook there.
fn crio_refuses_precreate(setup: &Setup) -> Option<Finding> {
    setup.find_program(Path::new("crio"))?;
    let dir = setup
        .root
        .join(containers_conf::PODMAN_DEFAULT.trim_start_matches('/'));
    let path = dir.join(podman::file_name("precreate"));
    matches!(read_file(&path, "precreate"), Found::Ours(_)).then(|| {
        Finding::warn(
            CHECK,
            format!(
                "hooks: {} is gpupin's precreate hook in CRI-O's hooks dir: CRI-O refuses a dir with a stage it does not know",
                path.display()
            ),
        )
        .fix(format!(
            "{}, then remove it (podman reads {} through the drop-in)",
            setup.gpupin("install podman"),
            containers_conf::ADMIN_HOOKS_DIR
        ))
    })
}

fn check_dir(setup: &Setup, files: &[(&str, PathBuf, Found)]) -> Vec<Finding> {
    let install = match setup.hooks_dirs.as_slice() {
        [dir] if setup.hooks_source == HooksSource::Given => install_command(setup, dir),
        _ => setup.gpupin("install podman"),
    };
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
    for dir in &setup.hooks_dirs {
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
        let mut dirs: Vec<String> = Vec::new();
        for (_, path, _) in files {
            let dir = path.parent().unwrap_or(path).display().to_string();
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        findings.push(Finding::ok(
            CHECK,
            format!(
                "hooks: {}: precreate, prestart and poststop run {} for {trigger}",
                dirs.join(" and "),
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

    /// A host under `root` with gpupin's files in `dirs` (relative) and its hook binary.
    fn host_with_hooks(root: &Path, dirs: &[&str]) -> Setup {
        let bin = root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("gpupin-hook");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(bin.join("gpupin"), "").unwrap();
        let hook = crate::admission::edits::HookCommand {
            exe: exe.clone(),
            config: None,
        };
        for dir in dirs {
            let files = podman::hook_files(&hook, podman::Trigger::Annotation);
            podman::install(&root.join(dir), &files, false).unwrap();
        }
        let (hooks_dirs, hooks_source) = super::super::podman_hooks_dirs(root);
        Setup {
            hooks_dirs,
            hooks_source,
            root: root.to_path_buf(),
            path: bin.as_os_str().to_owned(),
            ..Setup::host(crate::input::config::Config::default(), bin.join("gpupin"))
        }
    }

    fn lines(findings: &[Finding]) -> Vec<String> {
        findings
            .iter()
            .map(|f| format!("{:?} {}", f.status, f.what))
            .collect()
    }

    /// Podman 4.3 reads /etc/containers/oci/hooks.d only where containers.conf names it:
    /// gpupin's files there without the drop-in never run, and doctor says so.
    #[test]
    fn hooks_podman_does_not_read_are_a_problem_until_the_drop_in_names_their_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let setup = host_with_hooks(tmp.path(), &["etc/containers/oci/hooks.d"]);
        let found = lines(&check(&setup));
        let etc = tmp.path().join("etc/containers/oci/hooks.d");
        assert!(
            found.iter().any(|l| l.starts_with(&format!(
                "Problem hooks: gpupin's hooks in {} never run: podman reads {}",
                etc.display(),
                tmp.path()
                    .join("usr/share/containers/oci/hooks.d")
                    .display()
            ))),
            "{found:#?}"
        );
        containers_conf::ContainersConf::at(tmp.path())
            .install(false)
            .unwrap();
        let setup = host_with_hooks(tmp.path(), &[]);
        let found = lines(&check(&setup));
        assert!(found.iter().all(|l| l.starts_with("Ok ")), "{found:#?}");
        assert!(
            found.iter().any(|l| l.contains(&format!(
                "hooks: {}: precreate, prestart and poststop run",
                etc.display()
            ))),
            "{found:#?}"
        );
    }

    /// The package's files and an admin's precreate for another config: what podman runs
    /// is the last file of each name, and both dirs are named.
    #[test]
    fn the_admins_file_takes_the_place_of_the_packages_of_the_same_name() {
        let tmp = tempfile::tempdir().unwrap();
        containers_conf::ContainersConf::at(tmp.path())
            .install(false)
            .unwrap();
        let setup = host_with_hooks(tmp.path(), &["usr/share/gpupin/hooks.d"]);
        let found = lines(&check(&setup));
        let package = tmp.path().join("usr/share/gpupin/hooks.d");
        assert!(
            found
                .iter()
                .any(|l| l.starts_with(&format!("Ok hooks: {}: precreate", package.display()))),
            "{found:#?}"
        );
        let etc = tmp.path().join("etc/containers/oci/hooks.d");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::copy(
            package.join("gpupin-precreate.json"),
            etc.join("gpupin-precreate.json"),
        )
        .unwrap();
        let found = lines(&check(&setup));
        assert!(
            found.iter().any(|l| l.starts_with(&format!(
                "Ok hooks: {} and {}: precreate",
                etc.display(),
                package.display()
            ))),
            "{found:#?}"
        );
    }

    /// CRI-O refuses a hooks dir with a precreate hook: gpupin's there is a warning where
    /// crio is installed.
    #[test]
    fn a_precreate_hook_in_crios_dir_is_a_warning_where_crio_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let setup = host_with_hooks(tmp.path(), &["usr/share/containers/oci/hooks.d"]);
        assert!(
            lines(&check(&setup))
                .iter()
                .all(|l| !l.contains("CRI-O refuses"))
        );
        let crio = tmp.path().join("usr/bin/crio");
        std::fs::copy(tmp.path().join("usr/bin/gpupin-hook"), &crio).unwrap();
        let found = lines(&check(&setup));
        assert!(
            found.iter().any(|l| l.starts_with("Warn hooks: ")
                && l.contains("CRI-O refuses a dir with a stage it does not know")),
            "{found:#?}"
        );
    }

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
