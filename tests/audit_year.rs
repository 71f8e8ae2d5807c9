//! The year of audit benches/audit_year.rs times, read back by gpupin: every line the
//! generator writes is an event gpupin's reader takes (none skipped as unreadable), across
//! rotated files and the refusals log. Needs neither root nor runc.

#[path = "../benches/audit_year/generate.rs"]
mod generate;

use gpupin_sandbox::harness::{binary, stderr, stdout};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

#[test]
fn every_generated_line_is_read_back_by_gpupin_log() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Four days in files of 1 MiB: rotated three times, nothing rotated away.
    let year = generate::Year {
        days: 4,
        seed: 7,
        end: now,
        max_bytes: 1 << 20,
        keep: 4,
    };
    let written = generate::write_year(&log_dir, &year).unwrap();
    assert!(written.files.len() >= 4, "rotated: {:?}", written.files);
    assert!(
        written.refusals > 0 && written.events > 7_000,
        "{written:?}"
    );
    let config = dir.path().join("gpupin.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch16\"\naudit_max_size = \"1MiB\"\n",
            dir.path().join("state"),
            log_dir.join("audit.log"),
        ),
    )
    .unwrap();
    let out = Command::new(binary(GPUPIN))
        .env_remove("GPUPIN_CONFIG")
        .arg("--config")
        .arg(&config)
        .args(["log", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("unreadable"),
        "lines skipped: {}",
        stderr(&out)
    );
    let lines = stdout(&out).lines().count() as u64;
    assert_eq!(lines, written.events);
    // The lines come back as written, in time order across the files.
    let mut on_disk = 0u64;
    for file in &written.files {
        on_disk += std::fs::read_to_string(file).unwrap().lines().count() as u64;
    }
    assert_eq!(on_disk + written.refusals, written.events);
}
