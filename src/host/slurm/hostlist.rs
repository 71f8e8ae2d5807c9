//! Slurm's hostlist expressions, which gres.conf uses for node names (`node[01-04]`) and
//! device files (`/dev/nvidia[0-3]`): items separated by commas outside brackets, each
//! bracket a comma-separated list of numbers and ranges, zero-padded to the width of a
//! range's first number, expanded in the order written (Slurm keeps that order, and a
//! job's GPU numbers follow it).

/// More names than any node has GPUs or any gres.conf line names nodes: a range beyond
/// this is a typo, not a machine.
pub(super) const MAX_NAMES: usize = 65_536;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("invalid hostlist {list:?}: {reason}")]
    Invalid { list: String, reason: &'static str },
    #[error("hostlist {list:?} names more than {MAX_NAMES} entries")]
    TooLong { list: String },
}

/// Every name `list` stands for, in order.
pub(super) fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let invalid = |reason| HostlistError::Invalid {
        list: list.to_string(),
        reason,
    };
    let mut names = Vec::new();
    for item in split_items(list).map_err(invalid)? {
        if item.is_empty() {
            return Err(invalid("an empty entry"));
        }
        let expanded = expand_item(item).map_err(invalid)?;
        if names.len() + expanded.len() > MAX_NAMES {
            return Err(HostlistError::TooLong {
                list: list.to_string(),
            });
        }
        names.extend(expanded);
    }
    Ok(names)
}

/// The comma-separated items of a list, commas inside brackets kept.
fn split_items(list: &str) -> Result<Vec<&str>, &'static str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("a bracket inside a bracket"),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a ']' without its '['"),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '[' without its ']'");
    }
    items.push(&list[start..]);
    Ok(items)
}

/// One item: text, and for each bracket every number it lists, in order.
fn expand_item(item: &str) -> Result<Vec<String>, &'static str> {
    let Some(open) = item.find('[') else {
        return Ok(vec![item.to_string()]);
    };
    let close = open
        + item[open..]
            .find(']')
            .expect("split_items checked brackets");
    let prefix = &item[..open];
    let numbers = bracket(&item[open + 1..close])?;
    let rests = expand_item(&item[close + 1..])?;
    if numbers.len().saturating_mul(rests.len()) > MAX_NAMES {
        return Err("more entries than any node has");
    }
    Ok(numbers
        .iter()
        .flat_map(|n| rests.iter().map(move |rest| format!("{prefix}{n}{rest}")))
        .collect())
}

/// `0-3,7` or `01-04` as the numbers it lists, each zero-padded as written.
fn bracket(inside: &str) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    for part in inside.split(',') {
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(low) || !digits(high) {
            return Err("a bracket holds something other than numbers and ranges");
        }
        let (from, to): (u32, u32) = (low.parse().unwrap(), high.parse().unwrap());
        if from > to {
            return Err("a range runs backwards");
        }
        if (to - from) as usize >= MAX_NAMES {
            return Err("more entries than any node has");
        }
        out.extend((from..=to).map(|n| format!("{n:0width$}", width = low.len())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_and_lists_stay_in_order() {
        assert_eq!(expand("gpu3").unwrap(), ["gpu3"]);
        assert_eq!(expand("b,a,c").unwrap(), ["b", "a", "c"]);
    }

    #[test]
    fn brackets_expand_ranges_and_lists_in_written_order() {
        assert_eq!(
            expand("/dev/nvidia[0-2]").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]
        );
        assert_eq!(
            expand("/dev/nvidia[3,1-2],/dev/nvidia0").unwrap(),
            [
                "/dev/nvidia3",
                "/dev/nvidia1",
                "/dev/nvidia2",
                "/dev/nvidia0"
            ]
        );
    }

    #[test]
    fn zero_padding_follows_the_first_number() {
        assert_eq!(
            expand("node[08-10]").unwrap(),
            ["node08", "node09", "node10"]
        );
    }

    #[test]
    fn several_brackets_multiply_out() {
        assert_eq!(
            expand("r[1-2]n[1-2].x").unwrap(),
            ["r1n1.x", "r1n2.x", "r2n1.x", "r2n2.x"]
        );
    }

    #[test]
    fn malformed_lists_are_refused_with_the_list_named() {
        for bad in [
            "n[1-",
            "n]1",
            "n[[1]]",
            "n[a-b]",
            "n[3-1]",
            "a,,b",
            "n[]",
            "n[1-999999999]",
        ] {
            let err = expand(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
