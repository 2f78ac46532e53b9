//! why's rows: one summary per process (or thread) whose parts add up to its wall-clock time,
//! and one row per part and kind of wait with its occurrences and its culprit.

use probes_common::hist::LatHist;
use serde::Serialize;

use super::classify::Part;
use crate::report::{
    hist,
    render::fmt_ns,
    rows::Column,
    sanitize,
    schema::{Direction::*, Dist, Field, Rows},
    units::ppm,
    who::Id,
};

/// One process's (or thread's) window: `wall_ns` is the time it existed in the window, and the
/// eight parts add up to it.
#[derive(Serialize)]
pub struct SummaryRow {
    #[serde(flatten)]
    pub who: Id,
    /// Threads the row adds up (their wall times add: two threads for 10 s are 20 s).
    pub threads: u64,
    pub wall_ns: u64,
    pub running_ns: u64,
    pub runnable_ns: u64,
    pub storage_ns: u64,
    pub memory_ns: u64,
    pub lock_ns: u64,
    pub network_ns: u64,
    pub sleep_ns: u64,
    pub other_ns: u64,
    /// Runnable, storage, memory and lock time: what it lost to others, parts per million of
    /// its wall time.
    pub harm_ppm: u64,
    /// Its memory cgroup (the findings' subject carries it: a memory part is its limit at work).
    #[serde(skip)]
    pub cgroup: Option<String>,
}

impl crate::report::rows::Row for SummaryRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

impl SummaryRow {
    pub fn new(who: Id, threads: u64, parts: &[u64; 8]) -> SummaryRow {
        let wall: u64 = parts.iter().sum();
        let harm: u64 = Part::ALL
            .iter()
            .zip(parts)
            .filter(|(p, _)| p.harmful())
            .map(|(_, n)| n)
            .sum();
        SummaryRow {
            who,
            threads,
            wall_ns: wall,
            running_ns: parts[0],
            runnable_ns: parts[1],
            storage_ns: parts[2],
            memory_ns: parts[3],
            lock_ns: parts[4],
            network_ns: parts[5],
            sleep_ns: parts[6],
            other_ns: parts[7],
            harm_ppm: ppm(harm, wall as f64),
            cgroup: None,
        }
    }

    pub fn parts(&self) -> [u64; 8] {
        [
            self.running_ns,
            self.runnable_ns,
            self.storage_ns,
            self.memory_ns,
            self.lock_ns,
            self.network_ns,
            self.sleep_ns,
            self.other_ns,
        ]
    }

    pub fn part_ns(&self, p: Part) -> u64 {
        self.parts()[p as usize]
    }

    /// The parts as a bar of `width` characters (largest remainders get the rounding), one
    /// glyph per part.
    pub fn bar(&self, width: usize) -> String {
        let parts = self.parts();
        let wall = self.wall_ns.max(1) as f64;
        let exact: Vec<f64> = parts
            .iter()
            .map(|&n| n as f64 / wall * width as f64)
            .collect();
        let mut cells: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
        let mut left = width.saturating_sub(cells.iter().sum());
        let mut order: Vec<usize> = (0..parts.len()).filter(|&i| parts[i] > 0).collect();
        order.sort_by(|&a, &b| {
            let (fa, fb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
            fb.total_cmp(&fa)
        });
        for i in order {
            if left == 0 {
                break;
            }
            cells[i] += 1;
            left -= 1;
        }
        Part::ALL
            .iter()
            .zip(cells)
            .map(|(p, n)| p.glyph().to_string().repeat(n))
            .collect()
    }
}

const SUMMARY_FIELDS: &[Field] = &[
    Field::level("threads", Neutral),
    Field::count("wall_ns", Neutral),
    Field::count("running_ns", Neutral),
    Field::count("runnable_ns", LowerIsBetter),
    Field::count("storage_ns", LowerIsBetter),
    Field::count("memory_ns", LowerIsBetter),
    Field::count("lock_ns", LowerIsBetter),
    Field::count("network_ns", Neutral),
    Field::count("sleep_ns", Neutral),
    Field::count("other_ns", Neutral),
    Field::level("harm_ppm", LowerIsBetter),
];

/// Per process (or thread): where its wall-clock time went.
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &[],
    fields: &[crate::report::who::ID_FIELDS, SUMMARY_FIELDS],
    dists: &[],
};

fn pct(n: u64, wall: u64) -> String {
    format!("{:.1}", n as f64 * 100.0 / wall.max(1) as f64)
}

pub const SUMMARIES: &[Column<SummaryRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::right("WALL", |r, _| fmt_ns(r.wall_ns)),
    Column::right("RUN%", |r, _| pct(r.running_ns, r.wall_ns)),
    Column::right("RUNQ%", |r, _| pct(r.runnable_ns, r.wall_ns)),
    Column::right("STOR%", |r, _| pct(r.storage_ns, r.wall_ns)),
    Column::right("MEM%", |r, _| pct(r.memory_ns, r.wall_ns)),
    Column::right("LOCK%", |r, _| pct(r.lock_ns, r.wall_ns)),
    Column::right("NET%", |r, _| pct(r.network_ns, r.wall_ns)),
    Column::right("SLEEP%", |r, _| pct(r.sleep_ns, r.wall_ns)),
    Column::right("OTHER%", |r, _| pct(r.other_ns, r.wall_ns)),
    Column::left("WHERE THE TIME WENT", |r, _| format!("|{}|", r.bar(40))),
];

