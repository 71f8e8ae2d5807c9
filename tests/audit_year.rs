//! The year of audit benches/audit_year.rs times, read back by gpupin: every line the
//! generator writes is an event gpupin's reader takes (none skipped as unreadable), across
//! rotated files and the refusals log. Needs neither root nor runc.

#[path = "../benches/audit_year/generate.rs"]
mod generate;

use gpupin::command::usage::{self, Usage};
use gpupin::command::{By, Config};
use gpupin::parts::audit::{Event, EventKind};
use gpupin_sandbox::harness::{binary, stderr, stdout};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// The year written into `dir` with a config reading it; the config's audit log.
fn trail(dir: &std::path::Path, year: &generate::Year) -> (generate::Written, Config) {
    let log_dir = dir.join("log");
    let written = generate::write_year(&log_dir, year).unwrap();
    let text = format!(
        "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch16\"\naudit_max_size = \"{}KiB\"\naudit_keep = {}\n",
        dir.join("state"),
        log_dir.join("audit.log"),
        year.max_bytes >> 10,
        year.keep,
    );
    let path = dir.join("gpupin.toml");
    std::fs::write(&path, text).unwrap();
    (written, Config::load(&path).unwrap())
}

/// `usage` by a scan of every line of the trail (`entries`, read once), as `gpupin usage`
/// read it before the digests: the reference. With the lines a reader would have parsed
/// and found no event.
fn full_scan(
    config: &Config,
    entries: &[gpupin::command::Entry],
    since: SystemTime,
    now: SystemTime,
    by: By,
) -> (Usage, usize) {
    let ended: Vec<usage::Ended> = entries
        .iter()
        .filter(|entry| usage::counts(entry.at, &entry.event, since))
        .filter_map(|entry| usage::Ended::of(&entry.event))
        .collect();
    let mut prefiltered = config.audit().events_where(usage::could_end_in(since));
    prefiltered.by_ref().for_each(drop);
    (
        usage::usage(&ended, &[], since, now, by),
        prefiltered.unreadable(),
    )
}

/// Every period (from each end of each file, a second either side, and a year) by every
/// key: the trail's answer is the full scan's.
fn same_as_full_scan(config: &Config, now: SystemTime, what: &str) {
    let mut sinces = vec![
        now - Duration::from_secs(365 * 86_400),
        now - Duration::from_secs(86_400),
    ];
    for file in config.audit().files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for line in [text.lines().next(), text.lines().last()]
            .into_iter()
            .flatten()
        {
            // The torn lines added below are no time.
            let Some(at) = serde_json::from_str::<Event>(line)
                .ok()
                .and_then(|e| e.at())
            else {
                continue;
            };
            sinces.extend([at - Duration::from_secs(1), at, at + Duration::from_secs(1)]);
        }
    }
    let entries: Vec<_> = config.audit().events().map(Result::unwrap).collect();
    for (n, since) in sinces.into_iter().enumerate() {
        // The key only names the rows: every key for the year and the day, the finest
        // (holders) at each file's ends.
        let keys = match n {
            0 | 1 => vec![By::User, By::Holder, By::Gpu],
            _ => vec![By::Holder],
        };
        for by in keys {
            let read = usage::usage_of_trail(&config.audit(), &[], since, now, by).unwrap();
            let (expected, unreadable) = full_scan(config, &entries, since, now, by);
            assert_eq!(read.usage, expected, "{what}: since {since:?} by {by:?}");
            assert_eq!(read.unreadable, unreadable, "{what}: since {since:?}");
        }
    }
    // Something was compared: a year of the trail has holders.
    let year = now - Duration::from_secs(365 * 86_400);
    let (expected, _) = full_scan(config, &entries, year, now, By::User);
    assert!(expected.total.holders > 100, "{what}: {expected:?}");
}

fn digests(config: &Config) -> Vec<std::path::PathBuf> {
    let dir = config.audit().digests_dir();
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    all.sort();
    all
}

