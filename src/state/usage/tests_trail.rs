//! `usage_of_trail` against digests it must not believe: a digest anyone but root (or
//! this user) could have written, one through a link, a FIFO in its place, one of another
//! file, one of the file before it changed, a digests directory that is a link. Each time
//! the answer is the raw lines' answer, never the digest's; a forged digest that is
//! trusted (ours, 0644) shows what believing one would have given.

use super::*;
use crate::input::config::AuditLog;
use crate::state::audit::GpuRef;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NOW: u64 = 1_714_564_800;

fn time(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A release of `holder` at `end` after `held` seconds on GPU 0.
fn release(holder: &str, end: u64, held: u64) -> String {
    let event = Event {
        time: humantime::format_rfc3339_seconds(time(end)).to_string(),
        user: Some("alice".into()),
        gpus: vec![GpuRef {
            index: Some(0),
            uuid: "GPU-0".into(),
        }],
        held_s: Some(held),
        ..Event::new(EventKind::Release, holder)
    };
    serde_json::to_string(&event).unwrap() + "\n"
}

/// A trail of a rotated file and a live one, each with a release.
fn trail(dir: &Path) -> AuditLog {
    let audit = AuditLog::at(dir.join("audit.log"));
    std::fs::write(dir.join("audit.log.1"), release("old", NOW - 100, 50)).unwrap();
    std::fs::write(&audit.path, release("new", NOW - 10, 5)).unwrap();
    audit
}

/// `usage --by holder` over the trail: (holder, seconds) rows.
fn rows(audit: &AuditLog) -> Vec<(String, u64)> {
    let read = usage_of_trail(audit, &[], time(0), time(NOW), By::Holder).unwrap();
    read.usage
        .rows
        .iter()
        .map(|r| (r.key.to_string(), r.gpu_seconds))
        .collect()
}

fn the_raw_answer() -> Vec<(String, u64)> {
    vec![("old".into(), 50), ("new".into(), 5)]
}

/// The one digest written (of the rotated file).
fn the_digest(audit: &AuditLog) -> PathBuf {
    let all: Vec<PathBuf> = std::fs::read_dir(audit.digests_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(all.len(), 1, "{all:?}");
    all.into_iter().next().unwrap()
}

/// The digest with a holding of a million seconds added that the file does not have.
fn forged(digest: &Path) -> String {
    let text = std::fs::read_to_string(digest).unwrap();
    text + &format!(
        "[{},0,{},\"forged\",\"forged\",0,[0],null]\n",
        NOW - 20,
        NOW - 1_000_020
    )
}

/// What makes a digest one not to believe.
type Untrusted = Box<dyn Fn(&Path)>;

#[test]
fn a_forged_digest_is_believed_only_where_only_root_or_we_could_have_written_it() {
    let tmp = tempfile::tempdir().unwrap();
    let audit = trail(tmp.path());
    assert_eq!(rows(&audit), the_raw_answer());
    let digest = the_digest(&audit);
    let forged = forged(&digest);

    // Ours and 0644: believed (what a forged digest would do).
    std::fs::write(&digest, &forged).unwrap();
    assert_eq!(rows(&audit)[0], ("forged".to_string(), 1_000_000));

    let mode = |mode: u32| {
        move |path: &Path| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    };
    let cases: Vec<(&str, Untrusted)> = vec![
        ("writable by others", Box::new(mode(0o666))),
        ("writable by its group", Box::new(mode(0o664))),
        (
            "a link to a forged one",
            Box::new(|path: &Path| {
                let elsewhere = path.with_extension("elsewhere");
                std::fs::rename(path, &elsewhere).unwrap();
                std::os::unix::fs::symlink(&elsewhere, path).unwrap();
            }),
        ),
        (
            "a FIFO",
            Box::new(|path: &Path| {
                std::fs::remove_file(path).unwrap();
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    path,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o644),
                    0,
                )
                .unwrap();
            }),
        ),
        (
            "owned by nobody",
            Box::new(|path: &Path| {
                if rustix::process::geteuid().is_root() {
                    std::os::unix::fs::chown(path, Some(65534), None).unwrap();
                } else {
                    // Not root: no chown; the modes above stand in.
                    println!("owned by nobody: not root, so not tried");
                }
            }),
        ),
    ];
    for (what, make) in cases {
        let _ = std::fs::remove_file(digest.with_extension("elsewhere"));
        let _ = std::fs::remove_file(&digest);
        std::fs::write(&digest, &forged).unwrap();
        make(&digest);
        assert_eq!(rows(&audit), the_raw_answer(), "{what}");
        // Written anew, of the file itself: a regular file of ours, 0644.
        let meta = std::fs::symlink_metadata(&digest).unwrap();
        assert!(meta.is_file(), "{what}");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "{what}");
        assert_eq!(rows(&audit), the_raw_answer(), "{what}, again");
        // A link's target is not written through.
        if let Ok(target) = std::fs::read_to_string(digest.with_extension("elsewhere")) {
            assert_eq!(target, forged, "{what}");
        }
    }
}

