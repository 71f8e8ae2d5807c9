//! runc, driven as a user would from a shell, with a private state root.

use super::SandboxError;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// One runc binary with one state root (`runc --root`).
#[derive(Debug, Clone)]
pub struct Runc {
    pub binary: PathBuf,
    pub root: PathBuf,
}

/// The fields of `runc state` the callers need.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ContainerState {
    pub id: String,
    pub pid: i32,
    pub status: String,
    pub bundle: PathBuf,
}

impl Runc {
    pub fn new(binary: &Path, root: &Path) -> Self {
        Runc {
            binary: binary.to_path_buf(),
            root: root.to_path_buf(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root").arg(&self.root).args(args);
        cmd
    }

    /// Runs runc to completion, capturing its output; a non-zero exit is an error.
    fn output(&self, args: &[&str]) -> Result<Output, SandboxError> {
        let out = self
            .command(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| self.spawn_error(source))?;
        if out.status.success() {
            return Ok(out);
        }
        Err(SandboxError::Runc {
            command: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }

    fn spawn_error(&self, source: std::io::Error) -> SandboxError {
        SandboxError::Spawn {
            program: self.binary.clone(),
            source,
        }
    }

    /// `runc run -d`: creates and starts the container in `bundle`, hooks included.
    ///
    /// A detached runc gives its stdio to the container process, so a pipe on stderr
    /// would stay open as long as the container runs; runc's stderr goes to a file in
    /// the bundle instead, read back when runc fails. On failure the container is
    /// deleted, so that nothing of it remains.
    pub fn run_detached(&self, id: &str, bundle: &Path) -> Result<Container, SandboxError> {
        let log = bundle.join(format!("runc-{id}.stderr"));
        let file = std::fs::File::create(&log).map_err(SandboxError::io("creating", &log))?;
        let bundle_arg = bundle.to_string_lossy();
        let args = ["run", "-d", "--bundle", &bundle_arg, id];
        let status = self
            .command(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .status()
            .map_err(|source| self.spawn_error(source))?;
        if status.success() {
            return Ok(Container {
                runc: self.clone(),
                id: id.to_string(),
                deleted: false,
            });
        }
        let _ = self.output(&["delete", "--force", id]);
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        Err(SandboxError::Runc {
            command: args.join(" "),
            status,
            stderr: stderr.trim().to_string(),
        })
    }

    /// `runc state ID`.
    pub fn state(&self, id: &str) -> Result<ContainerState, SandboxError> {
        let out = self.output(&["state", id])?;
        serde_json::from_slice(&out.stdout).map_err(|e| SandboxError::RuncOutput {
            command: format!("state {id}"),
            reason: e.to_string(),
        })
    }

    /// Whether runc knows a container of that id (in any status).
    pub fn exists(&self, id: &str) -> bool {
        self.state(id).is_ok()
    }

    /// `runc exec ID ARGS...`, output captured; the exit status is the caller's to judge.
    pub fn exec(&self, id: &str, args: &[&str]) -> Result<Output, SandboxError> {
        let mut full = vec!["exec", id];
        full.extend_from_slice(args);
        self.command(&full)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| self.spawn_error(source))
    }

    /// `runc kill ID SIGNAL`.
    pub fn kill(&self, id: &str, signal: &str) -> Result<(), SandboxError> {
        self.output(&["kill", id, signal]).map(drop)
    }

    /// `runc delete [--force] ID`; runc runs the poststop hooks here.
    pub fn delete(&self, id: &str, force: bool) -> Result<(), SandboxError> {
        let args: &[&str] = if force {
            &["delete", "--force", id]
        } else {
            &["delete", id]
        };
        self.output(args).map(drop)
    }
}

/// A container started by `Runc::run_detached`. Dropping it kills and deletes it, so a
/// failing test or an interrupted demo leaves no container behind (and runs poststop).
#[derive(Debug)]
pub struct Container {
    runc: Runc,
    id: String,
    /// Set once `stop` deleted it, so that drop does not try again.
    deleted: bool,
}

impl Container {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn runc(&self) -> &Runc {
        &self.runc
    }

    pub fn state(&self) -> Result<ContainerState, SandboxError> {
        self.runc.state(&self.id)
    }

    /// The host pid of the container's init process.
    pub fn pid(&self) -> Result<i32, SandboxError> {
        Ok(self.state()?.pid)
    }

    pub fn exec(&self, args: &[&str]) -> Result<Output, SandboxError> {
        self.runc.exec(&self.id, args)
    }

    /// stdout of a command in the container that must succeed.
    pub fn exec_stdout(&self, args: &[&str]) -> Result<String, SandboxError> {
        let out = self.exec(args)?;
        if !out.status.success() {
            return Err(SandboxError::Runc {
                command: format!("exec {} {}", self.id, args.join(" ")),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Kills the init process with SIGKILL and waits until runc reports it stopped, without
    /// deleting the container: its poststop hooks have not run.
    pub fn kill_without_poststop(&self) -> Result<(), SandboxError> {
        self.runc.kill(&self.id, "KILL")?;
        for _ in 0..100 {
            if self.state()?.status == "stopped" {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Err(SandboxError::RuncOutput {
            command: format!("state {}", self.id),
            reason: "still not stopped 5 s after SIGKILL".into(),
        })
    }

    /// Stops the container the way a user does: SIGKILL, then `runc delete` (poststop runs).
    pub fn stop(mut self) -> Result<(), SandboxError> {
        self.deleted = true;
        self.kill_and_delete()
    }

    fn kill_and_delete(&self) -> Result<(), SandboxError> {
        // Killing a container that already stopped is an error to runc; delete decides.
        let _ = self.runc.kill(&self.id, "KILL");
        self.runc.delete(&self.id, true)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = self.kill_and_delete();
        }
    }
}

/// gpupin's own message out of runc's report of a failed hook: runc quotes the hook's
/// stderr inside its log line (`... stderr: gpupin: not enough GPUs ...\\n"`), escaped.
pub fn hook_message(runc_stderr: &str) -> Option<String> {
    let start = runc_stderr.find("gpupin: ")?;
    let rest = &runc_stderr[start..];
    let end = rest
        .find("\\n")
        .or_else(|| rest.find('\n'))
        .unwrap_or(rest.len());
    Some(rest[..end].trim_end_matches('"').replace("\\\"", "\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_message_is_cut_out_of_runcs_log_line() {
        let log = r#"time="x" level=error msg="runc run failed: error running hook #0: error running hook: exit status 1, stdout: , stderr: gpupin: invalid gpupin.count=\"0\": expected a positive integer\n""#;
        assert_eq!(
            hook_message(log).unwrap(),
            r#"gpupin: invalid gpupin.count="0": expected a positive integer"#
        );
        assert_eq!(hook_message("runc: no such file"), None);
    }
}