/// Rotated files of 256 KiB, some rotated away (nested holders whose parents are gone),
/// holdings across every file's edges, a user's log and torn lines beside: `gpupin usage`
/// read through the digests it writes, through digests written before, and raw, gives the
/// full scan's answer each time.
#[test]
fn usage_through_digests_is_the_full_scans_answer() {
    let dir = tempfile::tempdir().unwrap();
    let end = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let now = UNIX_EPOCH + Duration::from_secs(end);
    let year = |seed| generate::Year {
        days: 6,
        seed,
        end,
        max_bytes: 256 << 10,
        keep: 4,
    };
    let (written, config) = trail(dir.path(), &year(34));
    assert_eq!(written.files.len(), 5, "{:?}", written.files);
    // A user's log beside it: another trail, rotated on its own.
    let other = tempfile::tempdir().unwrap();
    let (theirs, _) = trail(other.path(), &year(35));
    let users = config.audit().users_dir();
    std::fs::create_dir_all(&users).unwrap();
    for (n, file) in theirs.files.iter().rev().enumerate() {
        let name = match n {
            0 => "1001.log".to_string(),
            n => format!("1001.log.{n}"),
        };
        std::fs::rename(file, users.join(name)).unwrap();
    }
    // A torn line and one that is no event, in the live file and in a rotated one.
    for file in [&written.files[2], &written.files[4]] {
        let mut f = std::fs::OpenOptions::new().append(true).open(file).unwrap();
        use std::io::Write;
        writeln!(
            f,
            r#"{{"time":"2026-01-01T00:00:00Z","event":"release","hold"#
        )
        .unwrap();
        writeln!(
            f,
            r#"{{"time":"2026-01-01T00:00:00Z","event":"reap","holder":"x","gpus":7}}"#
        )
        .unwrap();
    }

    same_as_full_scan(&config, now, "digests written as read");
    let written_digests = digests(&config);
    // One a rotated file of both logs (the refusals were never rotated; the live files
    // are under 4 MiB: read raw).
    assert_eq!(written_digests.len(), 4 + 4, "{written_digests:?}");
    same_as_full_scan(&config, now, "digests read");
    assert_eq!(digests(&config), written_digests, "written again");

    // A digest whose holdings do not parse: read raw, the same answer.
    let first = &written_digests[0];
    let text = std::fs::read_to_string(first).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let last = lines.len() - 1;
    lines[last] = "[1, \"torn";
    std::fs::write(first, lines.join("\n") + "\n").unwrap();
    same_as_full_scan(&config, now, "a torn digest");

    // No digests at all (their directory cannot be made): raw.
    std::fs::remove_dir_all(config.audit().digests_dir()).unwrap();
    std::fs::write(config.audit().digests_dir(), "").unwrap();
    same_as_full_scan(&config, now, "raw");
}

/// The live file past 4 MiB is digested up to where it was: lines appended after are read
/// raw; once it is rotated, its digest is made whole again.
#[test]
fn usage_reads_a_live_file_through_its_digest_and_raw_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let end = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let now = UNIX_EPOCH + Duration::from_secs(end + 3600);
    let (written, config) = trail(
        dir.path(),
        &generate::Year {
            days: 6,
            seed: 36,
            end,
            max_bytes: 64 << 20,
            keep: 4,
        },
    );
    assert_eq!(written.files.len(), 1);
    assert!(written.bytes > 4 << 20, "{written:?}");
    same_as_full_scan(&config, now, "the live file digested");
    let live_digest = digests(&config);
    assert_eq!(live_digest.len(), 1, "{live_digest:?}");

    // Releases appended since, one of them nested in a holder of the digested part.
    let parent = std::fs::read_to_string(&written.files[0])
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Event>(l).unwrap())
        .find(|e| e.event == EventKind::Hold)
        .unwrap();
    let mut appended = String::new();
    for (n, within) in [None, Some(parent.holder.clone())].into_iter().enumerate() {
        let mut event = Event::new(EventKind::Release, &format!("late-{n}"));
        event.time = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(end + 60))
            .to_string();
        event.held_s = Some(7200);
        event.gpus = parent.gpus.clone();
        event.within = within;
        appended += &(serde_json::to_string(&event).unwrap() + "\n");
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&written.files[0])
        .unwrap();
    use std::io::Write;
    f.write_all(appended.as_bytes()).unwrap();
    drop(f);
    same_as_full_scan(&config, now, "lines past the live file's digest");
    assert_eq!(digests(&config), live_digest);
    let size = |path: &std::path::Path| std::fs::metadata(path).unwrap().len();
    let live = config.audit().path;
    assert_eq!(
        covered(&live_digest[0]) + appended.len() as u64,
        size(&live),
        "not digested again before 4 MiB more"
    );

    // Rotated as the writer rotates it, a new live file begun.
    let rotated = std::path::PathBuf::from(format!("{}.1", live.display()));
    std::fs::rename(&live, &rotated).unwrap();
    std::fs::write(&live, appended).unwrap();
    same_as_full_scan(&config, now, "the live file rotated");
    let rotated_digest = digests(&config);
    assert_eq!(rotated_digest, live_digest, "the same file, the same name");
    assert_eq!(covered(&rotated_digest[0]), size(&rotated), "made whole");
}

/// The bytes of its file a digest covers (its first line's `len`).
fn covered(digest: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(digest).unwrap();
    let head: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    head["len"].as_u64().unwrap()
}
