//! Slurm nodes: the hold a job's prolog makes (`slurm-<job id>`, see slurm/prolog), and
//! Slurm's GPU numbers (`SLURM_JOB_GPUS`) as the device minors gpupin holds GPUs by.

mod gres;
mod hostlist;

use crate::base::safe_open::{self, Links};
use crate::model::holder::HolderId;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

pub(crate) use gres::GresError;

/// The variable Slurm sets in every process of a job: the job's id.
pub const JOB_ID_ENV: &str = "SLURM_JOB_ID";
/// How the prolog names a job's hold: `slurm-<SLURM_JOB_ID>`.
pub(crate) const HOLDER_PREFIX: &str = crate::model::holder::SLURM_PREFIX;
/// Where Slurm reads its configuration when `SLURM_CONF` does not say (Debian's path).
pub(crate) const DEFAULT_SLURM_CONF: &str = "/etc/slurm/slurm.conf";

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
    #[error(
        "MultipleFiles={files} of node {node} in {path}: expected one GPU node (/dev/nvidia<N>) beside the nvidia-cap nodes"
    )]
    NotOneGpu {
        files: String,
        node: String,
        path: PathBuf,
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

/// One of Slurm's GPUs by its device minors: a GPU's, or a MIG instance's GPU and
/// capability nodes (a `MultipleFiles=` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmUnit {
    pub gpu_minor: u32,
    /// The capability minors, sorted; empty for a whole GPU.
    pub cap_minors: Vec<u32>,
}

impl SlurmUnit {
    /// `3`, or `0/84/85` for a MIG instance: how `gpupin hold --by-minor` takes it.
    pub fn key(&self) -> String {
        std::iter::once(self.gpu_minor)
            .chain(self.cap_minors.iter().copied())
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// Slurm's GPU numbers of `node` as units (`minors`, MIG instances included).
pub fn units(gres_conf: &Path, node: &str, numbers: &str) -> Result<Vec<SlurmUnit>, SlurmError> {
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
    let units = gres::gpu_units(&text, node).map_err(|source| SlurmError::Gres {
        path: gres_conf.to_path_buf(),
        source,
    })?;
    positions
        .into_iter()
        .map(|number| {
            let files = units.get(number).ok_or_else(|| SlurmError::NoSuchNumber {
                number,
                node: node.to_string(),
                path: gres_conf.to_path_buf(),
                count: units.len(),
            })?;
            let (caps, gpus): (Vec<&String>, Vec<&String>) =
                files.iter().partition(|f| gres::is_cap_file(f));
            let [gpu] = gpus.as_slice() else {
                return Err(SlurmError::NotOneGpu {
                    files: files.join(","),
                    node: node.to_string(),
                    path: gres_conf.to_path_buf(),
                });
            };
            let mut cap_minors = caps
                .iter()
                .map(|f| minor_of(f, node, gres_conf))
                .collect::<Result<Vec<_>, _>>()?;
            cap_minors.sort_unstable();
            Ok(SlurmUnit {
                gpu_minor: minor_of(gpu, node, gres_conf)?,
                cap_minors,
            })
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

    /// Slurm's GPU numbers (`SLURM_JOB_GPUS`) of `node` as device minors: each number is a
    /// position in gres.conf's list of the node's GPU files (`gres`), and the minor is that
    /// file's, read from the file itself as Slurm reads it (stat, links followed).
    fn minors(gres_conf: &Path, node: &str, numbers: &str) -> Result<Vec<u32>, SlurmError> {
        units(gres_conf, node, numbers)?
            .into_iter()
            .map(|unit| Ok(unit.gpu_minor))
            .collect()
    }

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
    fn a_multiple_files_line_is_a_mig_instance_by_its_gpu_and_cap_minors() {
        let tmp = tempfile::tempdir().unwrap();
        // /dev/null (1:3) stands in for the GPU, /dev/full (1:7) and /dev/zero (1:5) for
        // the capability nodes, linked under the names Slurm's docs use.
        let caps = tmp.path().join("nvidia-caps");
        std::fs::create_dir(&caps).unwrap();
        std::os::unix::fs::symlink("/dev/full", caps.join("nvidia-cap85")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", caps.join("nvidia-cap84")).unwrap();
        let conf = tmp.path().join("gres.conf");
        let text = format!(
            "Name=gpu File=/dev/zero\nName=gpu Type=1g.10gb MultipleFiles=/dev/null,{0}/nvidia-cap84,{0}/nvidia-cap85\n",
            caps.display()
        );
        std::fs::write(&conf, text).unwrap();
        let got = units(&conf, "n1", "1,0").unwrap();
        assert_eq!(got[0].key(), "3/5/7");
        assert_eq!(got[1].key(), "5");
        let bad = format!(
            "Name=gpu MultipleFiles={0}/nvidia-cap84,{0}/nvidia-cap85\n",
            caps.display()
        );
        std::fs::write(&conf, bad).unwrap();
        let err = crate::base::message::one_line(&units(&conf, "n1", "0").unwrap_err());
        assert!(
            err.contains("expected one GPU node (/dev/nvidia<N>) beside the nvidia-cap nodes"),
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
