//! Which hooks.d directories podman reads, and the containers.conf drop-in that adds
//! gpupin's. Podman reads only `/usr/share/containers/oci/hooks.d` unless containers.conf
//! sets `[engine] hooks_dir` (seen with podman 4.3: a hook in /etc/containers/oci/hooks.d
//! never ran). gpupin's files cannot go into that default dir: CRI-O reads it too and
//! refuses a directory holding a hook for a stage it does not know (`precreate`). So the
//! package puts them in `/usr/share/gpupin/hooks.d`, `gpupin install podman` in
//! `/etc/containers/oci/hooks.d`, and a drop-in in `/etc/containers/containers.conf.d`
//! lists both after the dirs podman read already (a later dir's file of the same name
//! wins: the admin's in /etc over the package's).

use super::podman::{Change, InstallError, Step};
use crate::base::safe_open::{self, Links};
use std::path::{Path, PathBuf};

/// Podman's hooks dir when containers.conf names none (containers/common's default).
pub(crate) const PODMAN_DEFAULT: &str = "/usr/share/containers/oci/hooks.d";
/// Where the Debian package puts gpupin's hooks.d files.
pub(crate) const PACKAGE_HOOKS_DIR: &str = "/usr/share/gpupin/hooks.d";
/// Where `gpupin install podman` puts them (`podman::HOOKS_DIR`).
pub(crate) const ADMIN_HOOKS_DIR: &str = super::podman::HOOKS_DIR;
/// The drop-in, relative to the root.
const DROP_IN: &str = "etc/containers/containers.conf.d/50-gpupin.conf";
/// The first line of a drop-in gpupin wrote: one without it is the admin's.
const MARKER: &str = "# Written by gpupin";

/// containers.conf as podman (run as root) reads it, under `root` (`/` on a host).
#[derive(Debug, Clone)]
pub struct ContainersConf {
    root: PathBuf,
}

#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {reason}; podman would not start either: fix that file")]
pub struct ConfError {
    pub path: PathBuf,
    pub reason: String,
}

impl ContainersConf {
    pub fn host() -> ContainersConf {
        ContainersConf::at(Path::new("/"))
    }

    pub fn at(root: &Path) -> ContainersConf {
        ContainersConf {
            root: root.to_path_buf(),
        }
    }

    /// The drop-in gpupin writes.
    pub fn drop_in(&self) -> PathBuf {
        self.root.join(DROP_IN)
    }

    /// The files podman reads, in order: the vendor's, the admin's, then the drop-ins
    /// by name; a later `hooks_dir` replaces an earlier one.
    fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![
            self.root.join("usr/share/containers/containers.conf"),
            self.root.join("etc/containers/containers.conf"),
        ];
        let dir = self.root.join("etc/containers/containers.conf.d");
        let mut drop_ins: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                    .collect()
            })
            .unwrap_or_default();
        drop_ins.sort();
        files.extend(drop_ins);
        files
    }

    /// The hooks dirs podman reads, in order; `without_ours`: as if gpupin's drop-in
    /// were not there (what the drop-in must keep).
    pub fn hooks_dirs(&self, without_ours: bool) -> Result<Vec<PathBuf>, ConfError> {
        let ours = self.drop_in();
        let mut dirs = vec![PathBuf::from(PODMAN_DEFAULT)];
        for file in self.files() {
            if without_ours && file == ours {
                continue;
            }
            if let Some(set) = hooks_dir_in(&file)? {
                dirs = set;
            }
        }
        Ok(dirs)
    }

    /// Writes the drop-in naming gpupin's dirs after the ones podman reads now, unless it
    /// is there already. A file of that name that gpupin did not write is left alone.
    pub fn install(&self, dry_run: bool) -> Result<Step, InstallError> {
        let path = self.drop_in();
        let current = self.hooks_dirs(true).map_err(|e| InstallError::Conf {
            path: e.path,
            reason: e.reason,
        })?;
        let text = drop_in_text(&current);
        let change = match read_existing(&path)? {
            Some(existing) if !existing.starts_with(MARKER) => {
                return Err(InstallError::Foreign { path });
            }
            Some(existing) if existing == text => Change::Unchanged,
            _ => Change::Written,
        };
        if change == Change::Written && !dry_run {
            let dir = path.parent().expect("the drop-in has a dir");
            std::fs::create_dir_all(dir).map_err(|source| InstallError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
            let synced = crate::base::atomic::Durability::Synced;
            crate::base::atomic::write(&path, text.as_bytes(), 0o644, synced).map_err(
                |source| InstallError::WriteFile {
                    path: path.clone(),
                    source,
                },
            )?;
        }
        Ok(Step { path, change })
    }

    /// Removes gpupin's drop-in, unless the package's hooks still need it.
    pub fn uninstall(&self, dry_run: bool) -> Result<Step, InstallError> {
        let path = self.drop_in();
        let package_hooks = self
            .root
            .join(PACKAGE_HOOKS_DIR.trim_start_matches('/'))
            .join(super::podman::file_name("prestart"));
        let change = match read_existing(&path)? {
            None => Change::Absent,
            Some(existing) if !existing.starts_with(MARKER) => Change::Foreign,
            Some(_) if package_hooks.exists() => Change::Kept,
            Some(_) => Change::Removed,
        };
        if change == Change::Removed && !dry_run {
            super::podman::remove(&path)?;
        }
        Ok(Step { path, change })
    }
}

