//! The state dir (the ledger): its owner and modes by the rules gpupin enforces on every
//! open (`ledger::store`), and what it holds (`Ledger::survey`): stale holders, entries
//! that block every allocation, leftovers and temp files `gpupin gc` would clear.

use super::{Finding, Setup};
use crate::base::message::one_line;
use crate::input::config::LedgerSettings;
use crate::state::ledger::{IndexState, Ledger, LedgerError, Survey, release_arg};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

const DIR_CHECK: &str = "state_dir";
const LEDGER_CHECK: &str = "ledger";
/// The lock: only the ledger's writer may take it (`ledger::store`).
const LOCK_MODE: u32 = 0o600;
/// Files gpupin keeps directly in the state dir beside the lock.
const FILES: [&str; 8] = [
    "cursor",
    "holders.index",
    "queue-seq",
    "queue-round",
    "idle.json",
    "inventory.json",
    "live-cache.json",
    "metrics-cursor.json",
];

pub(super) fn check(setup: &Setup) -> Vec<Finding> {
    let dir = &setup.config.state_dir;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return vec![Finding::ok(
                DIR_CHECK,
                format!(
                    "state dir {}: not made yet; gpupin makes it (0755) at the first allocation",
                    dir.display()
                ),
            )];
        }
        Err(err) => {
            return vec![Finding::problem(
                DIR_CHECK,
                format!("state dir {}: {err}", dir.display()),
            )];
        }
    };
    if let Some(finding) = unsafe_dir(setup, dir, &meta) {
        return vec![finding];
    }
    let mut findings = vec![Finding::ok(
        DIR_CHECK,
        format!(
            "state dir {}: {}, {:04o}",
            dir.display(),
            owner(meta.uid()),
            meta.mode() & 0o7777
        ),
    )];
    findings.extend(files(dir));
    let settings = LedgerSettings {
        claim_grace: setup.config.claim_grace,
        ..LedgerSettings::at(dir)
    };
    let survey = Ledger::open_read_only(&settings).and_then(|l| l.survey());
    match survey {
        Ok(survey) => findings.extend(ledger(setup, &survey)),
        Err(err) => findings.push(
            Finding::problem(LEDGER_CHECK, format!("ledger: {}", one_line(&err)))
                .fix("make holders/ and queue/ root-owned directories that only root can write"),
        ),
    }
    findings
}

fn owner(uid: u32) -> String {
    match uid {
        0 => "root-owned".to_string(),
        uid => format!("owned by uid {uid} (gpupin's own user)"),
    }
}

/// What `ledger::store::check_safe_dir` refuses, said with its fix.
fn unsafe_dir(setup: &Setup, dir: &Path, meta: &std::fs::Metadata) -> Option<Finding> {
    let problem = |why: String, fix: String| {
        Some(
            Finding::problem(
                DIR_CHECK,
                format!("state dir {}: {why}; gpupin refuses it", dir.display()),
            )
            .fix(fix),
        )
    };
    let config = setup.config_file();
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(dir).map_or("?".into(), |t| t.display().to_string());
        return problem(
            format!("it is a symlink (to {target})"),
            format!(
                "set state_dir in {} to a real directory, or remove the link (gpupin makes the directory)",
                config.display()
            ),
        );
    }
    if !meta.is_dir() {
        return problem(
            "it is not a directory".into(),
            format!(
                "remove it, or set another state_dir in {}",
                config.display()
            ),
        );
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return problem(
            format!("mode {mode:04o} lets group or others write it, and so hand out any GPU"),
            format!("chmod 755 {}", dir.display()),
        );
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return problem(
            format!("owned by uid {}, not root", meta.uid()),
            format!("chown root {}", dir.display()),
        );
    }
    None
}

