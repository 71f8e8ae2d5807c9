//! Slurm's gres.conf, as far as gpupin reads it: a node's GPU device files in the order
//! Slurm numbers them. A `MultipleFiles=` line is one GPU with several files: a MIG
//! instance, as Slurm's docs write it, its GPU's `/dev/nvidia<N>` and its two
//! `/dev/nvidia-caps/nvidia-cap<N>`. A job's `SLURM_JOB_GPUS` are positions in that order: the `File=`
//! entries of the `Name=gpu` lines that apply to the node, line after line, each list
//! expanded as written. Not the number in a file's name: under Slurm 22.05, with
//! `File=/dev/nvidia3` on the first line and `/dev/nvidia1,/dev/nvidia0` and
//! `/dev/nvidia2` after it, a job given GPU 0 was allowed only `/dev/nvidia3` by
//! task/cgroup.

use super::hostlist::{self, HostlistError};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GresError {
    #[error("gres.conf line {line}: {text:?} is not KEY=VALUE pairs")]
    Unreadable { line: usize, text: String },
    #[error("gres.conf line {line}")]
    Hostlist {
        line: usize,
        #[source]
        source: HostlistError,
    },
    #[error(
        "gres.conf line {line} sets AutoDetect={value} for node {node}: gpupin maps Slurm's GPU numbers through File= lists; set AutoDetect=off and list each GPU's device file"
    )]
    AutoDetect {
        line: usize,
        value: String,
        node: String,
    },
    #[error(
        "gres.conf line {line} gives node {node} GPUs without File=: gpupin maps Slurm's GPU numbers through File= lists; list each GPU's device file"
    )]
    NoFile { line: usize, node: String },
    #[error("gres.conf line {line} lists {file} a second time for node {node}")]
    Duplicate {
        line: usize,
        file: String,
        node: String,
    },
    #[error(
        "gres.conf line {line} sets both File= and MultipleFiles=: give one (MultipleFiles= for the files of one MIG instance)"
    )]
    FileAndMultipleFiles { line: usize },
}

/// One line: its number (from 1) and its `KEY=VALUE` pairs, keys lowercased (Slurm reads
/// them in any case).
struct Line {
    number: usize,
    pairs: Vec<(String, String)>,
}

impl Line {
    fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the line is for `node`: it names no node, or `node` is in its list.
    fn applies_to(&self, node: &str) -> Result<bool, GresError> {
        let Some(nodes) = self.get("nodename") else {
            return Ok(true);
        };
        let names = hostlist::expand(nodes).map_err(|source| GresError::Hostlist {
            line: self.number,
            source,
        })?;
        Ok(names.iter().any(|n| n == node))
    }
}

/// The GPU device files of `node` in Slurm's order, from gres.conf `text` (one file per
/// GPU: the first file of a MultipleFiles= line stands for it). Only the tests ask for
/// the files alone; the Slurm lookup in `mod.rs` reads `gpu_units`.
#[cfg(test)]
pub(super) fn gpu_files(text: &str, node: &str) -> Result<Vec<String>, GresError> {
    Ok(gpu_units(text, node)?
        .into_iter()
        .filter_map(|files| files.into_iter().next())
        .collect())
}

/// The GPUs of `node` in Slurm's order, each as its device files: one for a `File=`
/// entry, all of a `MultipleFiles=` line (a MIG instance).
pub(super) fn gpu_units(text: &str, node: &str) -> Result<Vec<Vec<String>>, GresError> {
    let lines = parse(text)?;
    refuse_autodetect(&lines, node)?;
    let mut files = Vec::new();
    for line in &lines {
        let is_gpu = line
            .get("name")
            .is_some_and(|n| n.eq_ignore_ascii_case("gpu"));
        if !is_gpu || !line.applies_to(node)? {
            continue;
        }
        let multiple = line.get("multiplefiles");
        if multiple.is_some() && line.get("file").is_some() {
            return Err(GresError::FileAndMultipleFiles { line: line.number });
        }
        let Some(list) = line.get("file").or(multiple) else {
            return Err(GresError::NoFile {
                line: line.number,
                node: node.to_string(),
            });
        };
        let listed = hostlist::expand(list).map_err(|source| GresError::Hostlist {
            line: line.number,
            source,
        })?;
        for file in &listed {
            // Slurm refuses a file listed twice; counting it twice would shift every
            // later number. A GPU's node shared by its MIG instances' lines is no repeat.
            let is_gpu_node = multiple.is_some() && !is_cap_file(file);
            if !is_gpu_node && files.iter().flatten().any(|f: &String| f == file) {
                return Err(GresError::Duplicate {
                    line: line.number,
                    file: file.clone(),
                    node: node.to_string(),
                });
            }
        }
        match multiple {
            Some(_) => files.push(listed),
            None => files.extend(listed.into_iter().map(|f| vec![f])),
        }
    }
    Ok(files)
}

/// Whether a device file is a MIG capability node (`/dev/nvidia-caps/nvidia-cap<N>`).
pub(super) fn is_cap_file(file: &str) -> bool {
    std::path::Path::new(file)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("nvidia-cap"))
}

