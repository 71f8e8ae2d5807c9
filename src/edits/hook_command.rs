//! How a runtime calls gpupin back as an OCI hook.

use crate::binaries;
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

    /// `gpupin-hook [--config FILE] STAGE`, argv[0] included.
    pub fn args(&self, stage: &str) -> Vec<String> {
        let mut args = vec![binaries::HOOK.to_string()];
        if let Some(config) = &self.config {
            args.push("--config".into());
            args.push(config.display().to_string());
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
