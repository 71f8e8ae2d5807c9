//! The text of `nvidia-smi topo -m`: the GPU rows and columns of its matrix, and the CPU
//! and NUMA affinity of each GPU row. NIC rows and columns, the legend, tabs or spaces,
//! the terminal's underline codes around the header and the legacy `SOC` spelling of
//! `SYS` are all accepted.

use super::ImportError;
use crate::model::link::Link;

/// One GPU row: its index (from `GPU<index>`), its links in the order of `Topo::indexes`,
/// and what its affinity columns say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Row {
    pub links: Vec<Link>,
    pub cpus: Option<String>,
    pub numa: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Topo {
    /// GPU indexes in column order.
    pub indexes: Vec<u32>,
    /// One row per index, in the same order.
    pub rows: Vec<Row>,
}

pub(super) fn parse(text: &str) -> Result<Topo, ImportError> {
    let lines: Vec<Vec<String>> = text
        .lines()
        .map(|l| {
            strip_escapes(l)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .take_while(|t: &Vec<String>| t.first().is_none_or(|w| !w.starts_with("Legend")))
        .collect();
    // The header names columns only; every GPU row holds its own `X`.
    let header = lines
        .iter()
        .position(|t| {
            t.first().is_some_and(|w| gpu_index(w).is_some()) && !t.iter().any(|w| w == "X")
        })
        .ok_or(ImportError::NoHeader)?;
    let words = &lines[header];
    let devices = words
        .iter()
        .position(|w| w == "CPU" || w == "NUMA" || w == "GPU")
        .unwrap_or(words.len());
    let titles = words[devices..].join(" ");
    let cpu_column = titles.starts_with("CPU Affinity");
    let numa_column = titles.contains("NUMA Affinity");
    let columns = &words[..devices];
    let gpu_columns: Vec<(usize, u32)> = columns
        .iter()
        .enumerate()
        .filter_map(|(c, w)| gpu_index(w).map(|i| (c, i)))
        .collect();
    let indexes: Vec<u32> = gpu_columns.iter().map(|&(_, i)| i).collect();
    let rows = indexes
        .iter()
        .map(|&index| {
            let name = format!("GPU{index}");
            let words = lines[header + 1..]
                .iter()
                .find(|t| t.first() == Some(&name))
                .ok_or_else(|| ImportError::MissingRow { gpu: name.clone() })?;
            row(&name, words, columns, &gpu_columns, cpu_column, numa_column)
        })
        .collect::<Result<_, _>>()?;
    Ok(Topo { indexes, rows })
}

fn row(
    name: &str,
    words: &[String],
    columns: &[String],
    gpu_columns: &[(usize, u32)],
    cpu_column: bool,
    numa_column: bool,
) -> Result<Row, ImportError> {
    let cells = &words[1..];
    if cells.len() < columns.len() {
        return Err(ImportError::ShortRow {
            gpu: name.to_string(),
            found: cells.len(),
            expected: columns.len(),
        });
    }
    let links = gpu_columns
        .iter()
        .map(|&(c, _)| {
            link(&cells[c]).ok_or_else(|| ImportError::BadCell {
                row: name.to_string(),
                column: columns[c].clone(),
                cell: cells[c].clone(),
            })
        })
        .collect::<Result<_, _>>()?;
    let mut affinity = cells[columns.len()..].iter();
    let cpus = if cpu_column { affinity.next() } else { None };
    let numa = if numa_column { affinity.next() } else { None };
    Ok(Row {
        links,
        cpus: cpus
            .filter(|c| crate::host::inventory::cpulist::parse(c).is_some())
            .cloned(),
        numa: numa.and_then(|n| n.parse().ok()),
    })
}

/// `GPU<index>`, the name of a GPU row or column.
fn gpu_index(word: &str) -> Option<u32> {
    word.strip_prefix("GPU")?.parse().ok()
}

/// A cell of the matrix; `SOC` is what drivers before `NODE` existed called `SYS`.
fn link(cell: &str) -> Option<Link> {
    match cell {
        "SOC" => Some(Link::CrossSocket),
        _ => cell.parse().ok(),
    }
}

/// The line without terminal escape sequences (`ESC [ ... letter`), which nvidia-smi
/// puts around the header to underline it.
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DGX1_OLD: &str = "\
\t\u{1b}[4mGPU0\tGPU1\tGPU2\tmlx5_0\tCPU Affinity\u{1b}[0m
GPU0\t X \tNV1\tSOC\tPIX\t0-19,40-59
GPU1\tNV1\t X \tSOC\tPHB\t0-19,40-59
GPU2\tSOC\tSOC\t X \tSOC\t20-39,60-79
mlx5_0\tPIX\tPHB\tSOC\t X \t

Legend:

  X    = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks
";

    #[test]
    fn reads_an_old_driver_with_soc_a_nic_and_underlined_header() {
        let t = parse(DGX1_OLD).unwrap();
        assert_eq!(t.indexes, [0, 1, 2]);
        assert_eq!(
            t.rows[0].links,
            [Link::SelfLink, Link::NvLink(1), Link::CrossSocket]
        );
        assert_eq!(t.rows[2].cpus.as_deref(), Some("20-39,60-79"));
        assert_eq!(t.rows[2].numa, None);
    }

    #[test]
    fn reads_numa_affinity_and_skips_gpu_numa_id() {
        let text = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
                    GPU0\t X \tNV18\tPXB\t0-51\t0\t\tN/A\n\
                    GPU1\tNV18\t X \tSYS\t52-103\t1\t\tN/A\n\
                    NIC0\tPXB\tSYS\t X \n";
        let t = parse(text).unwrap();
        assert_eq!(t.rows[1].links, [Link::NvLink(18), Link::SelfLink]);
        assert_eq!(t.rows[1].numa, Some(1));
        assert_eq!(t.rows[1].cpus.as_deref(), Some("52-103"));
    }

    #[test]
    fn names_what_is_wrong() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        assert!(err("no matrix here").contains("no GPU columns"));
        assert!(err("\tGPU0\tGPU1\nGPU0\t X \tNV1\n").contains("no row for GPU1"));
        let short = err("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tNV1\t X \n");
        assert!(
            short.contains("row GPU0 has 1 link entries: expected 2"),
            "{short}"
        );
        let bad = err("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNVX\t X \n");
        assert!(bad.contains("\"NVX\""), "{bad}");
    }
}
