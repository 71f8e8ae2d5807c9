//! A program run to its end within a deadline, its output read whole: for the NVIDIA
//! tools gpupin calls (`nvidia-smi`), which a wedged GPU can hang for good.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How a run ended without a status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("could not start it: {0}")]
    Start(#[source] std::io::Error),
    #[error("it did not finish within {}s; it was killed", .0.as_secs())]
    Timeout(Duration),
}

/// What a program that ended said.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

impl Ran {
    /// The first line it said of why it failed: stderr's, else stdout's (nvidia-smi says
    /// why on stdout), else `no reason given`.
    pub(crate) fn reason(&self) -> String {
        self.said(1)
    }

    /// As `reason`, its first `lines` non-empty lines joined on one line: nvidia-smi's
    /// first line can be a heading (`The following GPUs could not be reset:`).
    pub(crate) fn said(&self, lines: usize) -> String {
        [&self.stderr, &self.stdout]
            .into_iter()
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .find(|t| !t.trim().is_empty())
            .map(|t| {
                t.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .take(lines)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| "no reason given".into())
    }
}

/// Runs `command` (stdin closed) to its end, killing it after `timeout`.
pub(crate) fn run_within(command: &mut Command, timeout: Duration) -> Result<Ran, RunError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(RunError::Start)?;
    // Read in threads: output larger than the pipe buffer would otherwise stall the child.
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            text
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("piped")));
    let err = reader(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(RunError::Start)? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::Timeout(timeout));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(Ran {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_status_and_the_first_line_of_why() {
        let ran = run_within(
            Command::new("sh").args(["-c", "echo out; echo 'no luck' >&2; echo more >&2; exit 3"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(ran.status.code(), Some(3));
        assert_eq!(ran.stdout, b"out\n");
        assert_eq!(ran.reason(), "no luck");
        assert_eq!(ran.said(2), "no luck more");
        let quiet = run_within(
            Command::new("sh").args(["-c", "exit 1"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(quiet.reason(), "no reason given");
    }

    #[test]
    fn a_program_past_its_deadline_is_killed_and_one_that_cannot_start_says_so() {
        let err =
            run_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it did not finish within 0s; it was killed"
        );
        let err =
            run_within(&mut Command::new("/nonexistent/x"), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().starts_with("could not start it: "), "{err}");
    }
}
