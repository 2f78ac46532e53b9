//! Aligned text tables: columns, rows, and the sort keys a live view uses. Below both the typed
//! rows (`rows`, which fill them) and the renderers (`render`, which print them).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Clone, Debug, Default)]
pub struct Table {
    pub caption: Option<String>,
    pub columns: Vec<(String, Align)>,
    pub rows: Vec<Vec<String>>,
    /// Columns a live view can sort by, with each row's key (see `rows::Column::sort`).
    pub sort: Vec<SortCol>,
}

/// A sortable column of a [`Table`]: its index, the key that selects it, and one key per row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SortCol {
    pub column: usize,
    pub hotkey: char,
    pub keys: Vec<f64>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            caption: None,
            columns: columns.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
            rows: Vec::new(),
            sort: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    /// Columns padded to their widest cell (counted in characters), two spaces apart; the last
    /// left-aligned column is not padded, so long paths do not widen every line.
    pub fn render(&self) -> String {
        let n = self.columns.len();
        let mut widths: Vec<usize> = self
            .columns
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(n) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        if let Some(c) = &self.caption {
            out.push_str(c);
            out.push('\n');
        }
        let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
            let mut s = String::new();
            for (i, cell) in cells.enumerate().take(n) {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                match self.columns[i].1 {
                    Align::Right => {
                        s.extend(std::iter::repeat_n(' ', pad));
                        s.push_str(cell);
                    }
                    Align::Left => {
                        s.push_str(cell);
                        if i + 1 < n {
                            s.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&mut self.columns.iter().map(|(h, _)| h.as_str()), &mut out);
        for row in &self.rows {
            line(&mut row.iter().map(|c| c.as_str()), &mut out);
        }
        out
    }
}
