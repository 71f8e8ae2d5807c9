//! Docker: the `gpupin` runtime in daemon.json (`install::docker` writes it), the
//! gpupin-runtime it runs, the config and the real runtime it hands containers to.

use super::{DEFAULT_DAEMON_JSON, Finding, Setup, not_runnable};
use crate::base::binaries;
use crate::base::message::one_line;
use crate::base::safe_open::{self, Links};
use crate::engines::install::docker::{self as daemon, RUNTIME_NAME};
use crate::engines::runtime::argv::{CONFIG_FLAG, RUNTIME_FLAG};
use crate::input::config::DEFAULT_CONFIG_PATH;
use serde_json::Value;
use std::path::{Path, PathBuf};

const CHECK: &str = "docker";

pub(super) fn check(setup: &Setup) -> Vec<Finding> {
    let path = &setup.daemon_json;
    let install = install_command(setup);
    // A link is followed (admins manage /etc with them); a FIFO is refused, not waited on.
    let text = match safe_open::read_to_string(path, Links::Follow) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return vec![match setup.find_program(Path::new("dockerd")) {
                Some(_) => Finding::warn(
                    CHECK,
                    format!(
                        "docker: no {}: Docker has no \"{RUNTIME_NAME}\" runtime",
                        path.display()
                    ),
                )
                .fix(install),
                None => Finding::ok(
                    CHECK,
                    format!(
                        "docker: no {} and no dockerd on PATH: nothing to check",
                        path.display()
                    ),
                ),
            }];
        }
        Err(err) => {
            return vec![Finding::problem(
                CHECK,
                format!("docker: reading {}: {err}", path.display()),
            )];
        }
    };
    let doc = match daemon::parse(&text) {
        Ok(doc) => doc,
        Err(err) => {
            return vec![
                Finding::problem(
                    CHECK,
                    format!(
                        "docker: {}: {}: dockerd does not start with it",
                        path.display(),
                        one_line(&err)
                    ),
                )
                .fix(format!("correct {}", path.display())),
            ];
        }
    };
    let Some(entry) = doc.get("runtimes").and_then(|r| r.get(RUNTIME_NAME)) else {
        return vec![
            Finding::problem(
                CHECK,
                format!(
                    "docker: {} has no \"{RUNTIME_NAME}\" runtime",
                    path.display()
                ),
            )
            .fix(install),
        ];
    };
    entry_findings(setup, &doc, entry)
}

/// `gpupin [--config C] install docker [--daemon-json F]`.
fn install_command(setup: &Setup) -> String {
    let mut args = "install docker".to_string();
    if setup.daemon_json != Path::new(DEFAULT_DAEMON_JSON) {
        args.push_str(&format!(" --daemon-json {}", setup.daemon_json.display()));
    }
    setup.gpupin(&args)
}

