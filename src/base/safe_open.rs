//! Opening files that someone else could have replaced: a FIFO must not block the hook
//! (under the ledger's flock that would stall every container start on the host), a
//! symlink must not be followed where none belongs, and a huge file must not be read
//! whole. Every open is O_NONBLOCK, then fstat must call the file regular.

use rustix::fs::{FileType, Mode, OFlags};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Whether the last component of a path may be a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// State files and bundle specs: a link there is an attack or a mistake.
    Refuse,
    /// Files an administrator names (the config, the inventory file), which are often
    /// links into a managed tree.
    Follow,
}

/// The most any reader here takes: records, specs and configs are kilobytes.
pub(crate) const MAX_LEN: u64 = 16 << 20;

/// Opens `path` for reading without blocking on a FIFO or device and without following a
/// final symlink unless `links` allows it; anything but a regular file is refused with
/// `InvalidInput` (a symlink with `Links::Refuse`: the kernel's ELOOP).
pub(crate) fn open(path: &Path, links: Links) -> io::Result<File> {
    open_with_stat(path, links).map(|(file, _)| file)
}

/// As `open`, with the file's stat (the one that called it regular): for callers that
/// judge its owner and mode, and read it whole at once (`read_file`).
pub(crate) fn open_with_stat(path: &Path, links: Links) -> io::Result<(File, rustix::fs::Stat)> {
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    if links == Links::Refuse {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::open(path, flags, Mode::empty())?;
    let stat = ensure_regular(&fd)?;
    Ok((File::from(fd), stat))
}

/// As `open_with_stat` with `Links::Refuse`, for `name` in the directory `dir` is open
/// on: a reader of thousands of files in one directory walks its path once, not once a
/// file.
pub(crate) fn open_at_with_stat(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
) -> io::Result<(File, rustix::fs::Stat)> {
    let flags =
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NOFOLLOW;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty())?;
    let stat = ensure_regular(&fd)?;
    Ok((File::from(fd), stat))
}

/// Whether `stat` (of a state file just opened) says that only root or this user could
/// have written it: owned by one of them, writable by no one else. `Err`: why not, for a
/// message. Whoever else could write a state file could make it say anything.
pub(crate) fn written_by_us(stat: &rustix::fs::Stat) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != 0 && stat.st_uid != me {
        return Err(format!("owned by uid {}, not root", stat.st_uid));
    }
    if stat.st_mode & 0o022 != 0 {
        return Err(format!(
            "mode {:o} lets others write it",
            stat.st_mode & 0o7777
        ));
    }
    Ok(())
}

/// Opens `path` for appending, creating it with `mode` (whatever the umask) when missing;
/// never through a symlink, never a FIFO.
pub(crate) fn open_append(path: &Path, mode: u32) -> io::Result<File> {
    open_created(path, OFlags::WRONLY | OFlags::APPEND, mode)
}

/// Opens `path` for reading and writing (a lock file to flock), creating it with `mode`
/// when missing; never through a symlink, never a FIFO (a FIFO opened read-write does not
/// block on Linux, but it is no file of ours either).
pub(crate) fn open_read_write(path: &Path, mode: u32) -> io::Result<File> {
    open_created(path, OFlags::RDWR, mode)
}

/// Opens or creates `path` with `access` flags; the file ends up regular, with exactly
/// `mode` when this user owns it.
fn open_created(path: &Path, access: OFlags, mode: u32) -> io::Result<File> {
    let flags = access
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::CLOEXEC
        | OFlags::NOCTTY;
    let fd = rustix::fs::open(path, flags, Mode::from_raw_mode(mode)).map_err(|e| {
        // A FIFO without a reader refuses a non-blocking writer with ENXIO.
        if e == rustix::io::Errno::NXIO {
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file but a FIFO")
        } else {
            e.into()
        }
    })?;
    ensure_regular(&fd)?;
    // O_CREAT applies the umask, and an old file may have any mode: the mode asked for
    // is the mode the file has.
    let stat = rustix::fs::fstat(&fd)?;
    if stat.st_mode & 0o7777 != mode && stat.st_uid == rustix::process::geteuid().as_raw() {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    }
    Ok(File::from(fd))
}

/// The whole of a regular file, at most `MAX_LEN` bytes (`InvalidData` beyond).
pub fn read(path: &Path, links: Links) -> io::Result<Vec<u8>> {
    let (file, stat) = open_with_stat(path, links)?;
    read_file(file, stat.st_size as u64)
}

/// The whole of a file `open` returned, at most `MAX_LEN` bytes: for callers that look at
/// its metadata (owner, mode) before they trust what it says.
/// `size`: what its stat said, so that a file that does not grow meanwhile is read in one
/// read (a record is read at every allocation, thousands of them on a busy machine).
pub(crate) fn read_file(file: File, size: u64) -> io::Result<Vec<u8>> {
    // One byte more than the size, so that the read that finds the end fits too.
    let mut bytes = Vec::with_capacity(size.min(MAX_LEN) as usize + 1);
    file.take(MAX_LEN + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {} MiB", MAX_LEN >> 20),
        ));
    }
    Ok(bytes)
}

/// As `read`, as UTF-8 text (`InvalidData` otherwise).
pub fn read_to_string(path: &Path, links: Links) -> io::Result<String> {
    String::from_utf8(read(path, links)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

fn ensure_regular(fd: &impl std::os::fd::AsFd) -> io::Result<rustix::fs::Stat> {
    let stat = rustix::fs::fstat(fd)?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => Ok(stat),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file but a {}", describe(other)),
        )),
    }
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "directory",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Symlink => "symlink",
        _ => "special file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_state_file_others_may_write_is_not_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state");
        std::fs::write(&path, "1").unwrap();
        let stat = |mode: u32| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            open_with_stat(&path, Links::Refuse).unwrap().1
        };
        assert_eq!(written_by_us(&stat(0o644)), Ok(()));
        assert_eq!(
            written_by_us(&stat(0o664)),
            Err("mode 664 lets others write it".into())
        );
        assert_eq!(
            written_by_us(&stat(0o646)),
            Err("mode 646 lets others write it".into())
        );
        let mut theirs = stat(0o644);
        theirs.st_uid = rustix::process::geteuid().as_raw() + 1;
        let why = format!("owned by uid {}, not root", theirs.st_uid);
        assert_eq!(written_by_us(&theirs), Err(why));
    }

    fn fifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        fifo(&path);
        for links in [Links::Refuse, Links::Follow] {
            let err = read(&path, links).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains("FIFO"), "{err}");
        }
        let err = open_append(&path, 0o600).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        let err = open_read_write(&path, 0o600).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn a_symlink_is_followed_only_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read(&link, Links::Refuse).is_err());
        assert_eq!(read(&link, Links::Follow).unwrap(), b"x");
        assert!(open_append(&link, 0o600).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
    }

    #[test]
    fn a_directory_is_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(dir.path(), Links::Refuse).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
    }

    #[test]
    fn append_creates_with_the_mode_asked_for_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        // 0666 is more than the usual umask (022) lets O_CREAT give.
        drop(open_append(&path, 0o666).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o666);
    }

    #[test]
    fn an_existing_file_gets_the_mode_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        drop(open_read_write(&path, 0o600).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
    }
}
