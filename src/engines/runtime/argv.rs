//! runc's command line, read just far enough to know the command, the bundle and the
//! container id; everything is passed on to the real runtime unchanged.

use crate::input::config::CONFIG_ENV;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// runc global options that take a value (`runc --help`): the command word is the first
/// argument that is neither one of these nor their value.
const GLOBAL_WITH_VALUE: &[&str] = &["--root", "--log", "--log-format", "--criu", "--rootless"];
/// Options that only gpupin-runtime understands, usable from daemon.json `runtimeArgs`
/// (dockerd puts those before containerd's arguments): the config to read, and the real
/// runtime to hand over to, which wins over the config's `runtime` (`gpupin install
/// docker` writes it when it finds NVIDIA's runtime in daemon.json).
pub(crate) const CONFIG_FLAG: &str = "--gpupin-config";
pub(crate) const RUNTIME_FLAG: &str = "--gpupin-runtime";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `create` or `run`: the spec may be edited before the real runtime reads it.
    Create {
        bundle: PathBuf,
        id: String,
    },
    Delete {
        id: String,
    },
    /// Everything else goes through untouched.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub gpupin_config: Option<PathBuf>,
    /// `--gpupin-runtime`: the real runtime, a path or a name on PATH.
    pub gpupin_runtime: Option<PathBuf>,
    /// The arguments for the real runtime: the original ones minus gpupin's own.
    pub runtime_args: Vec<OsString>,
    /// runc's `--log FILE`, where containerd looks for the reason a create failed.
    pub log_file: Option<PathBuf>,
    /// runc's `--root DIR`: containerd's runc shim gives its own (`engine`).
    pub runc_root: Option<PathBuf>,
    pub action: Action,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgvError {
    #[error("{0} needs a value")]
    FlagWithoutValue(&'static str),
    #[error(
        "{named_by} {path:?} is a relative path: gpupin-runtime runs in the container's bundle directory, and so would the hooks it adds; give an absolute path"
    )]
    RelativePath {
        named_by: &'static str,
        path: PathBuf,
    },
}

/// The config gpupin-runtime is to read: `--gpupin-config`, else `$GPUPIN_CONFIG` (as
/// `env` holds it), else `None` for the default. A relative path is refused rather than
/// resolved: dockerd and containerd start the runtime in the bundle, so it would name a
/// file in the container's bundle (or in its rootfs), never the one the admin meant.
pub fn config_path(
    flag: Option<&Path>,
    env: Option<OsString>,
) -> Result<Option<PathBuf>, ArgvError> {
    let (named_by, path) = match (flag, env.filter(|v| !v.is_empty())) {
        (Some(flag), _) => (CONFIG_FLAG, flag.to_path_buf()),
        (None, Some(env)) => (CONFIG_ENV, PathBuf::from(env)),
        (None, None) => return Ok(None),
    };
    if path.is_relative() {
        return Err(ArgvError::RelativePath { named_by, path });
    }
    Ok(Some(path))
}

/// The real runtime `--gpupin-runtime` names: a bare name (searched on PATH) or an
/// absolute path; a relative path is refused, as for the config.
pub fn runtime_override(flag: Option<&Path>) -> Result<Option<PathBuf>, ArgvError> {
    match flag {
        Some(path) if path.is_relative() && path.components().count() > 1 => {
            Err(ArgvError::RelativePath {
                named_by: RUNTIME_FLAG,
                path: path.to_path_buf(),
            })
        }
        other => Ok(other.map(Path::to_path_buf)),
    }
}

/// Parses `args` (without `argv[0]`). `cwd` is the default bundle, as for runc.
pub fn parse(args: Vec<OsString>, cwd: PathBuf) -> Result<Invocation, ArgvError> {
    let (own, runtime_args) = take_own_flags(args)?;
    let strs: Vec<String> = runtime_args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let log_file = option_value(&strs, &["--log"]).map(PathBuf::from);
    let runc_root = option_value(&strs, &["--root"]).map(PathBuf::from);
    let action = match command_position(&strs) {
        Some(at) => action_for(&strs[at], &strs[at + 1..], cwd),
        None => Action::Other,
    };
    // Only GPUPIN_LOG can have turned logging on this early: the config is read next.
    tracing::debug!(action = ?action, "runtime command");
    Ok(Invocation {
        gpupin_config: own.config,
        gpupin_runtime: own.runtime,
        runtime_args,
        log_file,
        runc_root,
        action,
    })
}