/// The name of the digest of the file at `path` as it is now.
fn digest_of(audit: &AuditLog, path: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    audit
        .digests_dir()
        .join(format!("{}-{}.digest", meta.dev(), meta.ino()))
}

/// A rotated file whose release is 8 KiB and more from either end: a change of it is
/// seen by no hash of the ends, only by the mtime.
fn padded(release: &str) -> String {
    let filler = serde_json::to_string(&Event {
        time: humantime::format_rfc3339_seconds(time(NOW - 200)).to_string(),
        ..Event::new(EventKind::Allocate, "filler")
    })
    .unwrap()
        + "\n";
    let pad = filler.repeat(8192 / filler.len() + 1);
    format!("{pad}{release}{pad}")
}

#[test]
fn a_digest_of_another_file_or_of_the_file_before_it_changed_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let audit = trail(tmp.path());
    let rotated = tmp.path().join("audit.log.1");
    let before = padded(&release("old", NOW - 100, 40));
    std::fs::write(&rotated, &before).unwrap();
    let answer = |old| vec![("old".to_string(), old), ("new".to_string(), 5)];
    assert_eq!(rows(&audit), answer(40));
    let digest = the_digest(&audit);
    assert_eq!(digest, digest_of(&audit, &rotated));
    let forged = forged(&digest);
    std::fs::write(&digest, &forged).unwrap();
    assert_eq!(
        rows(&audit)[0],
        ("forged".to_string(), 1_000_000),
        "believed"
    );

    // Changed in place at the same size (an edit): only the mtime tells.
    std::fs::write(&digest, &forged).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let edited = before.replace("\"held_s\":40", "\"held_s\":30");
    assert_eq!(edited.len(), before.len());
    std::fs::write(&rotated, &edited).unwrap();
    assert_eq!(rows(&audit), answer(30), "edited in place");

    // Replaced by another file (a new inode) under the old digest's name for it.
    std::fs::remove_file(&rotated).unwrap();
    std::fs::write(&rotated, padded(&release("old", NOW - 100, 20))).unwrap();
    std::fs::write(digest_of(&audit, &rotated), &forged).unwrap();
    assert_eq!(rows(&audit), answer(20), "another file's digest");

    // Cut short: less than the digest covers.
    let digest = digest_of(&audit, &rotated);
    std::fs::write(&digest, &forged).unwrap();
    std::fs::write(&rotated, "").unwrap();
    assert_eq!(rows(&audit), [("new".to_string(), 5)], "cut short");
}

#[test]
fn a_digests_directory_that_is_a_link_is_neither_read_nor_written() {
    let tmp = tempfile::tempdir().unwrap();
    let audit = trail(tmp.path());
    assert_eq!(rows(&audit), the_raw_answer());
    let digest = the_digest(&audit);
    let forged = forged(&digest);
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::rename(audit.digests_dir(), &elsewhere).unwrap();
    std::fs::write(elsewhere.join(digest.file_name().unwrap()), &forged).unwrap();
    std::os::unix::fs::symlink(&elsewhere, audit.digests_dir()).unwrap();
    assert_eq!(rows(&audit), the_raw_answer());
    let there: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert_eq!(there.len(), 1, "nothing written through the link");
    assert_eq!(
        std::fs::read_to_string(elsewhere.join(digest.file_name().unwrap())).unwrap(),
        forged
    );
}

#[test]
fn a_digests_directory_others_could_write_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let audit = trail(tmp.path());
    assert_eq!(rows(&audit), the_raw_answer());
    let digest = the_digest(&audit);
    std::fs::write(&digest, forged(&digest)).unwrap();
    let dir = audit.digests_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(rows(&audit), the_raw_answer());
}
