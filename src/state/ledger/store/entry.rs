//! What an entry of `holders/` is, judged by its name and its file type alone (lstat,
//! never followed), and how an operator names it to `gpupin release`.

use crate::base::atomic;
use crate::model::holder::HolderId;
use crate::state::ledger::LedgerError;
use std::ffi::OsStr;
use std::fs::FileType;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

const RECORD_SUFFIX: &str = ".json";

/// The kinds of entries `holders/` can hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::state::ledger) enum Entry {
    /// `<holder id>.json`, a regular file: a holder's record.
    Record,
    /// A temp file `atomic::write` left or is writing, with its writer's pid.
    Temp(i32),
    /// Where a record belongs (`*.json`) but none gpupin writes: a name that is no holder
    /// id, or something other than a regular file. It cannot be anyone's record.
    Stray(&'static str),
    /// Neither (hidden, or not `.json`): never read, never in the way.
    Other,
}

pub(in crate::state::ledger) fn classify(name: &OsStr, kind: FileType) -> Entry {
    let bytes = name.as_bytes();
    if bytes.starts_with(b".") {
        return name
            .to_str()
            .and_then(atomic::temp_writer)
            .map_or(Entry::Other, Entry::Temp);
    }
    let Some(stem) = bytes.strip_suffix(RECORD_SUFFIX.as_bytes()) else {
        return Entry::Other;
    };
    let valid = std::str::from_utf8(stem).is_ok_and(|s| HolderId::new(s).is_ok());
    if !valid {
        Entry::Stray("its name is not that of a holder id")
    } else if kind.is_dir() {
        Entry::Stray("it is a directory, not a record")
    } else if kind.is_symlink() {
        Entry::Stray("it is a symlink, not a record")
    } else if kind.is_fifo() {
        Entry::Stray("it is a FIFO, not a record")
    } else if !kind.is_file() {
        Entry::Stray("it is a special file, not a record")
    } else {
        Entry::Record
    }
}

/// The names in `holders/` that `gpupin release NAME` removes, in the order tried: the
/// record of holder `NAME` first (the id a user knows), then the entry named exactly
/// `NAME` (so `x.json` is holder `x.json`'s record when it has one, else holder `x`'s).
/// Anything but one plain file-name component is refused.
pub(in crate::state::ledger) fn release_names(name: &OsStr) -> Result<Vec<Vec<u8>>, LedgerError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(LedgerError::BadEntryName {
            name: name.to_string_lossy().into_owned(),
        });
    }
    Ok(vec![
        [bytes, RECORD_SUFFIX.as_bytes()].concat(),
        bytes.to_vec(),
    ])
}

/// The argument of `gpupin release` that removes the entry at `path`, quoted for a shell
/// and always on one line (a file name may hold a newline).
pub(crate) fn release_arg(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default();
    let bytes = name.as_bytes();
    if let Some(stem) = bytes.strip_suffix(RECORD_SUFFIX.as_bytes())
        && let Ok(stem) = std::str::from_utf8(stem)
        && HolderId::new(stem).is_ok()
    {
        return stem.to_string();
    }
    // `--` keeps a name starting with '-' from reading as an option.
    let dashes = if bytes.starts_with(b"-") { "-- " } else { "" };
    let plain = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || b"._-+=:,@%".contains(b));
    if plain {
        return format!("{dashes}{}", name.to_string_lossy());
    }
    let mut quoted = String::from("$'");
    for &b in bytes {
        match b {
            b'\'' => quoted.push_str("\\'"),
            b'\\' => quoted.push_str("\\\\"),
            0x20..=0x7e => quoted.push(b as char),
            _ => quoted.push_str(&format!("\\x{b:02x}")),
        }
    }
    quoted.push('\'');
    format!("{dashes}{quoted}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn kind_of(make: impl FnOnce(&Path)) -> FileType {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e");
        make(&path);
        std::fs::symlink_metadata(&path).unwrap().file_type()
    }

    #[test]
    fn entries_are_told_apart_by_name_and_type() {
        let file = kind_of(|p| std::fs::write(p, "").unwrap());
        let dir = kind_of(|p| std::fs::create_dir(p).unwrap());
        let link = kind_of(|p| std::os::unix::fs::symlink("/", p).unwrap());
        let c = |n: &str, k| classify(OsStr::new(n), k);
        assert_eq!(c("a.json", file), Entry::Record);
        assert_eq!(c(".a.json.gpupin-77-0.tmp", file), Entry::Temp(77));
        assert_eq!(c(".hidden.json", file), Entry::Other);
        assert_eq!(c("notes", file), Entry::Other);
        assert!(matches!(c("bad id.json", file), Entry::Stray(_)));
        assert!(matches!(c("x.json", dir), Entry::Stray(r) if r.contains("directory")));
        assert!(matches!(c("x.json", link), Entry::Stray(r) if r.contains("symlink")));
    }

    #[test]
    fn release_takes_one_name_with_or_without_json() {
        let names = |n: &str| release_names(OsStr::new(n)).map_err(|e| e.to_string());
        assert_eq!(names("a").unwrap(), [b"a.json".to_vec(), b"a".to_vec()]);
        assert_eq!(
            names("bad id.json").unwrap(),
            [b"bad id.json.json".to_vec(), b"bad id.json".to_vec()]
        );
        for bad in ["", ".", "..", "a/b", "../x.json", "/"] {
            let err = names(bad).unwrap_err();
            assert!(err.starts_with("invalid ledger entry"), "{err}");
        }
    }

    #[test]
    fn release_arg_is_one_shell_word_on_one_line() {
        let arg = |n: &str| release_arg(&PathBuf::from("/s/holders").join(n));
        assert_eq!(arg("c1.json"), "c1");
        assert_eq!(arg("x.json.json"), "x.json");
        assert_eq!(arg("bad id.json"), "$'bad id.json'");
        assert_eq!(arg("a\nb's.json"), "$'a\\x0ab\\'s.json'");
        assert_eq!(arg("-x.json"), "-- -x.json");
    }
}
