//! A result as rows and columns, drawn two ways: a table fitted to the terminal for
//! people, or tab-separated lines with a header for pipes (like `gh`).
//!
//! Fitting never wraps a cell one character per line: ids and times stay whole, the
//! columns marked as shrinkable (an error text, a type name) are cut with `…` to what
//! the width leaves them, in the order they were marked, and when even that is too wide
//! columns leave the table: first those with nothing to show (every cell `-` or empty, an
//! unused "Last error"), then the ones marked as droppable (attempts, a time), so the
//! useful columns are the ones that fit (the tab-separated and JSON forms always have every
//! column). Widths are display widths (a CJK character or an emoji takes two columns), as
//! comfy-table measures them. The width is `$COLUMNS`, else
//! the terminal's, else [`FALLBACK_WIDTH`] (a terminal reporting 0 columns, `script`,
//! many CI runners).

use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, modifiers, presets};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use super::Style;
use icq::redact::escape_for_log;

/// Columns a table is fitted to when the width is unknown.
pub const FALLBACK_WIDTH: u16 = 100;

/// Characters a table spends on borders and padding: one border per column plus one,
/// and a space either side of each cell.
fn chrome(columns: usize) -> usize {
    3 * columns + 1
}

/// One column of a [`Grid`].
#[derive(Debug, Clone)]
pub struct Column {
    header: String,
    /// The narrowest this column may be cut to, when it may be cut at all.
    shrink_to: Option<usize>,
    /// Order in which shrinkable columns give up width (lower first).
    shrink_rank: usize,
    /// Order in which droppable columns leave a table too narrow for them (lower first).
    drop_rank: Option<usize>,
    right: bool,
    /// Cells keep their line breaks (a payload); otherwise only the first line shows.
    multiline: bool,
}

impl Column {
    /// A column that is never cut (ids, times, counts).
    pub fn whole(header: &str) -> Column {
        Column {
            header: header.to_owned(),
            shrink_to: None,
            shrink_rank: 0,
            drop_rank: None,
            right: false,
            multiline: false,
        }
    }

    /// A column cut with `…` when the table would not fit; the lowest `rank` goes first,
    /// never below `min` characters.
    pub fn shrinkable(header: &str, min: usize, rank: usize) -> Column {
        Column {
            shrink_to: Some(min),
            shrink_rank: rank,
            ..Column::whole(header)
        }
    }

    /// Left out of a table too narrow for it, the lowest `rank` first.
    pub fn droppable(mut self, rank: usize) -> Column {
        self.drop_rank = Some(rank);
        self
    }

    /// Right-aligned (numbers).
    pub fn right(mut self) -> Column {
        self.right = true;
        self
    }

    /// Cells keep their line breaks, and long lines wrap at the column's width instead
    /// of being cut.
    pub fn multiline(mut self) -> Column {
        self.multiline = true;
        self
    }
}

/// Rows of text under named columns.
#[derive(Debug, Clone, Default)]
pub struct Grid {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
    /// Header cells drawn as headers in the first column (a field/value listing).
    row_headers: bool,
}

impl Grid {
    /// An empty grid with these columns.
    pub fn new(columns: Vec<Column>) -> Grid {
        Grid {
            columns,
            rows: Vec::new(),
            row_headers: false,
        }
    }

    /// Draws the first column like a header (for `Field | Value` listings).
    pub fn with_row_headers(mut self) -> Grid {
        self.row_headers = true;
        self
    }

