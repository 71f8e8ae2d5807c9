//! The checks every refusal must pass: runtimes fold a hook's stderr into a one-line
//! message of their own, so gpupin says no with exit 1 and exactly one line that starts
//! with `gpupin: `.

/// `None` when `stderr` is one line (a final newline allowed, no `\r`) starting with
/// `gpupin: `; otherwise what is wrong with it.
pub fn gpupin_line_problem(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr.split_terminator('\n').collect();
    if lines.len() != 1 || stderr.contains('\r') {
        Some(format!(
            "{} stderr lines, expected one: {stderr:?}",
            lines.len()
        ))
    } else if !lines[0].starts_with("gpupin: ") {
        Some(format!(
            "stderr does not start with \"gpupin: \": {stderr:?}"
        ))
    } else {
        None
    }
}

/// `None` when a failed command failed as a refusal must (exit 1, one `gpupin: ` line);
/// otherwise what is wrong with it.
pub fn refusal_problem(code: Option<i32>, stderr: &str) -> Option<String> {
    if code != Some(1) {
        return Some(format!("exit code {code:?}, expected 1; stderr {stderr:?}"));
    }
    gpupin_line_problem(stderr)
}

#[track_caller]
pub fn assert_one_gpupin_line(stderr: &str, what: &str) {
    if let Some(problem) = gpupin_line_problem(stderr) {
        panic!("{what}: {problem}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gpupin_line_passes() {
        assert_eq!(gpupin_line_problem("gpupin: no GPU free\n"), None);
        assert_eq!(refusal_problem(Some(1), "gpupin: no GPU free"), None);
    }

    #[test]
    fn two_lines_a_carriage_return_or_another_prefix_fail() {
        for stderr in [
            "gpupin: a\nb\n",
            "gpupin: a\n\n",
            "gpupin: a\rb",
            "",
            "\n",
            "error: a\n",
        ] {
            assert!(gpupin_line_problem(stderr).is_some(), "{stderr:?}");
        }
    }

    #[test]
    fn a_refusal_exits_1() {
        assert!(refusal_problem(Some(101), "gpupin: a").is_some());
        assert!(refusal_problem(None, "gpupin: a").is_some());
    }
}
