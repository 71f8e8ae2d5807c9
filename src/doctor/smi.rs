//! NVML's readings beside `nvidia-smi -q -x`'s: nvidia-smi is NVIDIA's own NVML client,
//! so where the two disagree on a GPU's identity, gpupin's view of the machine is wrong.
//!
//! The XML elements read are the documented ones of nvidia-smi's log (nvsmi_device DTD):
//! `<nvidia_smi_log>` holding `<driver_version>` and one `<gpu id="BUS ID">` per GPU with
//! `<uuid>`, `<minor_number>`, `<pci><pci_bus_id>` and `<fb_memory_usage><total>`
//! (`81559 MiB`). nvidia-smi lists GPUs in NVML's index order, so they are paired by
//! position, and a GPU either side lacks shows as missing there.

use super::xml::{self, Element, XmlError};
use crate::base::command::{RunError, run_within};
use crate::model::gpu::Gpu;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The root element nvidia-smi writes.
const ROOT: &str = "nvidia_smi_log";
/// nvidia-smi can take seconds per GPU without persistence mode; a wedged GPU can hang
/// it for good, and doctor must still finish.
const TIMEOUT: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// What nvidia-smi said about the machine, as it wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SmiLog {
    pub driver_version: Option<String>,
    pub gpus: Vec<SmiGpu>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SmiGpu {
    pub uuid: Option<String>,
    pub minor: Option<String>,
    pub bus_id: Option<String>,
    /// `81559 MiB`.
    pub memory_total: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SmiError {
    #[error("running {program} -q -x")]
    Start {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} -q -x did not finish within {}s; it was killed", TIMEOUT.as_secs())]
    Timeout { program: PathBuf },
    #[error("{program} -q -x failed ({status}): {reason}")]
    Failed {
        program: PathBuf,
        status: std::process::ExitStatus,
        reason: String,
    },
    #[error("{program} -q -x: {source}")]
    Xml {
        program: PathBuf,
        #[source]
        source: XmlError,
    },
    #[error("{program} -q -x wrote <{root}>, expected <{ROOT}>")]
    NotALog { program: PathBuf, root: String },
}

/// Runs `program -q -x` and reads its log.
pub(crate) fn query(program: &Path) -> Result<SmiLog, SmiError> {
    let text = run(program)?;
    parse(&text).map_err(|err| match err {
        ParseError::Xml(source) => SmiError::Xml {
            program: program.to_path_buf(),
            source,
        },
        ParseError::Root(root) => SmiError::NotALog {
            program: program.to_path_buf(),
            root,
        },
    })
}

/// Why a text is not nvidia-smi's log.
#[derive(Debug)]
pub(crate) enum ParseError {
    Xml(XmlError),
    Root(String),
}

/// The GPUs of an `nvidia-smi -q -x` log.
pub(crate) fn parse(text: &str) -> Result<SmiLog, ParseError> {
    let root = xml::parse(text).map_err(ParseError::Xml)?;
    if root.name != ROOT {
        return Err(ParseError::Root(root.name));
    }
    let text = |e: &Element, path: &[&str]| {
        e.text_at(path)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    };
    Ok(SmiLog {
        driver_version: text(&root, &["driver_version"]),
        gpus: root
            .children_named("gpu")
            .map(|gpu| SmiGpu {
                uuid: text(gpu, &["uuid"]),
                minor: text(gpu, &["minor_number"]),
                // The id attribute is the same bus id, for logs without <pci>.
                bus_id: text(gpu, &["pci", "pci_bus_id"])
                    .or_else(|| gpu.attribute("id").map(str::to_string)),
                memory_total: text(gpu, &["fb_memory_usage", "total"]),
            })
            .collect(),
    })
}

/// The program's stdout, waited for at most `TIMEOUT`.
fn run(program: &Path) -> Result<String, SmiError> {
    let ran = match run_within(Command::new(program).args(["-q", "-x"]), TIMEOUT) {
        Ok(ran) => ran,
        Err(RunError::Start(source)) => {
            return Err(SmiError::Start {
                program: program.to_path_buf(),
                source,
            });
        }
        Err(RunError::Timeout(_)) => {
            return Err(SmiError::Timeout {
                program: program.to_path_buf(),
            });
        }
    };
    if !ran.status.success() {
        return Err(SmiError::Failed {
            program: program.to_path_buf(),
            status: ran.status,
            reason: ran.reason(),
        });
    }
    Ok(String::from_utf8_lossy(&ran.stdout).into_owned())
}

/// One GPU, both ways.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Comparison {
    /// Position in NVML's (and nvidia-smi's) order: the NVML index.
    pub index: usize,
    pub fields: Vec<Field>,
}