/// gpupin-runtime's own leading options.
#[derive(Default)]
struct OwnFlags {
    config: Option<PathBuf>,
    runtime: Option<PathBuf>,
}

/// Removes gpupin's options (`--gpupin-config FILE`, `--gpupin-runtime PATH`, or with
/// `=`) from the front of `args`, where daemon.json's `runtimeArgs` put them.
fn take_own_flags(args: Vec<OsString>) -> Result<(OwnFlags, Vec<OsString>), ArgvError> {
    let mut own = OwnFlags::default();
    let mut rest = args.into_iter().peekable();
    while let Some(first) = rest.peek().map(|a| a.to_string_lossy().into_owned()) {
        let (flag, inline) = match first.split_once('=') {
            Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
            None => (first.clone(), None),
        };
        let (name, slot) = match flag.as_str() {
            CONFIG_FLAG => (CONFIG_FLAG, &mut own.config),
            RUNTIME_FLAG => (RUNTIME_FLAG, &mut own.runtime),
            _ => break,
        };
        rest.next();
        let value = match inline {
            Some(value) => PathBuf::from(value),
            None => PathBuf::from(rest.next().ok_or(ArgvError::FlagWithoutValue(name))?),
        };
        *slot = Some(value);
    }
    Ok((own, rest.collect()))
}

fn command_position(args: &[String]) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if !a.starts_with('-') {
            return Some(i);
        }
        let takes_value = GLOBAL_WITH_VALUE.contains(&a.as_str());
        i += if takes_value { 2 } else { 1 };
    }
    None
}

fn action_for(command: &str, rest: &[String], cwd: PathBuf) -> Action {
    // runc puts the container id last for create, run and delete.
    let id = match rest.last() {
        Some(id) if !id.starts_with('-') => id.clone(),
        _ => return Action::Other,
    };
    match command {
        "create" | "run" => {
            let bundle = option_value(rest, &["--bundle", "-b"])
                .map(PathBuf::from)
                .unwrap_or(cwd);
            Action::Create { bundle, id }
        }
        "delete" => Action::Delete { id },
        _ => Action::Other,
    }
}

