//! The GPU list beside the matrix: `nvidia-smi -L` (index, name, UUID) or the CSV of
//! `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv` (with
//! its header; `nounits` or not; other columns are ignored, and only `index` and `uuid`
//! are required). In `nvidia-smi -L`, the MIG devices indented under a GPU in MIG mode
//! (`  MIG 1g.10gb     Device  0: (UUID: MIG-...)`) are that GPU's instances.

use super::ImportError;

/// What the list says about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Listed {
    pub index: u32,
    pub uuid: String,
    pub name: Option<String>,
    pub memory_bytes: Option<u64>,
    pub pci_bus_id: Option<String>,
    /// The MIG devices listed under it (`nvidia-smi -L` only).
    pub mig: Vec<ListedMig>,
}

/// One `  MIG <profile> Device <n>: (UUID: MIG-...)` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ListedMig {
    pub index: u32,
    pub profile: String,
    pub uuid: String,
}

pub(super) fn parse(text: &str) -> Result<Vec<Listed>, ImportError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l))
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((first_no, first)) = lines.next() else {
        return Ok(Vec::new());
    };
    if first.starts_with("GPU ") {
        let mut listed: Vec<Listed> = Vec::new();
        for (n, l) in std::iter::once((first_no, first)).chain(lines) {
            // MIG devices are listed indented under their GPU.
            if l.starts_with(char::is_whitespace) {
                let mig = dash_l_mig(l).ok_or_else(|| bad_line(n, l))?;
                let parent = listed.last_mut().ok_or_else(|| bad_line(n, l))?;
                parent.mig.push(mig);
            } else {
                listed.push(dash_l(l).ok_or_else(|| bad_line(n, l))?);
            }
        }
        Ok(listed)
    } else {
        let header: Vec<String> = first.split(',').map(|c| c.trim().to_string()).collect();
        let column = |name: &'static str| {
            header
                .iter()
                .position(|h| h == name || h.starts_with(&format!("{name} [")))
        };
        let index = column("index").ok_or(ImportError::MissingColumn("index"))?;
        let uuid = column("uuid").ok_or(ImportError::MissingColumn("uuid"))?;
        let columns = Columns {
            index,
            uuid,
            name: column("name"),
            memory: column("memory.total"),
            bus: column("pci.bus_id"),
        };
        lines
            .map(|(n, l)| csv_row(l, &columns).ok_or_else(|| bad_line(n, l)))
            .collect()
    }
}

fn bad_line(line: usize, text: &str) -> ImportError {
    ImportError::BadListLine {
        line,
        text: text.to_string(),
    }
}

/// `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)`
fn dash_l(line: &str) -> Option<Listed> {
    let (index, rest) = line.strip_prefix("GPU ")?.split_once(": ")?;
    let (name, uuid) = rest.rsplit_once(" (UUID: ")?;
    Some(Listed {
        index: index.trim().parse().ok()?,
        uuid: uuid.strip_suffix(')')?.trim().to_string(),
        name: Some(name.trim().to_string()),
        memory_bytes: None,
        pci_bus_id: None,
        mig: Vec::new(),
    })
}

/// `  MIG 1g.10gb     Device  0: (UUID: MIG-...)`
fn dash_l_mig(line: &str) -> Option<ListedMig> {
    let (profile, rest) = line.trim().strip_prefix("MIG ")?.split_once(" Device ")?;
    let (index, uuid) = rest.split_once(": (UUID: ")?;
    Some(ListedMig {
        index: index.trim().parse().ok()?,
        profile: profile.trim().to_string(),
        uuid: uuid.strip_suffix(')')?.trim().to_string(),
    })
}

struct Columns {
    index: usize,
    uuid: usize,
    name: Option<usize>,
    memory: Option<usize>,
    bus: Option<usize>,
}

fn csv_row(line: &str, c: &Columns) -> Option<Listed> {
    let cells: Vec<&str> = line.split(',').map(str::trim).collect();
    let cell = |i: usize| cells.get(i).copied();
    let text = |i: Option<usize>| i.and_then(cell).filter(|v| !v.is_empty() && *v != "[N/A]");
    let memory_bytes = match text(c.memory) {
        Some(m) => Some(mebibytes(m)?),
        None => None,
    };
    Some(Listed {
        index: cell(c.index)?.parse().ok()?,
        uuid: cell(c.uuid)?.to_string(),
        name: text(c.name).map(str::to_string),
        memory_bytes,
        pci_bus_id: text(c.bus).map(str::to_string),
        mig: Vec::new(),
    })
}

/// `81559 MiB`, or `81559` under a `memory.total [MiB]` header (`nounits`).
fn mebibytes(value: &str) -> Option<u64> {
    let number = value.strip_suffix("MiB").unwrap_or(value).trim();
    number.parse::<u64>().ok().map(|m| m << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_dash_l_with_mig_devices_under_their_gpu() {
        let text = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)\n  MIG 3g.40gb     Device  0: (UUID: MIG-bbbb)\n  MIG 1g.10gb     Device  1: (UUID: MIG-dddd)\nGPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc)\n";
        let list = parse(text).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].index, 1);
        assert_eq!(list[1].uuid, "GPU-cccc");
        assert_eq!(list[1].name.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
        assert!(list[1].mig.is_empty());
        let mig = &list[0].mig;
        assert_eq!(
            mig[1],
            ListedMig {
                index: 1,
                profile: "1g.10gb".into(),
                uuid: "MIG-dddd".into()
            }
        );
        assert_eq!(mig[0].profile, "3g.40gb");
        let err = parse("GPU 0: A (UUID: GPU-a)\n  MIG 1g.10gb Device x\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn reads_query_gpu_csv_with_and_without_units() {
        let text = "index, uuid, name, memory.total [MiB], pci.bus_id\n\
                    0, GPU-aaaa, NVIDIA H100 80GB HBM3, 81559 MiB, 00000000:18:00.0\n";
        let list = parse(text).unwrap();
        assert_eq!(list[0].memory_bytes, Some(81559 << 20));
        assert_eq!(list[0].pci_bus_id.as_deref(), Some("00000000:18:00.0"));
        let nounits = "uuid, index, memory.total [MiB]\nGPU-aaaa, 3, 81559\n";
        let list = parse(nounits).unwrap();
        assert_eq!(
            (list[0].index, list[0].memory_bytes),
            (3, Some(81559 << 20))
        );
        assert_eq!(list[0].name, None);
    }

    #[test]
    fn names_the_bad_line() {
        let err = parse("GPU 0: no uuid here\n").unwrap_err().to_string();
        assert!(
            err.contains("line 1") && err.contains("no uuid here"),
            "{err}"
        );
        let err = parse("name, memory.total\nx, 1\n").unwrap_err().to_string();
        assert!(err.contains("`index`"), "{err}");
        let err = parse("index, uuid\nzero, GPU-a\n").unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