/// The legend of the bar.
pub fn legend() -> String {
    let glyphs: Vec<String> = Part::ALL
        .iter()
        .map(|p| format!("{} {}", p.glyph(), p.name()))
        .collect();
    format!(
        "Bar: {} (40 cells = the row's wall time; WALL adds its threads' times).",
        glyphs.join(", ")
    )
}

/// The statistics of a part's occurrences in its JSON.
const OCC_STATS: &[hist::Stat] = &[hist::Stat::P50Ns, hist::Stat::P99Ns, hist::Stat::MaxNs];

/// One part of one process (or thread), for one kind of wait (`fsync`, `futex`, the wait
/// function): its time in the window, its occurrences, and who ended them most.
#[derive(Serialize)]
pub struct PartRow {
    #[serde(flatten)]
    pub who: Id,
    pub part: &'static str,
    /// What in the part (`fsync`, `direct reclaim`, `after wakeup`, a kernel wait function).
    pub what: String,
    /// Its time in the window (an occurrence that began in an earlier window counts here only
    /// from the window's start).
    pub total_ns: u64,
    /// Parts per million of the row's wall time.
    pub wall_ppm: u64,
    /// Occurrences that ended in the window (whole ones: `p50_ns`, `p99_ns`, `max_ns`).
    pub count: u64,
    #[serde(flatten)]
    pub lat: hist::Keyed,
    /// Who ended most of them: the waker of a block, the task that held the CPU last for a
    /// runnable wait (pid 0: the CPU was idle). Absent when not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_comm: Option<String>,
    /// Its share of the occurrences' time, parts per million.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_ppm: Option<u64>,
    #[serde(skip)]
    pub hist: LatHist,
    #[serde(skip)]
    pub part_enum: Option<Part>,
}

impl crate::report::rows::Row for PartRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

impl PartRow {
    pub fn new(
        who: Id,
        part: Part,
        what: String,
        total_ns: u64,
        wall_ns: u64,
        h: &LatHist,
    ) -> PartRow {
        let s = hist::stats(h);
        PartRow {
            who,
            part: part.name(),
            what,
            total_ns,
            wall_ppm: ppm(total_ns, wall_ns as f64),
            count: s.count,
            lat: hist::Keyed::new("", s, OCC_STATS),
            by_pid: None,
            by_tid: None,
            by_comm: None,
            by_ppm: None,
            hist: *h,
            part_enum: Some(part),
        }
    }

    /// `stress-ng (pid 812)`, or `thread 4712 of this process`.
    pub fn by_text(&self) -> String {
        match (&self.by_comm, self.by_pid, self.by_tid) {
            (_, Some(0), _) => "idle CPU".into(),
            (Some(c), Some(p), Some(t)) if p == self.who.pid && t != p => {
                format!("{} (its own thread {t})", sanitize::text(c.as_bytes()))
            }
            (Some(c), Some(p), Some(t)) if t != p => {
                format!("{} (pid {p}, thread {t})", sanitize::text(c.as_bytes()))
            }
            (Some(c), Some(p), _) => format!("{} (pid {p})", sanitize::text(c.as_bytes())),
            _ => String::new(),
        }
    }
}

const PART_FIELDS: &[Field] = &[
    Field::count("total_ns", LowerIsBetter),
    Field::level("wall_ppm", LowerIsBetter),
    Field::count("count", Neutral),
    Field::stat("p50_ns"),
    Field::stat("p99_ns"),
    Field::stat("max_ns"),
    Field::key("by_pid"),
    Field::key("by_tid"),
    Field::level("by_ppm", Neutral),
];

/// Per process (or thread), part and kind of wait.
pub const PART_ROWS: Rows = Rows {
    kind: "part",
    labels: &["part", "what"],
    fields: &[crate::report::who::ID_FIELDS, PART_FIELDS],
    dists: &[Dist::kept("occurrence")],
};

pub const PARTS: &[Column<PartRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::left("PART", |r, _| r.part.to_string()),
    Column::left("WHAT", |r, _| sanitize::text(r.what.as_bytes())),
    Column::right("TIME", |r, _| fmt_ns(r.total_ns)),
    Column::right("%WALL", |r, _| format!("{:.1}", r.wall_ppm as f64 / 1e4)),
    Column::right("COUNT", |r, _| r.count.to_string()),
    Column::right("P50", |r, _| fmt_ns(r.lat.s.p50_ns)),
    Column::right("P99", |r, _| fmt_ns(r.lat.s.p99_ns)),
    Column::right("MAX", |r, _| fmt_ns(r.lat.s.max_ns)),
    Column::left("MOSTLY ENDED BY", |r, _| match r.by_ppm {
        Some(s) => format!("{} {:.0}%", r.by_text(), s as f64 / 1e4),
        None => "-".into(),
    }),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::who::Title;

    fn row(parts: [u64; 8]) -> SummaryRow {
        SummaryRow::new(
            Id::new(7, 7, false, b"app".to_vec(), Title::default()),
            1,
            &parts,
        )
    }

    #[test]
    fn the_parts_add_up_to_the_wall_time_and_the_bar_to_its_width() {
        let r = row([400, 0, 300, 0, 0, 0, 300, 0]);
        assert_eq!(r.wall_ns, 1000);
        assert_eq!(r.harm_ppm, 300_000);
        let bar = r.bar(40);
        assert_eq!(bar.chars().count(), 40);
        assert_eq!(bar.matches('#').count(), 16);
        assert_eq!(bar.matches('S').count(), 12);
        assert_eq!(bar.matches('.').count(), 12);
        // Rounding: three equal thirds still fill the width.
        let r = row([1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(r.bar(40).chars().count(), 40);
        assert_eq!(row([0; 8]).bar(40), "");
    }
}