/// The drop-in for a podman that reads `current` now: those dirs, then the package's,
/// then the admin's last, so that its files win over the package's of the same name.
pub(crate) fn drop_in_text(current: &[PathBuf]) -> String {
    let ours = [PACKAGE_HOOKS_DIR, ADMIN_HOOKS_DIR];
    let mut dirs: Vec<String> = current
        .iter()
        .map(|d| d.display().to_string())
        .filter(|d| !ours.contains(&d.as_str()))
        .collect();
    dirs.extend(ours.map(str::to_string));
    let quoted: Vec<String> = dirs.iter().map(|d| format!("{d:?}")).collect();
    format!(
        "{MARKER} (gpupin install podman, or the gpupin package).\n\
         # Podman reads only {PODMAN_DEFAULT} unless hooks_dir says otherwise; gpupin's\n\
         # hooks are not there because CRI-O reads that dir too and refuses their precreate\n\
         # stage. These are the dirs podman read before, then gpupin's.\n\
         [engine]\nhooks_dir = [{}]\n",
        quoted.join(", ")
    )
}

/// `[engine] hooks_dir` of one containers.conf file; `None` when the file or the key is
/// not there.
fn hooks_dir_in(file: &Path) -> Result<Option<Vec<PathBuf>>, ConfError> {
    let text = match safe_open::read_to_string(file, Links::Follow) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ConfError {
                path: file.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let bad = |reason: String| ConfError {
        path: file.to_path_buf(),
        reason,
    };
    let value: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(crate::base::message::one_line(&e)))?;
    let Some(dirs) = value.get("engine").and_then(|e| e.get("hooks_dir")) else {
        return Ok(None);
    };
    let dirs = dirs
        .as_array()
        .ok_or_else(|| bad("[engine] hooks_dir is not a list".into()))?;
    dirs.iter()
        .map(|d| {
            d.as_str()
                .map(PathBuf::from)
                .ok_or_else(|| bad("[engine] hooks_dir holds a value that is not a path".into()))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn read_existing(path: &Path) -> Result<Option<String>, InstallError> {
    match safe_open::read_to_string(path, Links::Refuse) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(InstallError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// What the package ships is what `install` writes on a host with podman's defaults.
    #[test]
    fn the_packages_drop_in_is_the_one_install_writes_by_default() {
        let shipped = include_str!("../../../packaging/containers.conf.d/50-gpupin.conf");
        assert_eq!(shipped, drop_in_text(&[PathBuf::from(PODMAN_DEFAULT)]));
    }

    #[test]
    fn podman_reads_its_default_until_a_later_file_sets_hooks_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = ContainersConf::at(tmp.path());
        assert_eq!(
            conf.hooks_dirs(false).unwrap(),
            [PathBuf::from(PODMAN_DEFAULT)]
        );
        // Debian's vendor file with the key commented out changes nothing.
        write(
            tmp.path(),
            "usr/share/containers/containers.conf",
            "[engine]\n#hooks_dir = [\"/x\"]\n",
        );
        assert_eq!(
            conf.hooks_dirs(false).unwrap(),
            [PathBuf::from(PODMAN_DEFAULT)]
        );
        write(
            tmp.path(),
            "etc/containers/containers.conf",
            "[engine]\nhooks_dir = [\"/site/hooks\"]\n",
        );
        write(
            tmp.path(),
            "etc/containers/containers.conf.d/10-a.conf",
            "[engine]\nhooks_dir = [\"/a\"]\n",
        );
        write(
            tmp.path(),
            "etc/containers/containers.conf.d/20-b.conf",
            "[network]\n",
        );
        assert_eq!(conf.hooks_dirs(false).unwrap(), [PathBuf::from("/a")]);
        write(
            tmp.path(),
            "etc/containers/containers.conf.d/05-bad.conf",
            "[engine\n",
        );
        let err = conf.hooks_dirs(false).unwrap_err().to_string();
        assert!(err.contains("05-bad.conf") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn install_keeps_the_dirs_podman_read_and_adds_gpupins_once() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = ContainersConf::at(tmp.path());
        write(
            tmp.path(),
            "etc/containers/containers.conf",
            "[engine]\nhooks_dir = [\"/site/hooks\", \"/etc/containers/oci/hooks.d\"]\n",
        );
        // A dry run writes nothing.
        assert_eq!(conf.install(true).unwrap().change, Change::Written);
        assert!(!conf.drop_in().exists());
        let step = conf.install(false).unwrap();
        assert_eq!(step.change, Change::Written);
        assert_eq!(
            conf.hooks_dirs(false).unwrap(),
            [
                "/site/hooks",
                PACKAGE_HOOKS_DIR,
                "/etc/containers/oci/hooks.d"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(conf.install(false).unwrap().change, Change::Unchanged);
        // gpupin's own drop-in from before the admin's hooks_dir changed is rewritten.
        let old = format!(
            "{MARKER} (an older gpupin)\n[engine]\nhooks_dir = [\"/usr/share/gpupin/hooks.d\"]\n"
        );
        std::fs::write(conf.drop_in(), &old).unwrap();
        assert_eq!(conf.install(false).unwrap().change, Change::Written);
        assert_eq!(
            conf.hooks_dirs(false).unwrap(),
            [
                "/site/hooks",
                PACKAGE_HOOKS_DIR,
                "/etc/containers/oci/hooks.d"
            ]
            .map(PathBuf::from)
        );
        // The admin's file of that name stays.
        std::fs::write(conf.drop_in(), "[engine]\nhooks_dir = []\n").unwrap();
        assert!(matches!(
            conf.install(false),
            Err(InstallError::Foreign { .. })
        ));
        assert_eq!(conf.uninstall(false).unwrap().change, Change::Foreign);
    }

    #[test]
    fn uninstall_leaves_the_drop_in_while_the_packages_hooks_need_it() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = ContainersConf::at(tmp.path());
        conf.install(false).unwrap();
        write(
            tmp.path(),
            "usr/share/gpupin/hooks.d/gpupin-prestart.json",
            "{}",
        );
        assert_eq!(conf.uninstall(false).unwrap().change, Change::Kept);
        assert!(conf.drop_in().exists());
        std::fs::remove_file(
            tmp.path()
                .join("usr/share/gpupin/hooks.d/gpupin-prestart.json"),
        )
        .unwrap();
        assert_eq!(conf.uninstall(true).unwrap().change, Change::Removed);
        assert!(conf.drop_in().exists(), "a dry run changes nothing");
        assert_eq!(conf.uninstall(false).unwrap().change, Change::Removed);
        assert!(!conf.drop_in().exists());
        assert_eq!(conf.uninstall(false).unwrap().change, Change::Absent);
    }
}
