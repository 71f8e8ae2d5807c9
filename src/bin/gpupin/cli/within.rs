//! `--within HOLDER` and `--key-file FILE`, which `gpupin exec` and `gpupin hold` share.
//! A holder's key lets whoever has it take that holder's GPUs, and a command line is
//! public (`ps`, /proc/PID/cmdline, for the whole life of the job): a key comes from a
//! file only its user can read, or from the environment (`GPUPIN_WITHIN=HOLDER:KEY`),
//! never from an argument.

use anyhow::{Context, bail};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

/// A key file is a few dozen bytes; more is no key file.
const MAX_KEY_FILE: u64 = 4096;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct WithinArgs {
    /// Take the GPUs from this holder's (a hold, a Slurm job) instead of the free pool;
    /// for a holder that is not yours, with --key-file or GPUPIN_WITHIN=ID:KEY [exec's
    /// default: $GPUPIN_WITHIN, else inside a Slurm job its hold slurm-$SLURM_JOB_ID
    /// where there is one]
    #[arg(long, value_name = "ID")]
    pub within: Option<String>,
    /// A file that holds the --within holder's key (as `gpupin key ID` prints it, KEY or
    /// ID:KEY), readable by you alone (chmod 600)
    #[arg(long, value_name = "FILE", requires = "within")]
    pub key_file: Option<PathBuf>,
}

impl WithinArgs {
    /// `ID` or `ID:KEY` for the request, or `None` when --within was not given.
    pub fn resolve(&self) -> anyhow::Result<Option<String>> {
        let Some(within) = &self.within else {
            return Ok(None);
        };
        if let Some((holder, _)) = within.split_once(':') {
            bail!(
                "--within {holder}:KEY puts the key on the command line, where every user of this machine can read it (ps): give --within {holder} --key-file FILE (a file only you can read), or GPUPIN_WITHIN={holder}:KEY in the environment"
            );
        }
        let Some(path) = &self.key_file else {
            return Ok(Some(within.clone()));
        };
        let key = read_key_file(path)?;
        // `gpupin key` prints ID:KEY: the file may hold either.
        let key = match key.split_once(':') {
            Some((holder, key)) if holder == within => key.to_string(),
            Some((holder, _)) => bail!(
                "--key-file {}: it holds the key of {holder}, not of {within}",
                path.display()
            ),
            None => key,
        };
        Ok(Some(format!("{within}:{key}")))
    }
}

/// The key in `path`: a regular file of the caller's that no one else may read.
fn read_key_file(path: &std::path::Path) -> anyhow::Result<String> {
    // O_NOFOLLOW: a link's target could be anyone's; O_NONBLOCK: a FIFO does not hang
    // the open, and is refused below.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("--key-file {}: cannot open it", path.display()))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        bail!(
            "--key-file {}: not a regular file; write the key into a file (gpupin key ID > FILE)",
            path.display()
        );
    }
    if meta.mode() & 0o077 != 0 {
        bail!(
            "--key-file {}: others may read it (mode {:o}): chmod 600 {} first",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        );
    }
    if meta.uid() != rustix::process::getuid().as_raw() {
        bail!(
            "--key-file {}: it belongs to uid {}, not to you",
            path.display(),
            meta.uid()
        );
    }
    let mut text = String::new();
    file.take(MAX_KEY_FILE)
        .read_to_string(&mut text)
        .with_context(|| format!("--key-file {}: cannot read it", path.display()))?;
    let key = text.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        bail!(
            "--key-file {}: expected one key (gpupin key ID > FILE)",
            path.display()
        );
    }
    Ok(key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn args(within: &str, key_file: Option<PathBuf>) -> WithinArgs {
        WithinArgs {
            within: Some(within.into()),
            key_file,
        }
    }

    fn key_file(dir: &std::path::Path, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(format!("key-{mode:o}"));
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    /// Issue 31, finding 2: `--within ID:KEY` left the key in /proc/PID/cmdline for the
    /// whole job, for any local user to read.
    #[test]
    fn a_key_on_the_command_line_is_refused_without_repeating_it() {
        let key = "0123456789abcdef0123456789abcdef";
        let err = args(&format!("res-7:{key}"), None)
            .resolve()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--within res-7:KEY puts the key on the command line, where every user of this machine can read it (ps): give --within res-7 --key-file FILE (a file only you can read), or GPUPIN_WITHIN=res-7:KEY in the environment"
        );
        assert_eq!(
            args("res-7", None).resolve().unwrap().as_deref(),
            Some("res-7")
        );
    }

    #[test]
    fn a_key_comes_from_a_file_only_its_user_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let key = "0123456789abcdef0123456789abcdef";
        for text in [format!("{key}\n"), format!("res-7:{key}\n")] {
            let file = key_file(tmp.path(), &text, 0o600);
            assert_eq!(
                args("res-7", Some(file)).resolve().unwrap(),
                Some(format!("res-7:{key}"))
            );
        }
        let open = key_file(tmp.path(), key, 0o644);
        let err = args("res-7", Some(open.clone()))
            .resolve()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "--key-file {0}: others may read it (mode 644): chmod 600 {0} first",
                open.display()
            )
        );
        let other = key_file(tmp.path(), &format!("bob-train:{key}"), 0o400);
        let err = args("res-7", Some(other))
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("it holds the key of bob-train, not of res-7"),
            "{err}"
        );
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path().join("key-600"), &link).unwrap();
        assert!(
            args("res-7", Some(link)).resolve().is_err(),
            "a link is not followed"
        );
        let fifo = tmp.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let err = args("res-7", Some(fifo)).resolve().unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        for (text, what) in [("\n", "an empty file"), ("two words\n", "a space inside")] {
            let file = key_file(tmp.path(), text, 0o600);
            let err = args("res-7", Some(file)).resolve().unwrap_err().to_string();
            assert!(
                err.ends_with(": expected one key (gpupin key ID > FILE)"),
                "{what}: {err}"
            );
        }
    }
}