/// One reading of one GPU from NVML and from nvidia-smi; `None` where that side has no
/// such GPU or no such value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Field {
    pub name: &'static str,
    pub nvml: Option<String>,
    pub nvidia_smi: Option<String>,
    pub same: bool,
}

impl Comparison {
    pub fn differences(&self) -> impl Iterator<Item = &Field> {
        self.fields.iter().filter(|f| !f.same)
    }
}

/// NVML's GPUs (by index) beside nvidia-smi's (in its order).
pub(crate) fn compare(nvml: &[Gpu], smi: &SmiLog) -> Vec<Comparison> {
    let count = nvml.len().max(smi.gpus.len());
    (0..count)
        .map(|index| {
            let ours = nvml.get(index);
            let theirs = smi.gpus.get(index);
            let field =
                |name, nvml: Option<String>, smi: Option<&String>, same: fn(&str, &str) -> bool| {
                    let same = match (&nvml, smi) {
                        (Some(a), Some(b)) => same(a, b),
                        _ => false,
                    };
                    Field {
                        name,
                        nvml,
                        nvidia_smi: smi.cloned(),
                        same,
                    }
                };
            Comparison {
                index,
                fields: vec![
                    field(
                        "uuid",
                        ours.map(|g| g.uuid.clone()),
                        theirs.and_then(|g| g.uuid.as_ref()),
                        |a, b| a.eq_ignore_ascii_case(b),
                    ),
                    field(
                        "minor",
                        ours.map(|g| g.minor.to_string()),
                        theirs.and_then(|g| g.minor.as_ref()),
                        |a, b| a.trim().parse::<u32>().ok() == b.trim().parse().ok(),
                    ),
                    field(
                        "bus id",
                        ours.map(|g| g.pci_bus_id.clone()),
                        theirs.and_then(|g| g.bus_id.as_ref()),
                        |a, b| bus_id(a).is_some() && bus_id(a) == bus_id(b),
                    ),
                    field(
                        "memory",
                        ours.map(|g| format!("{} MiB", g.memory_bytes / MIB)),
                        theirs.and_then(|g| g.memory_total.as_ref()),
                        |a, b| mib(a).is_some() && mib(a) == mib(b),
                    ),
                ],
            }
        })
        .collect()
}

/// A bus id as `(domain, bus:device.function)`, whatever the case and domain width
/// (`0000:17:00.0` and `00000000:17:00.0` are the same device).
fn bus_id(text: &str) -> Option<(u32, String)> {
    let (domain, rest) = text.trim().split_once(':')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        rest.to_ascii_lowercase(),
    ))
}