    /// Adds one row: the full values (tab-separated output prints them whole).
    pub fn push(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len());
        self.rows.push(cells);
    }

    /// Tab-separated: a header line, then one line per row. Tabs, line breaks and other
    /// control characters inside a value are escaped, so every row is one line.
    pub fn tsv(&self) -> String {
        let line = |cells: Vec<&str>| {
            cells
                .into_iter()
                .map(|c| escape_for_log(c).replace('\t', "\\t"))
                .collect::<Vec<_>>()
                .join("\t")
        };
        let mut out = line(self.columns.iter().map(|c| c.header.as_str()).collect());
        for row in &self.rows {
            out.push('\n');
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }

    /// A table fitted to `width` columns.
    pub fn table(&self, style: &Style, width: usize) -> String {
        let shown: Vec<Vec<Vec<String>>> = self
            .rows
            .iter()
            .map(|row| {
                row.iter()
                    .zip(&self.columns)
                    .map(|(cell, column)| cell_lines(cell, column.multiline))
                    .collect()
            })
            .collect();
        let (limits, keep) = self.fit(&shown, width);
        let mut table = Table::new();
        table
            .load_preset(presets::UTF8_FULL_CONDENSED)
            .apply_modifier(modifiers::UTF8_ROUND_CORNERS)
            .set_content_arrangement(ContentArrangement::Disabled);
        table.set_header(
            self.columns
                .iter()
                .zip(&keep)
                .filter(|(_, keep)| **keep)
                .map(|(c, _)| style.header(&c.header)),
        );
        for row in shown {
            let cells = row
                .into_iter()
                .enumerate()
                .filter(|(i, _)| keep[*i])
                .map(|(i, lines)| {
                    let fitted: Vec<String> = if self.columns[i].multiline {
                        lines
                            .iter()
                            .flat_map(|line| wrap(line, limits[i]))
                            .collect()
                    } else {
                        lines.iter().map(|line| cut(line, limits[i])).collect()
                    };
                    let text = fitted.join("\n");
                    if i == 0 && self.row_headers {
                        style.header(&text)
                    } else if self.columns[i].right {
                        Cell::new(text).set_alignment(CellAlignment::Right)
                    } else {
                        Cell::new(text)
                    }
                });
            table.add_row(cells);
        }
        table.to_string()
    }

    /// The widest each column may be so the table fits `width`, and which columns the
    /// table keeps: shrinkable columns give up width in rank order down to their minimum;
    /// when that is not enough, droppable columns leave in rank order.
    fn fit(&self, shown: &[Vec<Vec<String>>], width: usize) -> (Vec<usize>, Vec<bool>) {
        let content: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, column)| {
                let widest = shown
                    .iter()
                    .flat_map(|row| row[i].iter())
                    .map(|line| line.width())
                    .max()
                    .unwrap_or(0);
                widest.max(column.header.width())
            })
            .collect();
        // Columns with nothing to show go first, then the droppable ones in rank order.
        let empty = |i: usize| {
            !self.rows.is_empty()
                && self
                    .rows
                    .iter()
                    .all(|row| matches!(row[i].trim(), "" | "-"))
        };
        let mut droppable: Vec<usize> = (1..self.columns.len()).filter(|i| empty(*i)).collect();
        let mut marked: Vec<usize> = (0..self.columns.len())
            .filter(|i| self.columns[*i].drop_rank.is_some() && !droppable.contains(i))
            .collect();
        marked.sort_by_key(|i| self.columns[*i].drop_rank);
        droppable.extend(marked);
        let mut keep = vec![true; self.columns.len()];
        let mut dropping = droppable.into_iter();
        loop {
            let (limits, fits) = self.shrink(&content, &keep, width);
            if fits {
                return (limits, keep);
            }
            match dropping.next() {
                Some(i) => keep[i] = false,
                None => return (limits, keep),
            }
        }
    }

    /// Shrinks the kept shrinkable columns to fit `width`; says whether it fits.
    fn shrink(&self, content: &[usize], keep: &[bool], width: usize) -> (Vec<usize>, bool) {
        let mut limits = content.to_vec();
        let total = |limits: &[usize]| {
            let kept: Vec<usize> = (0..limits.len()).filter(|i| keep[*i]).collect();
            kept.iter().map(|i| limits[*i]).sum::<usize>() + chrome(kept.len())
        };
        let mut order: Vec<usize> = (0..self.columns.len())
            .filter(|i| keep[*i] && self.columns[*i].shrink_to.is_some())
            .collect();
        order.sort_by_key(|i| self.columns[*i].shrink_rank);
        for i in order {
            let now = total(&limits);
            if now <= width {
                break;
            }
            let min = self.columns[i]
                .shrink_to
                .unwrap_or(0)
                .max(self.columns[i].header.width())
                .min(limits[i]);
            limits[i] = limits[i].saturating_sub(now - width).max(min);
        }
        let fits = total(&limits) <= width;
        (limits, fits)
    }
}

/// The lines a cell shows: control characters escaped; only the first line unless the
/// column is multi-line (a cut first line ends with `…`).
fn cell_lines(text: &str, multiline: bool) -> Vec<String> {
    let mut lines = text
        .split('\n')
        .map(|l| escape_for_log(l.trim_end_matches('\r')));
    if multiline {
        return lines.collect();
    }
    let first = lines.next().unwrap_or_default();
    if lines.next().is_some() {
        vec![format!("{first}…")]
    } else {
        vec![first]
    }
}

/// `line` in pieces at most `limit` columns wide (a multi-line cell shows everything).
fn wrap(line: &str, limit: usize) -> Vec<String> {
    if line.width() <= limit || limit == 0 {
        return vec![line.to_owned()];
    }
    let mut pieces = vec![String::new()];
    let mut used = 0;
    for c in line.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > limit && used > 0 {
            pieces.push(String::new());
            used = 0;
        }
        if let Some(piece) = pieces.last_mut() {
            piece.push(c);
        }
        used += w;
    }
    pieces
}

