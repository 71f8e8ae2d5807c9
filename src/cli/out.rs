//! Command output. `println!` panics when stdout is closed or full (exit 101 and a panic
//! message); every command prints through `out!`/`outln!` instead, so that a failed write
//! is an error like any other: one `gpupin: writing to stdout: ...` line, or, for a reader
//! that has gone away, a quiet exit.

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

/// A write to stdout that failed.
#[derive(Debug, thiserror::Error)]
#[error("writing to stdout")]
pub struct StdoutError(#[source] pub io::Error);

/// `print!` that returns the write error instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::out::write(format_args!($($arg)*)) };
}

/// `println!` that returns the write error instead of panicking.
macro_rules! outln {
    () => { $crate::cli::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Writes and flushes at once: output interleaves with what child processes print (the
/// demo), and a full disk shows up here rather than in an unchecked flush at exit.
pub fn write(args: fmt::Arguments) -> Result<(), StdoutError> {
    let mut stdout = io::stdout().lock();
    stdout
        .write_fmt(args)
        .and_then(|()| stdout.flush())
        .map_err(StdoutError)
}

/// A note for the person at the terminal (stderr). A failed write is dropped: there is
/// nowhere left to report it, and a note is not worth failing a command for.
pub fn note(args: fmt::Arguments) {
    let _ = writeln!(io::stderr().lock(), "{args}");
}

/// 128 + SIGPIPE: the status a shell shows for a tool that the pipe signal ended. Rust
/// ignores SIGPIPE, so gpupin sees EPIPE instead and exits with the same status, quietly,
/// as `cat`, `ls` and the rest appear to do under `set -o pipefail`.
const BROKEN_PIPE_STATUS: u8 = 128 + 13;

/// The exit status for a reader that went away (`gpupin status | head -0`), if `err`
/// comes from one.
pub fn broken_pipe_exit(err: &anyhow::Error) -> Option<ExitCode> {
    let broken = err.chain().any(|e| {
        e.downcast_ref::<StdoutError>()
            .is_some_and(|StdoutError(io)| io.kind() == io::ErrorKind::BrokenPipe)
    });
    broken.then(|| ExitCode::from(BROKEN_PIPE_STATUS))
}
