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
    // Buffered: stdout alone writes a line at a time (a year's `usage --by holder` is
    // hundreds of thousands of lines).
    let mut stdout = io::BufWriter::with_capacity(1 << 16, io::stdout().lock());
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

/// 128 + SIGPIPE. A C tool that writes to a pipe whose reader is gone dies of SIGPIPE,
/// silently, and a shell shows 141 (`set -o pipefail` counts it as a failure). Rust
/// ignores SIGPIPE, so gpupin gets EPIPE instead, and ends the same way: no message, 141.
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
