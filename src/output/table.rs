//! Aligned plain-text tables for people, in the manner of `kubectl get` and
//! `systemctl list-units`: upper-case headers, columns padded with spaces,
//! no borders and no colour (so a pipe or a log gets the same bytes).
//!
//! Owns layout only; what goes in the cells is the command's. Cells are
//! passed through `printable`, so a hostile job kind or owner cannot break a
//! row with a newline or hide text behind a control character.

/// Spaces between two columns.
const GAP: &str = "   ";

/// Renders `headers` and `rows` as aligned lines, each ending in `\n`. The
/// last column is not padded (no trailing spaces).
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cells: Vec<Vec<String>> = std::iter::once(headers.iter().map(|h| h.to_string()).collect())
        .chain(
            rows.iter()
                .map(|r| r.iter().map(|c| printable(c)).collect()),
        )
        .collect();
    let mut widths = vec![0; headers.len()];
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count();
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(GAP);
            }
        }
        out.push('\n');
    }
    out
}

/// A cell as one line of printable text: control characters are shown as
/// `\n`, `\t` or `\u{..}` escapes.
pub fn printable(cell: &str) -> String {
    if !cell.chars().any(char::is_control) {
        return cell.to_owned();
    }
    cell.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_the_widest_cell_without_trailing_spaces() {
        let out = render(
            &["KEY", "VALUE"],
            &[
                vec!["queue.lease.reaper_enabled".into(), "true".into()],
                vec!["a".into(), "false".into()],
            ],
        );
        assert_eq!(
            out,
            "KEY                          VALUE\n\
             queue.lease.reaper_enabled   true\n\
             a                            false\n"
        );
    }

    #[test]
    fn a_hostile_cell_stays_on_its_row() {
        let out = render(&["KIND"], &[vec!["evil\nFORGED\u{1b}[31m".into()]]);
        assert_eq!(out, "KIND\nevil\\nFORGED\\u{1b}[31m\n");
    }
}