/// The value of the first of `names`, given as `--name value`, `--name=value`, or with
/// Go's flag package, `-name value`.
fn option_value(args: &[String], names: &[&str]) -> Option<String> {
    for (i, a) in args.iter().enumerate() {
        for name in names {
            let single_dash = name.strip_prefix('-').filter(|n| n.starts_with('-'));
            let forms = [Some(*name), single_dash];
            for form in forms.into_iter().flatten() {
                if a == form {
                    return args.get(i + 1).cloned();
                }
                if let Some(v) = a.strip_prefix(form).and_then(|r| r.strip_prefix('=')) {
                    return Some(v.to_string());
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Invocation {
        parse(
            args.iter().map(OsString::from).collect(),
            PathBuf::from("/cwd"),
        )
        .unwrap()
    }

    #[test]
    fn containerd_create_is_recognised() {
        let inv = parse_str(&[
            "--root",
            "/run/docker/runtime-runc/moby",
            "--log",
            "/run/c/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/run/c/abc",
            "--pid-file",
            "/run/c/init.pid",
            "abc",
        ]);
        assert_eq!(
            inv.action,
            Action::Create {
                bundle: "/run/c/abc".into(),
                id: "abc".into()
            }
        );
        assert_eq!(inv.log_file, Some(PathBuf::from("/run/c/log.json")));
        assert_eq!(
            inv.runc_root,
            Some(PathBuf::from("/run/docker/runtime-runc/moby"))
        );
        assert_eq!(inv.runtime_args.len(), 13);
    }

    #[test]
    fn bundle_defaults_to_cwd_and_takes_every_form() {
        assert_eq!(
            parse_str(&["run", "x"]).action,
            Action::Create {
                bundle: "/cwd".into(),
                id: "x".into()
            }
        );
        for form in [&["-b", "/b"][..], &["--bundle=/b"], &["-bundle", "/b"]] {
            let mut args = vec!["create"];
            args.extend_from_slice(form);
            args.push("x");
            assert_eq!(
                parse_str(&args).action,
                Action::Create {
                    bundle: "/b".into(),
                    id: "x".into()
                }
            );
        }
    }

    #[test]
    fn delete_and_other_commands() {
        assert_eq!(
            parse_str(&["--root", "/r", "delete", "--force", "x"]).action,
            Action::Delete { id: "x".into() }
        );
        assert_eq!(parse_str(&["start", "x"]).action, Action::Other);
        assert_eq!(parse_str(&["--version"]).action, Action::Other);
        assert_eq!(parse_str(&[]).action, Action::Other);
    }

    #[test]
    fn gpupin_config_is_taken_out() {
        let inv = parse_str(&["--gpupin-config", "/etc/g.toml", "state", "x"]);
        assert_eq!(inv.gpupin_config, Some(PathBuf::from("/etc/g.toml")));
        assert_eq!(
            inv.runtime_args,
            vec![OsString::from("state"), OsString::from("x")]
        );
        let inv = parse_str(&["--gpupin-config=/g.toml", "state", "x"]);
        assert_eq!(inv.gpupin_config, Some(PathBuf::from("/g.toml")));
        let err = parse(vec![OsString::from("--gpupin-config")], "/".into()).unwrap_err();
        assert_eq!(err, ArgvError::FlagWithoutValue(CONFIG_FLAG));
    }

    #[test]
    fn gpupin_runtime_is_taken_out_beside_the_config_in_either_order() {
        let inv = parse_str(&[
            "--gpupin-runtime",
            "nvidia-container-runtime",
            "--gpupin-config=/g.toml",
            "--root",
            "/r",
            "delete",
            "x",
        ]);
        assert_eq!(inv.gpupin_config, Some(PathBuf::from("/g.toml")));
        assert_eq!(
            inv.gpupin_runtime,
            Some(PathBuf::from("nvidia-container-runtime"))
        );
        assert_eq!(inv.runtime_args, ["--root", "/r", "delete", "x"]);
        assert_eq!(inv.action, Action::Delete { id: "x".into() });
        let err = parse(vec![OsString::from("--gpupin-runtime")], "/".into()).unwrap_err();
        assert_eq!(err.to_string(), "--gpupin-runtime needs a value");
        // A bare name is looked up on PATH, an absolute path taken as it is; a relative
        // path would name a file in the container's bundle.
        let bare = Path::new("nvidia-container-runtime");
        assert_eq!(runtime_override(Some(bare)), Ok(Some(bare.to_path_buf())));
        let err = runtime_override(Some(Path::new("bin/runc"))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--gpupin-runtime \"bin/runc\" is a relative path")
        );
    }

    #[test]
    fn a_relative_config_is_refused_from_flag_and_env() {
        let err = config_path(Some(Path::new("cfg.toml")), None).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("--gpupin-config \"cfg.toml\" is a relative path"),
            "{text}"
        );
        let err = config_path(None, Some("./cfg.toml".into())).unwrap_err();
        assert!(
            err.to_string().starts_with("GPUPIN_CONFIG \"./cfg.toml\""),
            "{err}"
        );
        // The flag wins over the env, as in Config::discover.
        let abs = config_path(Some(Path::new("/etc/g.toml")), Some("rel.toml".into()));
        assert_eq!(abs, Ok(Some(PathBuf::from("/etc/g.toml"))));
        assert_eq!(config_path(None, Some("".into())), Ok(None));
        assert_eq!(config_path(None, None), Ok(None));
    }
}
