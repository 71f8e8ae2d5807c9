//! How a runtime calls gpupin back as an OCI hook.

use crate::base::binaries;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct HookCommand {
    /// Absolute path of the `gpupin-hook` binary.
    pub exe: PathBuf,
    /// The config gpupin was started with; hooks run with an empty environment, so it is
    /// passed on the command line.
    pub config: Option<PathBuf>,
}

impl HookCommand {
    /// The hook binary installed beside `exe` (any of gpupin's binaries).
    pub fn beside(exe: &Path, config: Option<PathBuf>) -> Self {
        HookCommand {
            exe: binaries::beside(exe, binaries::HOOK),
            config,
        }
    }

    /// `gpupin-hook [--config FILE] STAGE`, `argv[0]` included; for an `exe` that is the
    /// CLI (`gpupin`, where no gpupin-hook was built beside it), `gpupin [--config FILE]
    /// hook STAGE`.
    pub fn args(&self, stage: &str) -> Vec<String> {
        let cli = self.exe.file_name().is_some_and(|n| n == binaries::CLI);
        let argv0 = if cli { binaries::CLI } else { binaries::HOOK };
        let mut args = vec![argv0.to_string()];
        if let Some(config) = &self.config {
            args.push("--config".into());
            args.push(config.display().to_string());
        }
        if cli {
            args.push("hook".into());
        }
        args.push(stage.to_string());
        args
    }

    /// A prestart hook that refuses the container with `reason`, whatever its state says.
    pub fn refusal_args(&self, reason: &str) -> Vec<String> {
        let mut args = self.args("prestart");
        args.extend(["--refuse".to_string(), reason.to_string()]);
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_binary_or_the_cli_as_the_exe_says() {
        let hook = HookCommand::beside(Path::new("/usr/bin/gpupin"), Some("/etc/g.toml".into()));
        assert_eq!(hook.exe, Path::new("/usr/bin/gpupin-hook"));
        assert_eq!(
            hook.args("poststop"),
            ["gpupin-hook", "--config", "/etc/g.toml", "poststop"]
        );
        let cli = HookCommand {
            exe: "/usr/bin/gpupin".into(),
            config: None,
        };
        assert_eq!(cli.args("prestart"), ["gpupin", "hook", "prestart"]);
        assert_eq!(
            cli.refusal_args("no GPU"),
            ["gpupin", "hook", "prestart", "--refuse", "no GPU"]
        );
    }
}
