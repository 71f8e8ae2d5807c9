//! Slurm nodes: the hold a job's prolog makes (`slurm-<job id>`, see slurm/prolog), and
//! Slurm's GPU numbers (`SLURM_JOB_GPUS`) as the device minors gpupin holds GPUs by.

pub mod gres;
mod hostlist;

use crate::base::safe_open::{self, Links};
use crate::model::holder::HolderId;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub use gres::GresError;
pub use hostlist::HostlistError;

/// The variable Slurm sets in every process of a job: the job's id.
pub const JOB_ID_ENV: &str = "SLURM_JOB_ID";
/// How the prolog names a job's hold: `slurm-<SLURM_JOB_ID>`.
pub const HOLDER_PREFIX: &str = "slurm-";
/// Where Slurm reads its configuration when `SLURM_CONF` does not say (Debian's path).
pub const DEFAULT_SLURM_CONF: &str = "/etc/slurm/slurm.conf";

#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Gres {
        path: PathBuf,
        #[source]
        source: GresError,
    },
    #[error(
        "invalid Slurm GPU numbers {value:?}: expected comma-separated numbers such as 0,1 (SLURM_JOB_GPUS)"
    )]
    BadNumbers { value: String },
    #[error("Slurm GPU {number} is not on node {node}: {path} lists {count} GPU files for it")]
    NoSuchNumber {
        number: usize,
        node: String,
        path: PathBuf,
        count: usize,
    },
    #[error("GPU file {file} of node {node} in {path}")]
    Device {
        file: String,
        node: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("GPU file {file} of node {node} in {path} is not a character device")]
    NotDevice {
        file: String,
        node: String,
        path: PathBuf,
    },
}

/// The hold of Slurm job `job_id`; `None` for a value that is no job id (Slurm's are
/// decimal numbers, array tasks included).
pub fn job_holder(job_id: &str) -> Option<HolderId> {
    let number =
        !job_id.is_empty() && job_id.len() <= 20 && job_id.bytes().all(|b| b.is_ascii_digit());
    number
        .then(|| HolderId::new(&format!("{HOLDER_PREFIX}{job_id}")).ok())
        .flatten()
}

/// Where Slurm keeps gres.conf: beside slurm.conf, which `SLURM_CONF` names.
pub fn gres_conf_path(slurm_conf: Option<&Path>) -> PathBuf {
    slurm_conf
        .unwrap_or(Path::new(DEFAULT_SLURM_CONF))
        .with_file_name("gres.conf")
}

/// This host's name as slurmd calls itself by default: the host name up to its first dot.
pub fn short_hostname() -> std::io::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(name
        .trim()
        .split('.')
        .next()
        .unwrap_or_default()
        .to_string())
}

/// Slurm's GPU numbers (`SLURM_JOB_GPUS`) of `node` as device minors: each number is a
/// position in gres.conf's list of the node's GPU files (`gres`), and the minor is that
/// file's, read from the file itself as Slurm reads it (stat, links followed).
pub fn minors(gres_conf: &Path, node: &str, numbers: &str) -> Result<Vec<u32>, SlurmError> {
    let positions = numbers
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| SlurmError::BadNumbers {
            value: numbers.to_string(),
        })?;
    // An admin's file, linked into place as often as not: followed, but never a FIFO.
    let text =
        safe_open::read_to_string(gres_conf, Links::Follow).map_err(|source| SlurmError::Read {
            path: gres_conf.to_path_buf(),
            source,
        })?;
    let files = gres::gpu_files(&text, node).map_err(|source| SlurmError::Gres {
        path: gres_conf.to_path_buf(),
        source,
    })?;
    positions
        .into_iter()
        .map(|number| {
            let file = files.get(number).ok_or_else(|| SlurmError::NoSuchNumber {
                number,
                node: node.to_string(),
                path: gres_conf.to_path_buf(),
                count: files.len(),
            })?;
            minor_of(file, node, gres_conf)
        })
        .collect()
}

fn minor_of(file: &str, node: &str, gres_conf: &Path) -> Result<u32, SlurmError> {
    let meta = std::fs::metadata(file).map_err(|source| SlurmError::Device {
        file: file.to_string(),
        node: node.to_string(),
        path: gres_conf.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_char_device() {
        return Err(SlurmError::NotDevice {
            file: file.to_string(),
            node: node.to_string(),
            path: gres_conf.to_path_buf(),
        });
    }
    Ok(rustix::fs::minor(meta.rdev()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_hold_is_named_after_its_numeric_id() {
        assert_eq!(job_holder("42").unwrap().as_str(), "slurm-42");
        for bad in ["", "42_1", "-1", "4 2", "../x", "123456789012345678901"] {
            assert_eq!(job_holder(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn gres_conf_sits_beside_slurm_conf() {
        assert_eq!(gres_conf_path(None), Path::new("/etc/slurm/gres.conf"));
        assert_eq!(
            gres_conf_path(Some(Path::new("/tmp/x/slurm.conf"))),
            Path::new("/tmp/x/gres.conf")
        );
    }

    #[test]
    fn numbers_are_positions_in_the_file_list_and_minors_come_from_the_files() {
        let tmp = tempfile::tempdir().unwrap();
        // Character devices need root to make; /dev/null (1:3) and /dev/zero (1:5) stand
        // in for GPU nodes, under names whose digits say nothing.
        let conf = tmp.path().join("gres.conf");
        std::fs::write(&conf, "Name=gpu File=/dev/zero\nName=gpu File=/dev/null\n").unwrap();
        assert_eq!(minors(&conf, "n1", "1,0").unwrap(), [3, 5]);
        let err = crate::base::message::one_line(&minors(&conf, "n1", "2").unwrap_err());
        assert!(err.starts_with("Slurm GPU 2 is not on node n1:"), "{err}");
        assert!(err.ends_with("lists 2 GPU files for it"), "{err}");
        let err = minors(&conf, "n1", "0,x").unwrap_err().to_string();
        assert!(
            err.starts_with(r#"invalid Slurm GPU numbers "0,x""#),
            "{err}"
        );
    }

    #[test]
    fn a_file_that_is_missing_or_no_device_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("gres.conf");
        let plain = tmp.path().join("nvidia0");
        std::fs::write(&plain, "").unwrap();
        let text = format!(
            "Name=gpu File={},{}/nvidia9\n",
            plain.display(),
            tmp.path().display()
        );
        std::fs::write(&conf, text).unwrap();
        let err = minors(&conf, "n1", "0").unwrap_err().to_string();
        assert!(err.ends_with("is not a character device"), "{err}");
        let err = crate::base::message::one_line(&minors(&conf, "n1", "1").unwrap_err());
        assert!(
            err.contains("nvidia9 of node n1") && err.contains("No such file"),
            "{err}"
        );
    }
}
