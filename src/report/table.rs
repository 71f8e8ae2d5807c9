//! Plain-text tables: left-aligned columns two spaces apart, and cells cut with `…` so
//! that a table fits a width (a terminal's 80 columns) whatever a container was named.

use std::fmt::Write;

pub(super) const ELLIPSIS: char = '…';

/// One cell. `Tail` text (`(shared, 20GiB)`) stays whole when the cell is cut, `keep_end`
/// cells lose their start rather than their end (an image's tag is what tells it apart).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Cell {
    pub text: String,
    pub tail: String,
    pub keep_end: bool,
}

impl Cell {
    pub(super) fn width(&self) -> usize {
        self.text.chars().count() + self.tail.chars().count()
    }

    /// The cell's text in at most `width` characters.
    pub(super) fn fit(&self, width: usize) -> String {
        if self.width() <= width {
            return format!("{}{}", self.text, self.tail);
        }
        let tail = self.tail.chars().count();
        // Room for at least one character and the ellipsis before the tail, or the
        // whole cell is cut as one text.
        if tail + 2 <= width {
            return format!(
                "{}{}",
                cut(&self.text, width - tail, self.keep_end),
                self.tail
            );
        }
        cut(&format!("{}{}", self.text, self.tail), width, self.keep_end)
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell {
            text,
            ..Cell::default()
        }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::from(text.to_string())
    }
}

/// `text` in at most `width` characters, `…` where it was cut.
pub(super) fn cut(text: &str, width: usize, keep_end: bool) -> String {
    let len = text.chars().count();
    if len <= width {
        return text.to_string();
    }
    let keep = width.saturating_sub(1);
    if keep_end {
        std::iter::once(ELLIPSIS)
            .chain(text.chars().skip(len - keep))
            .collect()
    } else {
        text.chars()
            .take(keep)
            .chain(std::iter::once(ELLIPSIS))
            .collect()
    }
}

/// Left-aligned columns separated by two spaces, trailing spaces trimmed: every column
/// as wide as its widest cell.
pub(super) fn table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let cells: Vec<Vec<Cell>> = rows
        .iter()
        .map(|r| r.as_ref().iter().map(|s| Cell::from(s.as_str())).collect())
        .collect();
    fitted(&cells, usize::MAX, &[])
}

/// Like `table`, but when the lines would be longer than `max_width`, the columns in
/// `shrink` (index, narrowest it may get) lose a character at a time, the widest first,
/// until the lines fit or none may shrink further.
pub(super) fn fitted(rows: &[Vec<Cell>], max_width: usize, shrink: &[(usize, usize)]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(Cell::width)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |widths: &[usize]| widths.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
    while line(&widths) > max_width {
        let widest = shrink
            .iter()
            .filter(|(c, min)| widths.get(*c).is_some_and(|w| w > min))
            .max_by_key(|(c, _)| widths[*c]);
        let Some((c, _)) = widest else { break };
        widths[*c] -= 1;
    }
    let mut out = String::new();
    for row in rows {
        let mut text = String::new();
        for (c, cell) in row.iter().enumerate() {
            let _ = write!(text, "{:<w$}  ", cell.fit(widths[c]), w = widths[c]);
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// Columns separated by two spaces, as `gpupin status` prints them; the columns in
/// `right` aligned right (numbers), trailing spaces trimmed.
pub(super) fn aligned(rows: &[Vec<String>], right: &[usize]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let w = widths[c];
            let _ = if right.contains(&c) {
                write!(line, "{cell:>w$}  ")
            } else {
                write!(line, "{cell:<w$}  ")
            };
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// How a row stands out on a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Style {
    Plain,
    Header,
    /// Wants a look: a process started without gpupin.
    Warn,
    /// Wrong: a holder that is gone.
    Bad,
}

impl Style {
    /// The ANSI SGR parameter.
    fn sgr(self) -> Option<&'static str> {
        match self {
            Style::Plain => None,
            Style::Header => Some("1"),
            Style::Warn => Some("33"),
            Style::Bad => Some("31"),
        }
    }
}

/// The lines of `text`, line `i` in `styles[i]` (plain beyond), as ANSI escapes: added
/// after the table is laid out, so that they take no column's width.
pub(super) fn paint(text: &str, styles: &[Style]) -> String {
    let mut out = String::with_capacity(text.len() + 8 * styles.len());
    for (i, line) in text.lines().enumerate() {
        match styles.get(i).and_then(|s| s.sgr()) {
            Some(sgr) if !line.is_empty() => {
                let _ = writeln!(out, "\x1b[{sgr}m{line}\x1b[0m");
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(text: &str, tail: &str, keep_end: bool) -> Cell {
        Cell {
            text: text.into(),
            tail: tail.into(),
            keep_end,
        }
    }

    #[test]
    fn a_cut_cell_keeps_its_tail_and_says_where_it_was_cut() {
        let c = cell("0123456789", " (shared)", false);
        assert_eq!(c.fit(19), "0123456789 (shared)");
        assert_eq!(c.fit(14), "0123… (shared)");
        // No room for text beside the tail: the whole cell is cut.
        assert_eq!(c.fit(10), "012345678…");
        assert_eq!(cell("registry/team/app:v2", "", true).fit(8), "…/app:v2");
    }

    #[test]
    fn the_widest_shrinkable_column_gives_way_first_down_to_its_minimum() {
        let rows = vec![
            vec![
                Cell::from("0"),
                Cell::from("a".repeat(30)),
                Cell::from("b".repeat(10)),
            ],
            vec![Cell::from("1"), Cell::from("x"), Cell::from("y")],
        ];
        let out = fitted(&rows, 30, &[(1, 5), (2, 5)]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.iter().all(|l| l.chars().count() <= 30), "{out}");
        assert!(
            lines[0].starts_with(&format!("0  {}…  ", "a".repeat(14))),
            "{out}"
        );
        // Nothing may shrink further: the lines stay as short as the minimums allow.
        let out = fitted(&rows, 5, &[(1, 5), (2, 5)]);
        assert_eq!(out.lines().next().unwrap(), "0  aaaa…  bbbb…");
    }

    #[test]
    fn painting_wraps_whole_lines_and_leaves_plain_ones() {
        let text = "GPU  PID\n0    42\n1    43\n";
        let painted = paint(text, &[Style::Header, Style::Plain, Style::Warn]);
        assert_eq!(
            painted,
            "\x1b[1mGPU  PID\x1b[0m\n0    42\n\x1b[33m1    43\x1b[0m\n"
        );
        assert_eq!(paint(text, &[]), text);
    }

    #[test]
    fn plain_tables_trim_their_last_column() {
        let rows = vec![
            ["A".to_string(), "BB".into()],
            ["ccc".to_string(), "".into()],
        ];
        assert_eq!(table(&rows), "A    BB\nccc\n");
    }
}