/// With AutoDetect, Slurm numbers the GPUs NVML finds, which gres.conf does not list. A
/// node's own setting wins over one for every node, as in Slurm.
fn refuse_autodetect(lines: &[Line], node: &str) -> Result<(), GresError> {
    let mut global = None;
    let mut own = None;
    for line in lines {
        let Some(value) = line.get("autodetect") else {
            continue;
        };
        match line.get("nodename") {
            None => global = Some((line.number, value)),
            Some(_) if line.applies_to(node)? => own = Some((line.number, value)),
            Some(_) => {}
        }
    }
    match own.or(global) {
        Some((line, value)) if !value.eq_ignore_ascii_case("off") => Err(GresError::AutoDetect {
            line,
            value: value.to_string(),
            node: node.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Lines with their pairs: `#` starts a comment, a trailing `\` continues a line on the
/// next, values may be double-quoted.
fn parse(text: &str) -> Result<Vec<Line>, GresError> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or_default().trim_end();
        let (number, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        if let Some(head) = content.strip_suffix('\\') {
            joined.push_str(head);
            joined.push(' ');
            pending = Some((number, joined));
            continue;
        }
        joined.push_str(content);
        if joined.trim().is_empty() {
            continue;
        }
        lines.push(pairs(number, &joined)?);
    }
    if let Some((number, joined)) = pending
        && !joined.trim().is_empty()
    {
        lines.push(pairs(number, &joined)?);
    }
    Ok(lines)
}

fn pairs(number: usize, text: &str) -> Result<Line, GresError> {
    let pairs = text
        .split_whitespace()
        .map(|word| match word.split_once('=') {
            Some((k, v)) if !k.is_empty() => Some((k.to_ascii_lowercase(), unquote(v).to_string())),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| GresError::Unreadable {
            line: number,
            text: text.trim().to_string(),
        })?;
    Ok(Line { number, pairs })
}

fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_files_follow_line_order_then_written_order() {
        let conf = "\
# a comment line
AutoDetect=off
NodeName=other[1-3] Name=gpu File=/dev/nvidia[0-7]
NodeName=gpu[01-02] Name=gpu Type=h100 File=/dev/nvidia3   # the first
Name=gpu File=/dev/nvidia[0-2]
NodeName=gpu02 Name=mps Count=100 File=/dev/nvidia[0-3]
";
        assert_eq!(
            gpu_files(conf, "gpu02").unwrap(),
            [
                "/dev/nvidia3",
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidia2"
            ]
        );
        assert_eq!(
            gpu_files(conf, "elsewhere").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"],
            "a line without NodeName is every node's"
        );
        let err = gpu_files(conf, "other2").unwrap_err().to_string();
        assert_eq!(
            err,
            "gres.conf line 5 lists /dev/nvidia0 a second time for node other2"
        );
    }

    #[test]
    fn a_multiple_files_line_is_one_mig_instance() {
        let text = "Name=gpu Type=a100 File=/dev/nvidia1\n\
            Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap[84-85]\n\
            Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap93,/dev/nvidia-caps/nvidia-cap94\n";
        let units = gpu_units(text, "n1").unwrap();
        assert_eq!(units.len(), 3);
        assert_eq!(units[0], ["/dev/nvidia1"]);
        assert_eq!(
            units[1],
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap84",
                "/dev/nvidia-caps/nvidia-cap85"
            ]
        );
        let again =
            format!("{text}Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap84\n");
        assert!(matches!(
            gpu_units(&again, "n1").unwrap_err(),
            GresError::Duplicate { line: 4, .. }
        ));
    }

    #[test]
    fn keys_in_any_case_quotes_and_continued_lines() {
        let conf = "nodename=n1 NAME=GPU \\\n  file=\"/dev/nvidia[4-5]\"\n";
        assert_eq!(
            gpu_files(conf, "n1").unwrap(),
            ["/dev/nvidia4", "/dev/nvidia5"]
        );
    }

    #[test]
    fn autodetect_is_refused_unless_the_node_turns_it_off() {
        let global = "AutoDetect=nvml\nName=gpu File=/dev/nvidia0\n";
        let err = gpu_files(global, "n1").unwrap_err().to_string();
        assert!(
            err.starts_with("gres.conf line 1 sets AutoDetect=nvml for node n1"),
            "{err}"
        );
        let overridden = format!("{global}NodeName=n1 AutoDetect=off\n");
        assert_eq!(gpu_files(&overridden, "n1").unwrap(), ["/dev/nvidia0"]);
        let other_node = "NodeName=n2 AutoDetect=nvml\nName=gpu File=/dev/nvidia0\n";
        assert_eq!(gpu_files(other_node, "n1").unwrap(), ["/dev/nvidia0"]);
    }

    #[test]
    fn gpus_without_files_and_bad_lines_name_the_line() {
        let err = gpu_files("\nName=gpu Count=4\n", "n1")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("gres.conf line 2 gives node n1 GPUs without File="),
            "{err}"
        );
        let err = gpu_files("Include /etc/slurm/more.conf\n", "n1")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            r#"gres.conf line 1: "Include /etc/slurm/more.conf" is not KEY=VALUE pairs"#
        );
        let err = gpu_files("Name=gpu File=/dev/nvidia[1-\n", "n1").unwrap_err();
        let err = crate::base::message::one_line(&err);
        assert!(
            err.starts_with("gres.conf line 1: invalid hostlist"),
            "{err}"
        );
        let err =
            gpu_files("Name=gpu File=/dev/a MultipleFiles=/dev/a,/dev/b\n", "n1").unwrap_err();
        assert_eq!(err, GresError::FileAndMultipleFiles { line: 1 });
    }
}
