//! Which generation of container engines the end-to-end suites run on.
//!
//! Unset (or `GPUPIN_ENGINES=debian`): the engines on PATH, Debian 12's packages (runc
//! 1.1, containerd 1.6, docker.io 20.10, docker-compose 1.29). `GPUPIN_ENGINES=modern`:
//! the ones tests/peers/build builds into the peers' cache (runc 1.5, containerd 2.x with
//! ctr and containerd-shim-runc-v2, dockerd 29 with docker-proxy, compose v5), found
//! before anything on PATH, by the tests and by what the engines start (dockerd's
//! containerd, the shims, runc under gpupin-runtime): `command` hands every child the
//! same PATH. A modern engine that was not built is then missing (the test skips, or
//! fails under CI=true); it never falls back to Debian's. The docker CLI stays the
//! machine's (see docs/internals.md: docker/cli v29 does not build from the module proxy).
//!
//! Outside the `harness` feature too, since `find_on_path` asks it; the harness
//! re-exports it as `harness::engines` and says the generation (`harness::announce_engines`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The switch: `modern`, or `debian` (the default).
pub const ENGINES_ENV: &str = "GPUPIN_ENGINES";

/// The engines' generation a run is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// The machine's own engines, found on PATH.
    Debian,
    /// The peers' cache's, found before PATH.
    Modern,
}

/// Each modern peer (its folder in the peers' cache) and the binaries it provides.
const MODERN: [(&str, &[&str]); 5] = [
    ("runc", &["runc"]),
    ("containerd", &["containerd", "ctr"]),
    ("containerd-shim", &["containerd-shim-runc-v2"]),
    ("moby", &["dockerd", "docker-proxy"]),
    ("compose", &["docker-compose"]),
];

/// The generation `GPUPIN_ENGINES` asks for; a value other than the two panics with one
/// line naming it, as a typo must not run the Debian suites under the modern name.
pub fn generation() -> Generation {
    asked().unwrap_or_else(|e| panic!("{e}"))
}

fn asked() -> Result<Generation, String> {
    parse(std::env::var(ENGINES_ENV).ok().as_deref())
}

fn parse(value: Option<&str>) -> Result<Generation, String> {
    match value {
        None | Some("") | Some("debian") => Ok(Generation::Debian),
        Some("modern") => Ok(Generation::Modern),
        Some(other) => Err(format!(
            "{ENGINES_ENV}={other:?} is not an engine generation: use `modern` or `debian` (or leave it unset)"
        )),
    }
}

/// The modern peer folder that provides `name`, when `name` is a modern engine's binary.
fn modern_peer(name: &str) -> Option<&'static str> {
    MODERN
        .iter()
        .find(|(_, bins)| bins.contains(&name))
        .map(|(peer, _)| *peer)
}

/// The peers' cache, by the rule of `harness::toolkit::peers_cache` (that module is the
/// test harness's; this one also serves `find_on_path` outside it).
fn peers_cache() -> Option<PathBuf> {
    match std::env::var_os("GPUPIN_PEERS_CACHE").filter(|c| !c.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => Some(PathBuf::from(std::env::var_os("HOME")?).join(".cache/gpupin-peers")),
    }
}

/// Where the modern build of `name` is (whether it was built or not), under `modern`.
fn modern_binary(name: &str) -> Option<PathBuf> {
    let peer = modern_peer(name)?;
    let cache = peers_cache()?;
    Some(cache.join(peer).join(name))
}

/// Under `modern`, `Ok(Some(path))` for a modern engine's binary, `Err` when it was
/// not built; `Ok(None)` for other programs and under `debian` (look on PATH).
pub fn modern(name: &str) -> Result<Option<PathBuf>, String> {
    if asked()? == Generation::Debian || modern_peer(name).is_none() {
        return Ok(None);
    }
    let path = modern_binary(name).ok_or("the peers' cache has no home: set GPUPIN_PEERS_CACHE")?;
    if path.is_file() {
        Ok(Some(path))
    } else {
        Err(format!(
            "{ENGINES_ENV}=modern: no {} (run tests/peers/build, which needs Go)",
            path.display()
        ))
    }
}

