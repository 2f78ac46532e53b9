//! Typed rows: a tool declares each kind of row once, as a `Serialize` struct plus a column spec,
//! and gets both the text table and the NDJSON lines from it — no row is built twice. The keys
//! every line carries (`tool`, `type`, interval) are added by the engine, in one place.

use probes_common::hist::LatHist;
use serde::Serialize;
use serde_json::Value;

use crate::report::{
    schema::Rows,
    table::{Align, SortCol, Table},
    who,
};

/// What [`Section::build`] needs of a row besides its JSON and its columns: the container it
/// runs in (the CONTAINER column), for rows that name a process. Rows that do not keep the
/// default.
pub trait Row: Serialize {
    fn container(&self) -> Option<&who::InContainer> {
        None
    }
}

/// What a cell may need besides its row.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// Length of the window in seconds (for rates).
    pub secs: f64,
}

/// One text column: its header, alignment and how a row becomes its cell.
pub struct Column<R> {
    pub head: &'static str,
    pub align: Align,
    pub cell: fn(&R, &Ctx) -> String,
    /// A column a live view can sort by: its hotkey and the row's key (larger first).
    pub sort: Option<(char, SortKey<R>)>,
}

/// A sortable column's key of a row (see [`Column::sort`]).
pub type SortKey<R> = fn(&R, &Ctx) -> f64;

// By hand: a derive would require `R: Clone`, but a column only holds a fn pointer.
impl<R> Clone for Column<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R> Copy for Column<R> {}

/// `cols` with the id column (the first) named for what it holds: `TID` per thread, else as
/// declared (`PID`).
pub fn id_columns<R>(cols: &[Column<R>], threads: bool) -> Vec<Column<R>> {
    let mut v = cols.to_vec();
    if threads {
        if let Some(c) = v.first_mut() {
            c.head = "TID";
        }
    }
    v
}

/// How many of `len` rows a table of at most `max` rows (0: all) shows.
pub fn shown(max: usize, len: usize) -> usize {
    if max == 0 {
        len
    } else {
        max.min(len)
    }
}

impl<R> Column<R> {
    pub const fn right(head: &'static str, cell: fn(&R, &Ctx) -> String) -> Column<R> {
        Column {
            head,
            align: Align::Right,
            cell,
            sort: None,
        }
    }

    pub const fn left(head: &'static str, cell: fn(&R, &Ctx) -> String) -> Column<R> {
        Column {
            head,
            align: Align::Left,
            cell,
            sort: None,
        }
    }

    /// Makes the column sortable in a live view: `hotkey` selects it, `key` orders the rows
    /// (largest first).
    pub const fn sort(mut self, hotkey: char, key: fn(&R, &Ctx) -> f64) -> Column<R> {
        self.sort = Some((hotkey, key));
        self
    }
}