/// `81559 MiB` as a number of MiB.
fn mib(text: &str) -> Option<u64> {
    let number = text.trim().strip_suffix("MiB")?.trim();
    number.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two GPUs as nvidia-smi writes them, cut to the elements read and a few beside them
    /// with the same names elsewhere (`<total>` under BAR1, a `<gpu_uuid>` in processes).
    const LOG: &str = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
	<timestamp>Mon Jan  6 10:00:00 2025</timestamp>
	<driver_version>550.54.15</driver_version>
	<cuda_version>12.4</cuda_version>
	<attached_gpus>2</attached_gpus>
	<gpu id="00000000:18:00.0">
		<product_name>NVIDIA H100 80GB HBM3</product_name>
		<uuid>GPU-aaaaaaaa-0000-4000-8000-000000000000</uuid>
		<minor_number>0</minor_number>
		<pci>
			<pci_bus>18</pci_bus>
			<pci_bus_id>00000000:18:00.0</pci_bus_id>
		</pci>
		<fb_memory_usage>
			<total>81559 MiB</total>
			<reserved>328 MiB</reserved>
			<used>0 MiB</used>
		</fb_memory_usage>
		<bar1_memory_usage>
			<total>131072 MiB</total>
		</bar1_memory_usage>
		<processes>
		</processes>
	</gpu>
	<gpu id="00000000:2A:00.0">
		<uuid>GPU-bbbbbbbb-0000-4000-8000-000000000001</uuid>
		<minor_number>N/A</minor_number>
		<pci>
			<pci_bus_id>00000000:2A:00.0</pci_bus_id>
		</pci>
		<fb_memory_usage>
			<total>81559 MiB</total>
		</fb_memory_usage>
	</gpu>
</nvidia_smi_log>
"#;

    fn gpu(index: u32, uuid: &str, minor: u32, bus: &str) -> Gpu {
        Gpu {
            index,
            uuid: uuid.into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 81559 * MIB,
            pci_bus_id: bus.into(),
            minor,
            numa_node: None,
            local_cpus: None,
            mig: None,
        }
    }

    #[test]
    fn reads_the_documented_elements_of_each_gpu() {
        let log = parse(LOG).unwrap();
        assert_eq!(log.driver_version.as_deref(), Some("550.54.15"));
        assert_eq!(
            log.gpus[0],
            SmiGpu {
                uuid: Some("GPU-aaaaaaaa-0000-4000-8000-000000000000".into()),
                minor: Some("0".into()),
                bus_id: Some("00000000:18:00.0".into()),
                memory_total: Some("81559 MiB".into()),
            }
        );
        assert_eq!(log.gpus[1].minor.as_deref(), Some("N/A"));
        assert_eq!(log.gpus.len(), 2);
    }

    #[test]
    fn another_document_is_not_a_log() {
        assert!(matches!(parse("<html/>"), Err(ParseError::Root(r)) if r == "html"));
        assert!(matches!(parse("<nvidia_smi_log>"), Err(ParseError::Xml(_))));
    }

    #[test]
    fn agreeing_gpus_have_no_differences_and_others_are_named() {
        let log = parse(LOG).unwrap();
        let nvml = [
            gpu(
                0,
                "GPU-AAAAAAAA-0000-4000-8000-000000000000",
                0,
                "0000:18:00.0",
            ),
            gpu(
                1,
                "GPU-bbbbbbbb-0000-4000-8000-000000000001",
                1,
                "00000000:2A:00.0",
            ),
            gpu(
                2,
                "GPU-cccccccc-0000-4000-8000-000000000002",
                2,
                "00000000:3A:00.0",
            ),
        ];
        let rows = compare(&nvml, &log);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].differences().count(), 0, "{:?}", rows[0]);
        let differ: Vec<_> = rows[1].differences().map(|f| f.name).collect();
        assert_eq!(differ, ["minor"], "N/A is no minor number");
        assert_eq!(rows[1].fields[1].nvidia_smi.as_deref(), Some("N/A"));
        assert_eq!(
            rows[2].differences().count(),
            4,
            "a GPU nvidia-smi does not list"
        );
        assert_eq!(rows[2].fields[0].nvidia_smi, None);
    }

    #[test]
    fn a_program_that_is_missing_or_fails_is_a_one_line_error() {
        let err = query(Path::new("/nonexistent/nvidia-smi")).unwrap_err();
        let line = crate::base::message::one_line(&err);
        assert!(
            line.starts_with("running /nonexistent/nvidia-smi -q -x: "),
            "{line}"
        );
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("nvidia-smi");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let line = crate::base::message::one_line(&query_fresh(&fake).unwrap_err());
        assert!(
            line.contains("failed (exit status: 9): NVIDIA-SMI has failed because"),
            "{line}"
        );
        std::fs::write(&fake, format!("#!/bin/sh\ncat <<'EOF'\n{LOG}EOF\n")).unwrap();
        assert_eq!(query_fresh(&fake).unwrap(), parse(LOG).unwrap());
    }

    /// `query` of a script just written: another test's fork may briefly hold it open
    /// for writing (ETXTBSY), which says nothing about the code under test.
    fn query_fresh(program: &Path) -> Result<SmiLog, SmiError> {
        loop {
            match query(program) {
                Err(SmiError::Start { source, .. })
                    if source.raw_os_error() == Some(libc::ETXTBSY) => {}
                other => return other,
            }
        }
    }
}