/// `line` cut to at most `limit` columns, the last one `…`.
fn cut(line: &str, limit: usize) -> String {
    if line.width() <= limit {
        return line.to_owned();
    }
    let mut kept = String::new();
    let mut used = 0;
    for c in line.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > limit {
            break;
        }
        kept.push(c);
        used += w;
    }
    format!("{}…", kept.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn style() -> Style {
        Style {
            color: false,
            width: None,
            tsv: false,
        }
    }

    fn sample() -> Grid {
        let mut grid = Grid::new(vec![
            Column::whole("Id"),
            Column::shrinkable("Type", 12, 1),
            Column::whole("Attempts").right().droppable(0),
            Column::shrinkable("Last error", 10, 0),
        ]);
        grid.push(vec![
            "0b6f0c9e-8d57-4c1e-9a64-1f2b3c4d5e6f".into(),
            "orders.send_receipt_to_the_customer_by_email".into(),
            "5".into(),
            "connection reset by peer while talking to the mail relay\nsecond line".into(),
        ]);
        grid
    }

    fn widest(text: &str) -> usize {
        text.lines().map(|l| l.width()).max().unwrap_or(0)
    }

    #[test]
    fn tables_fit_every_width_without_wrapping() {
        let grid = sample();
        for width in [80, 100, 200] {
            let table = grid.table(&style(), width);
            assert!(widest(&table) <= width, "{width}:\n{table}");
            // Header, rule, borders and one row: nothing wrapped onto extra lines.
            assert_eq!(table.lines().count(), 5, "{width}:\n{table}");
            assert!(table.contains("0b6f0c9e-8d57-4c1e-9a64-1f2b3c4d5e6f"));
        }
        let narrow = grid.table(&style(), 80);
        assert!(narrow.contains('…'), "{narrow}");
        assert!(narrow.contains("Attempts"), "{narrow}");
        let narrower = grid.table(&style(), 60);
        assert_eq!(narrower.lines().count(), 5, "{narrower}");
        assert!(!narrower.contains("Attempts"), "dropped at 60:\n{narrower}");
        let wide = grid.table(&style(), 200);
        assert!(wide.contains("mail relay…"), "{wide}");
    }

    #[test]
    fn tsv_is_one_line_per_row_with_a_header() {
        let text = sample().tsv();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Id\tType\tAttempts\tLast error");
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].ends_with("mail relay\\nsecond line"),
            "{}",
            lines[1]
        );
        assert_eq!(lines[1].split('\t').count(), 4);
    }

    /// A listing leaves out an error column with nothing in it before its run
    /// time (80 columns) and its attempts (92 columns).
    #[test]
    fn an_empty_column_leaves_before_useful_ones() {
        let mut grid = Grid::new(vec![
            Column::whole("Id"),
            Column::shrinkable("Type", 6, 1),
            Column::whole("State").droppable(1),
            Column::whole("Attempts").right().droppable(0),
            Column::whole("Run at").droppable(2),
            Column::shrinkable("Last error", 10, 0),
        ]);
        for _ in 0..2 {
            grid.push(vec![
                "0b6f0c9e-8d57-4c1e-9a64-1f2b3c4d5e6f".into(),
                "orders.send_receipt".into(),
                "due".into(),
                "0".into(),
                "2026-12-04 15:46:51Z".into(),
                "-".into(),
            ]);
        }
        let table = grid.table(&style(), 80);
        assert!(widest(&table) <= 80, "{table}");
        assert!(table.contains("Run at"), "{table}");
        assert!(table.contains("2026-12-04 15:46:51Z"), "{table}");
        assert!(!table.contains("Last error"), "{table}");
        let table = grid.table(&style(), 92);
        assert!(table.contains("Attempts"), "{table}");
        assert!(table.contains("Run at"), "{table}");
        assert!(!table.contains("Last error"), "{table}");
        // Wide enough for everything: the empty column stays.
        assert!(grid.table(&style(), 200).contains("Last error"));
    }

    /// Display width, not characters: double-width text is fitted as such.
    #[test]
    fn wide_characters_count_twice() {
        let mut grid = Grid::new(vec![
            Column::whole("Id"),
            Column::shrinkable("Last error", 4, 0),
        ]);
        grid.push(vec![
            "0b6f0c9e-8d57-4c1e-9a64-1f2b3c4d5e6f".into(),
            "接続がリセットされました。メールリレーとの通信中に".into(),
        ]);
        for width in [60, 70, 80] {
            let table = grid.table(&style(), width);
            assert!(widest(&table) <= width, "{width}:\n{table}");
            assert_eq!(table.lines().count(), 5, "{width}:\n{table}");
        }
        assert_eq!(cut("接続がリセット", 5), "接続…");
        assert_eq!(wrap("接続がリ", 4), ["接続", "がリ"]);
    }
}