fn entry_findings(setup: &Setup, doc: &Value, entry: &Value) -> Vec<Finding> {
    let file = setup.daemon_json.display();
    let install = install_command(setup);
    let Some(runtime) = entry.get("path").and_then(Value::as_str).map(PathBuf::from) else {
        return vec![
            Finding::problem(
                CHECK,
                format!("docker: the \"{RUNTIME_NAME}\" runtime in {file} has no path"),
            )
            .fix(install),
        ];
    };
    let mut findings = Vec::new();
    if let Some(why) = not_runnable(setup, &runtime) {
        findings.push(
            Finding::problem(
                CHECK,
                format!(
                    "docker: the \"{RUNTIME_NAME}\" runtime in {file} runs {}, {why}",
                    runtime.display()
                ),
            )
            .fix(install.clone()),
        );
    } else if !same_file(&runtime, &setup.sibling(binaries::RUNTIME)) {
        findings.push(
            Finding::warn(
                CHECK,
                format!(
                    "docker: the \"{RUNTIME_NAME}\" runtime runs {}, not the {} beside this gpupin ({})",
                    runtime.display(),
                    binaries::RUNTIME,
                    setup.sibling(binaries::RUNTIME).display()
                ),
            )
            .fix(install.clone()),
        );
    }
    let args: Vec<&str> = entry
        .get("runtimeArgs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let config = flag_value(&args, CONFIG_FLAG).map(PathBuf::from);
    findings.extend(config_finding(
        setup,
        config.as_deref(),
        CHECK,
        "gpupin-runtime",
        &install,
    ));
    let hand_over = flag_value(&args, RUNTIME_FLAG).map(PathBuf::from);
    let real = hand_over
        .clone()
        .unwrap_or_else(|| setup.config.runtime.clone());
    let found_real = setup.find_program(&real);
    if let Some(why) = not_runnable(setup, &real) {
        let named_by = match hand_over {
            Some(_) => format!("{RUNTIME_FLAG} in {file}"),
            None => "runtime in the config".to_string(),
        };
        findings.push(
            Finding::problem(
                CHECK,
                format!(
                    "docker: gpupin-runtime hands containers over to {} ({named_by}), {why}",
                    real.display()
                ),
            )
            .fix(format!("install it, or {install} again")),
        );
    }
    if findings.iter().all(|f| f.status == super::Status::Ok) {
        let is_default = daemon::default_runtime(doc) == Some(RUNTIME_NAME);
        let default = match is_default {
            true => ", the default runtime",
            false => "",
        };
        findings.push(Finding::ok(
            CHECK,
            format!(
                "docker: {file}: runtime \"{RUNTIME_NAME}\" runs {} with config {}, handing over to {}{default}",
                runtime.display(),
                config.as_deref().unwrap_or(Path::new(DEFAULT_CONFIG_PATH)).display(),
                found_real.unwrap_or(real).display()
            ),
        ));
        // gpupin cannot see a container started without its runtime: a gpupin label on
        // it asks for a GPU that never comes, without a word.
        if !is_default {
            findings.push(
                Finding::warn(
                    CHECK,
                    format!(
                        "docker: \"{RUNTIME_NAME}\" is not Docker's default runtime: a container started without --runtime {RUNTIME_NAME} (docker run -l gpupin.count=1 ...) gets no GPU, and gpupin never sees it to say so"
                    ),
                )
                .fix(setup.gpupin("install docker --default")),
            );
        }
    }
    findings
}

/// `--flag VALUE` or `--flag=VALUE` in `args`.
pub(super) fn flag_value<'a>(args: &[&'a str], flag: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, arg)| {
        if *arg == flag {
            return args.get(i + 1).copied();
        }
        arg.strip_prefix(flag)?.strip_prefix('=')
    })
}

/// What an engine hands gpupin as its config (`given`; `None`: the default discovery)
/// against the config doctor judged: a missing file breaks every start, another file
/// makes these findings about the wrong config.
pub(super) fn config_finding(
    setup: &Setup,
    given: Option<&Path>,
    check: &'static str,
    who: &str,
    install: &str,
) -> Option<Finding> {
    let doctor_read = setup.config_file();
    match given {
        Some(config) if !config.exists() => Some(
            Finding::problem(
                check,
                format!("{check}: {who} is given config {}, which does not exist", config.display()),
            )
            .fix(install.to_string()),
        ),
        Some(config) if !same_file(config, &doctor_read) => Some(
            Finding::warn(
                check,
                format!(
                    "{check}: {who} reads config {}, doctor read {}: these findings are about the latter",
                    config.display(),
                    doctor_read.display()
                ),
            )
            .fix(format!("{} --config {} doctor", binaries::CLI, config.display())),
        ),
        None if doctor_read != Path::new(DEFAULT_CONFIG_PATH) => Some(
            Finding::warn(
                check,
                format!(
                    "{check}: {who} reads the default config ({DEFAULT_CONFIG_PATH}), doctor read {}",
                    doctor_read.display()
                ),
            )
            .fix(install.to_string()),
        ),
        _ => None,
    }
}

/// Whether two paths name the same file (links and `..` resolved).
pub(super) fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_flag_either_way_it_is_written() {
        let args = [
            "--gpupin-config",
            "/etc/g.toml",
            "--gpupin-runtime=/usr/bin/nvidia-container-runtime",
        ];
        assert_eq!(flag_value(&args, CONFIG_FLAG), Some("/etc/g.toml"));
        assert_eq!(
            flag_value(&args, RUNTIME_FLAG),
            Some("/usr/bin/nvidia-container-runtime")
        );
        assert_eq!(flag_value(&["--gpupin-config"], CONFIG_FLAG), None);
        assert_eq!(flag_value(&[], CONFIG_FLAG), None);
    }
}
