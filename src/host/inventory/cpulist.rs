//! The kernel's cpulist notation (`0-15,32-47`), as in sysfs `local_cpulist` and
//! `/sys/devices/system/cpu/online`, and in cgroup `cpuset.cpus`.

/// Parses a cpulist into CPU numbers, ascending; `None` when malformed. An empty list
/// (blank string) is valid and empty, as sysfs writes it for a node without CPUs.
pub(crate) fn parse(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() {
        return Some(Vec::new());
    }
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => (number(part)?, number(part)?),
        };
        if lo > hi {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Only plain decimal digits: `u32::from_str` would also take `+3`, which the kernel does not write.
fn number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Formats CPU numbers (ascending, no duplicates) as a cpulist with ranges.
pub(crate) fn format(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_and_singles() {
        assert_eq!(parse("0-2,5,7-8\n"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse(""), Some(vec![]));
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in ["a", "3-1", "1,,2", "-1", "1-", "+1", "1 2"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn formats_with_ranges() {
        assert_eq!(format(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format(&[]), "");
    }
}