/// `Err` naming the first of `names` that the generation asked for lacks (only modern
/// engines can be checked here; PATH lookups are the suites' own).
pub fn check(names: &[&str]) -> Result<(), String> {
    for name in names {
        modern(name)?;
    }
    Ok(())
}

/// PATH for the engines and everything they start: under `modern`, each modern peer's
/// folder first; else the process's PATH.
pub fn path() -> OsString {
    let inherited = std::env::var_os("PATH").unwrap_or_default();
    if generation() == Generation::Debian {
        return inherited;
    }
    let Some(cache) = peers_cache() else {
        return inherited;
    };
    let dirs = MODERN
        .iter()
        .map(|(peer, _)| cache.join(peer))
        .chain(std::env::split_paths(&inherited));
    std::env::join_paths(dirs).unwrap_or(inherited)
}

/// `name` (an engine or its CLI) as the generation finds it, with `path()` as its PATH.
/// Under `modern` a modern engine that was not built runs by its bare name and fails to
/// start; the suites' requirement checks (`check`) said why before.
pub fn command(name: &str) -> Command {
    let program = crate::find_on_path(name).unwrap_or_else(|| PathBuf::from(name));
    let mut cmd = Command::new(program);
    cmd.env("PATH", path());
    cmd
}

/// What this run's engines are, for the suites' start lines: the generation and the
/// first line of each engine's version output, e.g. `modern engines: runc version
/// 1.5.3; containerd ... v2.4.2 ...`.
pub fn describe() -> &'static str {
    static DESCRIBED: OnceLock<String> = OnceLock::new();
    DESCRIBED.get_or_init(|| {
        let generation = match generation() {
            Generation::Debian => "Debian's engines (PATH)",
            Generation::Modern => "modern engines (peers' cache)",
        };
        let versions: Vec<String> = [
            ("runc", &["--version"][..]),
            ("containerd", &["--version"]),
            ("dockerd", &["--version"]),
            ("docker", &["--version"]),
            ("docker-compose", &["version"]),
        ]
        .iter()
        .map(|(name, args)| {
            let Some(found) = crate::find_on_path(name) else {
                return format!("{name}: none");
            };
            let out = Command::new(&found).args(*args).output();
            let text = out
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let first = text.lines().next().unwrap_or("").trim().to_string();
            format!("{name}: {first}")
        })
        .collect();
        format!("{generation}: {}", versions.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_takes_two_names_and_refuses_others_in_one_line() {
        assert_eq!(parse(None), Ok(Generation::Debian));
        assert_eq!(parse(Some("")), Ok(Generation::Debian));
        assert_eq!(parse(Some("debian")), Ok(Generation::Debian));
        assert_eq!(parse(Some("modern")), Ok(Generation::Modern));
        let err = parse(Some("Modern")).unwrap_err();
        assert!(
            err.contains("GPUPIN_ENGINES=\"Modern\"") && !err.contains('\n'),
            "{err}"
        );
    }

    #[test]
    fn each_modern_engine_binary_has_its_peer_and_other_programs_none() {
        assert_eq!(modern_peer("runc"), Some("runc"));
        assert_eq!(modern_peer("ctr"), Some("containerd"));
        assert_eq!(
            modern_peer("containerd-shim-runc-v2"),
            Some("containerd-shim")
        );
        assert_eq!(modern_peer("dockerd"), Some("moby"));
        assert_eq!(modern_peer("docker-compose"), Some("compose"));
        // The CLI is the machine's: docker/cli v29 does not build from the proxy.
        assert_eq!(modern_peer("docker"), None);
        assert_eq!(modern_peer("busybox"), None);
    }
}