/// The lock and the other files beside it: links, FIFOs and loose modes.
fn files(dir: &Path) -> Vec<Finding> {
    let mut findings = Vec::new();
    let lock = dir.join("lock");
    if let Ok(meta) = std::fs::symlink_metadata(&lock) {
        let mode = meta.mode() & 0o7777;
        if !meta.file_type().is_file() {
            findings.push(
                Finding::problem(
                    DIR_CHECK,
                    format!(
                        "{}: not a regular file, so every allocation fails to take the lock",
                        lock.display()
                    ),
                )
                .fix(format!("rm {} (gpupin makes it again)", lock.display())),
            );
        } else if mode != LOCK_MODE {
            findings.push(
                Finding::problem(
                    DIR_CHECK,
                    format!(
                        "{}: mode {mode:04o}: any user who can open it can take the lock and stall every container start",
                        lock.display()
                    ),
                )
                .fix(format!("chmod 600 {}", lock.display())),
            );
        }
    }
    let secret = dir.join(crate::state::ledger::WITHIN_SECRET_FILE);
    if let Ok(meta) = std::fs::symlink_metadata(&secret)
        && (!meta.file_type().is_file() || meta.mode() & 0o077 != 0 || meta.uid() != 0)
    {
        findings.push(
            Finding::problem(
                DIR_CHECK,
                format!(
                    "{}: not a root-only regular file (mode 600), so every request that presents a holder's key is refused",
                    secret.display()
                ),
            )
            .fix(format!(
                "rm {} (gpupin makes a new one; keys given out so far stop working)",
                secret.display()
            )),
        );
    }
    for name in FILES {
        let path = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.file_type().is_file() {
            findings.push(
                Finding::warn(
                    DIR_CHECK,
                    format!(
                        "{}: not a regular file; gpupin ignores it until it replaces it",
                        path.display()
                    ),
                )
                .fix(format!("rm {}", path.display())),
            );
        } else if meta.mode() & 0o022 != 0 {
            findings.push(
                Finding::warn(
                    DIR_CHECK,
                    format!("{}: others may write it", path.display()),
                )
                .fix(format!("chmod 644 {}", path.display())),
            );
        }
    }
    findings
}

/// What the ledger holds.
fn ledger(setup: &Setup, survey: &Survey) -> Vec<Finding> {
    let gc = setup.gpupin("gc");
    let mut findings = Vec::new();
    for (path, reason) in &survey.stray {
        findings.push(
            Finding::problem(
                LEDGER_CHECK,
                format!(
                    "ledger: stray entry {}: {reason}; every allocation fails until it is gone",
                    path.display()
                ),
            )
            .fix(gc.clone()),
        );
    }
    for err in &survey.corrupt {
        let finding = match err {
            LedgerError::CorruptRecord { path, reason } => Finding::problem(
                LEDGER_CHECK,
                format!(
                    "ledger: corrupt record {}: {reason}; every allocation fails until it is gone",
                    path.display()
                ),
            )
            .fix(format!(
                "inspect it (it may hold GPUs of a live container), then {}",
                setup.gpupin(&format!("release {}", release_arg(path)))
            )),
            other => Finding::problem(LEDGER_CHECK, format!("ledger: {}", one_line(other))),
        };
        findings.push(finding);
    }
    if !survey.stale.is_empty() {
        let ids: Vec<&str> = survey.stale.iter().map(|r| r.id.as_str()).collect();
        findings.push(
            Finding::warn(
                LEDGER_CHECK,
                format!(
                    "ledger: {} holder{} whose process is gone still hold GPUs until reaped: {}",
                    ids.len(),
                    if ids.len() == 1 { "" } else { "s" },
                    ids.join(", ")
                ),
            )
            .fix(gc.clone()),
        );
    }
    if survey.index == IndexState::Disagrees {
        findings.push(
            Finding::problem(
                LEDGER_CHECK,
                "ledger: holders.index does not count what the records hold (a record changed in place, by hand?); allocations are decided on the index until it is written anew".to_string(),
            )
            .fix(gc.clone()),
        );
    }
    let leftovers = survey.leftovers.len() + survey.dead_temps.len() + survey.stale_tickets.len();
    if leftovers > 0 {
        findings.push(
            Finding::warn(
                LEDGER_CHECK,
                format!(
                    "ledger: {} left behind by processes that are gone ({} unreadable record{} from an earlier boot, {} temp file{}, {} queue ticket{})",
                    plural(leftovers, "entry", "entries"),
                    survey.leftovers.len(),
                    s(survey.leftovers.len()),
                    survey.dead_temps.len(),
                    s(survey.dead_temps.len()),
                    survey.stale_tickets.len(),
                    s(survey.stale_tickets.len()),
                ),
            )
            .fix(gc),
        );
    }
    findings.push(Finding::ok(
        LEDGER_CHECK,
        format!(
            "ledger: {} live holder{}, {} waiting in the queue",
            survey.live.len(),
            s(survey.live.len()),
            survey.waiting
        ),
    ));
    findings
}

fn s(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