/// Rows of one kind, rendered: the text table (first `limit` rows) and every row as JSON.
#[derive(Debug)]
pub struct Section {
    /// The JSON `"type"` of these rows (`summary`, `device`, `cpu`, …): `schema.kind`.
    pub kind: &'static str,
    /// What the rows' numbers are, as the tool declared them.
    pub schema: &'static Rows,
    pub table: Table,
    pub json: Vec<Value>,
    /// Rows left out of the text table by the limit (JSON has them all).
    pub hidden: usize,
    /// Each row's latency distributions by metric (`fsync`, `runq`, …), aligned with `json`;
    /// empty when the tool keeps none. Emitters that need more than the row's percentiles (the
    /// exporter's histograms, recordings) read the full in-kernel buckets here.
    pub dists: Vec<Vec<(&'static str, LatHist)>>,
    /// For `--hist`, what each row shown in the table is called after its distribution's name
    /// (`42 postgres` in `@fsync[42 postgres]`).
    pub labels: Vec<String>,
}

impl Section {
    /// Renders `rows` (already in display order), declared by `schema`, with `columns`;
    /// `limit` 0 shows every row.
    pub fn build<R: Row>(
        schema: &'static Rows,
        rows: &[R],
        columns: &[Column<R>],
        ctx: &Ctx,
        limit: usize,
    ) -> Section {
        let heads: Vec<(&str, Align)> = columns.iter().map(|c| (c.head, c.align)).collect();
        let mut table = Table::new(&heads);
        let shown = if limit == 0 {
            rows.len()
        } else {
            limit.min(rows.len())
        };
        for r in &rows[..shown] {
            table.push(columns.iter().map(|c| (c.cell)(r, ctx)).collect());
        }
        for (i, c) in columns.iter().enumerate() {
            if let Some((hotkey, key)) = c.sort {
                table.sort.push(SortCol {
                    column: i,
                    hotkey,
                    keys: rows[..shown].iter().map(|r| key(r, ctx)).collect(),
                });
            }
        }
        let json: Vec<Value> = rows
            .iter()
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .collect();
        let cells: Vec<Option<String>> = rows[..shown]
            .iter()
            .map(|r| r.container().and_then(who::InContainer::cell))
            .collect();
        add_container_column(&mut table, cells);
        Section {
            kind: schema.kind,
            schema,
            table,
            json,
            hidden: rows.len() - shown,
            dists: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// Attaches each row's distributions (`rows` as given to [`Section::build`]), each named
    /// as the schema declares it, and what the rows shown are called in `--hist` (`label`).
    pub fn with_dists<R>(
        mut self,
        rows: &[R],
        label: impl Fn(&R) -> String,
        dists: impl Fn(&R) -> Vec<(&'static str, LatHist)>,
    ) -> Section {
        self.dists = rows.iter().map(dists).collect();
        self.labels = rows[..self.table.rows.len()].iter().map(label).collect();
        debug_assert!(
            self.dists
                .iter()
                .flatten()
                .all(|(n, _)| self.schema.dist(n).is_some()),
            "{}: a distribution its schema does not declare",
            self.kind
        );
        self
    }

    /// The distributions of row `i` (none when the tool keeps none).
    pub fn dists_of(&self, i: usize) -> &[(&'static str, LatHist)] {
        self.dists.get(i).map_or(&[], Vec::as_slice)
    }

    pub fn caption(mut self, c: impl Into<String>) -> Section {
        self.table.caption = Some(c.into());
        self
    }

    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }
}

/// Adds the CONTAINER column (after COMM, else after the first column) when any row shown runs
/// in a container (rows flatten a [`who::Id`]); a host without containers keeps its tables.
fn add_container_column(table: &mut Table, cells: Vec<Option<String>>) {
    if cells.iter().all(Option::is_none) || table.columns.iter().any(|c| c.0 == "CONTAINER") {
        return;
    }
    let at = table
        .columns
        .iter()
        .position(|c| c.0 == "COMM")
        .map_or(1, |i| i + 1)
        .min(table.columns.len());
    table
        .columns
        .insert(at, ("CONTAINER".to_string(), Align::Left));
    for (row, cell) in table.rows.iter_mut().zip(cells) {
        row.insert(at.min(row.len()), cell.unwrap_or_else(|| "-".to_string()));
    }
    for s in &mut table.sort {
        if s.column >= at {
            s.column += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_ROWS: Rows = Rows::plain("summary");

    #[test]
    fn id_column_and_rows_shown() {
        let cols: &[Column<u32>] = &[
            Column::right("PID", |r, _| r.to_string()),
            Column::right("N", |r, _| r.to_string()),
        ];
        let heads = |t| -> Vec<&str> { id_columns(cols, t).iter().map(|c| c.head).collect() };
        assert_eq!(heads(false), ["PID", "N"]);
        assert_eq!(heads(true), ["TID", "N"]);
        assert_eq!((shown(0, 7), shown(3, 7), shown(10, 7)), (7, 3, 7));
    }

    #[test]
    fn container_column_only_when_a_row_is_in_one() {
        #[derive(Serialize)]
        struct C {
            pid: u32,
            comm: &'static str,
            #[serde(flatten)]
            container: who::InContainer,
        }
        impl Row for C {
            fn container(&self) -> Option<&who::InContainer> {
                Some(&self.container)
            }
        }
        let inc = |c: Option<&str>, pod: Option<&str>, ns: Option<&str>| {
            let mut i = who::InContainer::default();
            i.container = c.map(String::from);
            i.pod = pod.map(String::from);
            i.namespace = ns.map(String::from);
            i
        };
        let cols: &[Column<C>] = &[
            Column::right("PID", |r, _| r.pid.to_string()),
            Column::left("COMM", |r, _| r.comm.to_string()),
            Column::right("N", |_, _| "1".into()).sort('n', |_, _| 1.0),
        ];
        let host = |pid| C {
            pid,
            comm: "sh",
            container: inc(None, None, None),
        };
        let ctx = Ctx { secs: 1.0 };
        let t = Section::build(&TEST_ROWS, &[host(1)], cols, &ctx, 0).table;
        assert_eq!(t.render(), "PID  COMM  N\n  1  sh    1\n");
        let rows = [
            C {
                container: inc(Some("pg-main"), None, None),
                ..host(2)
            },
            C {
                container: inc(Some("nginx"), Some("web-7d9f"), Some("shop")),
                ..host(3)
            },
            host(1),
        ];
        let t = Section::build(&TEST_ROWS, &rows, cols, &ctx, 0).table;
        assert_eq!(
            t.render(),
            "PID  COMM  CONTAINER            N\n  2  sh    pg-main              1\n  3  sh    shop/web-7d9f/nginx  1\n  1  sh    -                    1\n"
        );
        assert_eq!(t.sort[0].column, 3, "sort columns shift past CONTAINER");
    }

    #[derive(Serialize)]
    struct R {
        pid: u32,
        comm: String,
        count: u64,
    }

    impl Row for R {}

    const COLS: &[Column<R>] = &[
        Column::right("PID", |r, _| r.pid.to_string()),
        Column::left("COMM", |r, _| r.comm.clone()),
        Column::right("RATE/s", |r, c| format!("{:.1}", r.count as f64 / c.secs)),
    ];

    #[test]
    fn one_spec_gives_table_and_json() {
        let rows = vec![
            R {
                pid: 1,
                comm: "a".into(),
                count: 10,
            },
            R {
                pid: 22,
                comm: "bb".into(),
                count: 5,
            },
            R {
                pid: 333,
                comm: "c".into(),
                count: 1,
            },
        ];
        let s = Section::build(&TEST_ROWS, &rows, COLS, &Ctx { secs: 2.0 }, 2);
        assert_eq!(s.hidden, 1);
        assert_eq!(s.json.len(), 3);
        assert_eq!(s.json[2]["pid"], 333);
        assert_eq!(s.kind, "summary");
        assert_eq!(
            s.table.render(),
            "PID  COMM  RATE/s\n  1  a        5.0\n 22  bb       2.5\n"
        );
        assert!(s.table.sort.is_empty());
        let sortable = [
            COLS[0],
            COLS[1],
            COLS[2].sort('r', |r, c| r.count as f64 / c.secs),
        ];
        let t = Section::build(&TEST_ROWS, &rows, &sortable, &Ctx { secs: 2.0 }, 2).table;
        assert_eq!(t.sort.len(), 1);
        assert_eq!((t.sort[0].column, t.sort[0].hotkey), (2, 'r'));
        assert_eq!(t.sort[0].keys, [5.0, 2.5]);
        let all = Section::build(&TEST_ROWS, &rows, COLS, &Ctx { secs: 1.0 }, 0);
        assert_eq!(all.hidden, 0);
        assert_eq!(all.table.rows.len(), 3);
    }
}
