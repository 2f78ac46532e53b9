//! What a tool declares beside each kind of row it emits: every number the row's JSON carries
//! (what it is, which way is better), the labels and metrics the exporter makes of it, and the
//! latency distributions it keeps. `serve` exports, `compare` compares and `record` checks rows
//! by these declarations; none of them reads a key name for meaning.
//!
//! A declaration is a `const` [`Rows`] next to the row struct and its columns; the tool lists its
//! declarations in its [`ToolInfo`](crate::tools::ToolInfo), and [`Section::build`] takes the
//! declaration instead of a bare kind string, so a section cannot exist undeclared. A root test
//! (`record::every_number_a_tool_records_is_declared`) fails when a row carries a number its
//! declaration does not name.
//!
//! [`Section::build`]: crate::report::rows::Section::build

use serde::Serialize;

/// Which way is better for a measure (compare's verdict: `worse` or `better`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    LowerIsBetter,
    HigherIsBetter,
    #[default]
    Neutral,
}

/// What a number in a row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Additive over a window (calls, bytes, time summed): compared per second, summed across
    /// the processes a comparison merges, exportable as a counter.
    Count,
    /// A level (a share in ppm, a size): compared as it is, summed across merged processes.
    Level,
    /// A statistic of the window (a percentile, a mean, a rate, a maximum): not additive;
    /// compare takes percentiles from the distributions instead.
    Stat,
    /// A number that tells subjects apart (a CPU, a NUMA node, a device number).
    Id,
    /// A number that is neither a measure nor part of a subject's identity across runs (a pid,
    /// an inode, a setting `compare` reports among the settings).
    Key,
}

/// How the exporter publishes a [`Role::Count`] field: a Prometheus counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    /// Metric name without `_total` (the encoder appends it).
    pub name: &'static str,
    pub help: &'static str,
    /// The field holds nanoseconds, exported as seconds.
    pub ns: bool,
}

/// One number of a row's JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub key: &'static str,
    pub role: Role,
    pub direction: Direction,
    pub export: Option<Export>,
}

impl Field {
    const fn new(key: &'static str, role: Role, direction: Direction) -> Field {
        Field {
            key,
            role,
            direction,
            export: None,
        }
    }

    pub const fn count(key: &'static str, direction: Direction) -> Field {
        Field::new(key, Role::Count, direction)
    }

    pub const fn level(key: &'static str, direction: Direction) -> Field {
        Field::new(key, Role::Level, direction)
    }

    pub const fn stat(key: &'static str) -> Field {
        Field::new(key, Role::Stat, Direction::Neutral)
    }

    pub const fn id(key: &'static str) -> Field {
        Field::new(key, Role::Id, Direction::Neutral)
    }

    pub const fn key(key: &'static str) -> Field {
        Field::new(key, Role::Key, Direction::Neutral)
    }

    /// Exports the field as counter `name` (a field in `_ns` becomes seconds).
    pub const fn export(mut self, name: &'static str, help: &'static str) -> Field {
        self.export = Some(Export {
            name,
            help,
            ns: ends_with(self.key, "_ns"),
        });
        self
    }

    /// The metric name `compare` gives it: `count/s` for counts, the key for levels; `None`
    /// for what is not compared.
    pub fn compared_as(&self) -> Option<String> {
        match self.role {
            Role::Count => Some(format!("{}/s", self.key)),
            Role::Level => Some(self.key.to_string()),
            Role::Stat | Role::Id | Role::Key => None,
        }
    }
}

const fn ends_with(s: &str, suffix: &str) -> bool {
    let (s, x) = (s.as_bytes(), suffix.as_bytes());
    if x.len() > s.len() {
        return false;
    }
    let mut i = 0;
    while i < x.len() {
        if s[s.len() - x.len() + i] != x[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A latency distribution a row keeps (`Section::dists`), by name: compared at p50 and p99
/// (lower is better), exported as a histogram in seconds when `export` names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dist {
    pub name: &'static str,
    /// `(metric name, help)`.
    pub export: Option<(&'static str, &'static str)>,
}

impl Dist {
    pub const fn kept(name: &'static str) -> Dist {
        Dist { name, export: None }
    }

    pub const fn exported(name: &'static str, metric: &'static str, help: &'static str) -> Dist {
        Dist {
            name,
            export: Some((metric, help)),
        }
    }
}

/// One kind of row of one tool: its JSON `"type"` and everything its numbers mean.
#[derive(Debug)]
pub struct Rows {
    /// The JSON `"type"` (`summary`, `device`, …).
    pub kind: &'static str,
    /// Text fields that become exporter labels, besides `comm` and the container's.
    pub labels: &'static [&'static str],
    /// Every number the row's JSON may carry, in groups (shared groups such as
    /// [`who::ID_FIELDS`](crate::report::who::ID_FIELDS) are reused, not repeated).
    pub fields: &'static [&'static [Field]],
    pub dists: &'static [Dist],
}

impl Rows {
    /// Rows that carry no measures anyone consumes (doctor's tables, test rows).
    pub const fn plain(kind: &'static str) -> Rows {
        Rows {
            kind,
            labels: &[],
            fields: &[],
            dists: &[],
        }
    }

    pub fn field(&self, key: &str) -> Option<&'static Field> {
        self.fields
            .iter()
            .flat_map(|g| g.iter())
            .find(|f| f.key == key)
    }

    pub fn all_fields(&self) -> impl Iterator<Item = &'static Field> {
        self.fields.iter().flat_map(|g| g.iter())
    }

    pub fn dist(&self, name: &str) -> Option<&Dist> {
        self.dists.iter().find(|d| d.name == name)
    }

    /// Whether `compare` can call a change of these rows better or worse: a distribution
    /// (lower is better), or a compared count or level declared better one way.
    pub fn judged(&self) -> bool {
        !self.dists.is_empty()
            || self
                .all_fields()
                .any(|f| f.compared_as().is_some() && f.direction != Direction::Neutral)
    }

    /// Whether anything of these rows is exported.
    pub fn exports(&self) -> bool {
        self.all_fields().any(|f| f.export.is_some())
            || self.dists.iter().any(|d| d.export.is_some())
    }
}

/// A series that is not a row's: the `node` line of a recording (CPU split, pressure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSeries {
    /// The key, or its start when it ends in `*` (`psi_*`: every resource's pressure).
    pub key: &'static str,
    pub direction: Direction,
}

impl NodeSeries {
    pub fn matches(&self, key: &str) -> bool {
        match self.key.strip_suffix('*') {
            Some(start) => key.starts_with(start),
            None => key == self.key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_knows_nanoseconds_and_compare_names() {
        let f = Field::count("kernel_run_delay_ns", Direction::LowerIsBetter).export("m", "h");
        assert!(f.export.unwrap().ns);
        assert!(
            !Field::count("count", Direction::Neutral)
                .export("m", "h")
                .export
                .unwrap()
                .ns
        );
        assert_eq!(f.compared_as().as_deref(), Some("kernel_run_delay_ns/s"));
        assert_eq!(
            Field::level("time_ppm", Direction::LowerIsBetter)
                .compared_as()
                .as_deref(),
            Some("time_ppm")
        );
        assert_eq!(Field::stat("p99_ns").compared_as(), None);
        assert_eq!(Field::key("pid").compared_as(), None);
        let n = NodeSeries {
            key: "psi_*",
            direction: Direction::LowerIsBetter,
        };
        assert!(n.matches("psi_io_some_pct") && !n.matches("cpu_idle_pct"));
    }
}
