//! `tracekit ctxsw`: context switches per process (or thread), voluntary and involuntary exactly
//! as the kernel counts them (`nvcsw` / `nivcsw`), CPU migrations, run-queue delay, and who took
//! the CPU on involuntary switches; plus a system line from `/proc/stat` (switches, runnable
//! tasks, steal per CPU). `--top` shows it live.
//!
//! Kernel side: `probes-ebpf/src/sched.rs` (one `sched_switch` program diffing the outgoing
//! task's own counters: `nvcsw`, `nivcsw`, `sched_info.run_delay`, `se.nr_migrations`).

use std::{
    io::IsTerminal,
    time::{Duration, Instant, SystemTime},
};

use serde_json::json;

use crate::{
    engine::{self, Collector, Window},
    host::sysstat::SysStat,
    kernel::loader,
    options::Common,
    report::hist,
    report::render::{fmt_ns, Align, Report, Table},
    report::sanitize,
    tools::{
        self,
        sched::{self, preemptor_name, Row, SchedSession},
        Hook,
    },
};

pub const NAME: &str = "ctxsw";
pub const HOOKS: &[Hook] = sched::HOOKS;
pub const REQUIRES_BTF: bool = sched::REQUIRES_BTF;

const EXAMPLES: &str = "  tracekit ctxsw --duration 10s                     # who switches, voluntary or not, and who preempts whom
  tracekit ctxsw --duration 1m --top 20              # live view of the top 20 (per interval without a terminal)
  tracekit ctxsw --duration 10s --threads --comm postgres --json   # one program's threads, as NDJSON";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, sched::NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Live view refreshed every --interval (default 1s), sorted by switch rate; keys: s/Tab
    /// next sort column, v/i/m/d sort by voluntary/involuntary/migrations/delay, p or space
    /// pause, q or Ctrl-C quit. N limits rows. Without a terminal (or with --json) prints one
    /// table (or JSON set) per interval instead.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "0")]
    pub top: Option<usize>,

    /// Rows shown in the text table, most switches first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Preempting processes shown per row.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub top_preemptors: usize,
}

const PROGRAMS: sched::Programs = sched::Programs {
    switch_btf: "tk_ctxsw_switch",
    switch_raw: "tk_ctxsw_switch_raw",
    free_btf: "tk_ctxsw_free",
    free_raw: "tk_ctxsw_free_raw",
    exec_btf: "tk_ctxsw_exec",
    exec_raw: "tk_ctxsw_exec_raw",
};

struct Ctxsw {
    s: SchedSession,
    common: Common,
    max_rows: usize,
    top_preemptors: usize,
    sys_prev: Option<SysStat>,
    /// tgid → comm of the processes seen in the current interval.
    names: std::collections::HashMap<u32, Vec<u8>>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut common = args.common;
    let live = args.top.is_some()
        && !common.json
        && common.output.is_none()
        && std::io::stdout().is_terminal();
    if args.top.is_some() && common.interval.is_none() {
        common.interval = Some(Duration::from_secs(1));
    }
    let sink = tools::preflight(NAME, &common)?;
    let s = sched::open(loader::CTXSW, &PROGRAMS, &common, true)?;
    let max_rows = match args.top {
        Some(n) if n > 0 => n,
        _ => args.rows,
    };
    let mut tool = Ctxsw {
        s,
        common: common.clone(),
        max_rows,
        top_preemptors: args.top_preemptors,
        sys_prev: SysStat::read().ok(),
        names: Default::default(),
    };
    if live {
        return live_view(&mut tool, args.top.unwrap_or(0));
    }
    tools::announce::<&str, &str>("context switches", &common, &tool.s.session, &[]);
    engine::drive(&common, sink, &mut tool)?;
    Ok(())
}

/// A row with its per-second rates, for the table and the live view.
struct Rated {
    row: Row,
    vol_s: f64,
    invol_s: f64,
    migr_s: f64,
    p50_ns: u64,
    p99_ns: u64,
    waits: u64,
    wait_total_ns: u64,
}

impl Rated {
    fn total_s(&self) -> f64 {
        self.vol_s + self.invol_s
    }
}

/// The system line's figures for one interval.
#[derive(Default)]
struct System {
    /// Every traced switch: the rows' and, without --pid/--comm, those away from the idle
    /// task, which belong to no process but make the total comparable with /proc/stat.
    switches: u64,
    idle_switches: u64,
    /// No --pid/--comm: the total covers the whole system and is comparable with /proc/stat.
    whole_system: bool,
    ctxt_per_s: Option<f64>,
    procs_running: Option<u32>,
    steal_pct: Vec<Option<f64>>,
}

/// One interval, as both the report and the live view show it.
struct Drained {
    rows: Vec<Rated>,
    sys: System,
    stats: Vec<u64>,
}

impl Ctxsw {
    fn interval(&mut self, secs: f64) -> anyhow::Result<Drained> {
        let iv = self.s.drain(self.common.threads)?;
        let now = SysStat::read().ok();
        let mut sys = System::default();
        let unfiltered = self.common.pids.is_empty() && self.common.comm.is_none();
        sys.whole_system = unfiltered;
        sys.idle_switches = if unfiltered {
            iv.stats[probes_common::sched::STAT_IDLE_SWITCHES as usize]
        } else {
            0
        };
        sys.switches = iv.rows.iter().map(Row::switches).sum::<u64>() + sys.idle_switches;
        if let (Some(a), Some(b)) = (&self.sys_prev, &now) {
            sys.ctxt_per_s = Some(b.ctxt.saturating_sub(a.ctxt) as f64 / secs);
            sys.procs_running = b.procs_running;
            sys.steal_pct = b.steal_pct(a);
        }
        if now.is_some() {
            self.sys_prev = now;
        }
        self.names.clear();
        for r in &iv.rows {
            if r.id == r.tgid && r.id != 0 {
                self.names.insert(r.tgid, r.comm.clone());
            }
        }
        let rated = iv
            .rows
            .into_iter()
            .map(|row| {
                let st = hist::stats(&row.waits());
                Rated {
                    vol_s: row.voluntary as f64 / secs,
                    invol_s: row.involuntary as f64 / secs,
                    migr_s: row.migrations as f64 / secs,
                    p50_ns: st.p50_ns,
                    p99_ns: st.p99_ns,
                    waits: st.count,
                    wait_total_ns: st.total_ns,
                    row,
                }
            })
            .collect();
        Ok(Drained {
            rows: rated,
            sys,
            stats: iv.stats.to_vec(),
        })
    }

    /// A preemptor's name: its own row's comm when it switched in this interval (it may have
    /// exited since), else /proc.
    fn name_of(&self, tgid: u32) -> Vec<u8> {
        match self.names.get(&tgid) {
            Some(c) => c.clone(),
            None => preemptor_name(tgid),
        }
    }

    fn preemptors_text(&self, r: &Row) -> String {
        r.preemptors
            .iter()
            .take(self.top_preemptors)
            .map(|(p, n)| format!("{}({p})×{n}", sanitize::text(&self.name_of(*p))))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The system line, the same in the report and the live view.
fn system_text(sys: &System, secs: f64) -> String {
    let traced_per_s = sys.switches as f64 / secs;
    let steal: Vec<String> = sys
        .steal_pct
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            Some(p) => format!("cpu{i} {p:.1}%"),
            None => format!("cpu{i} -"),
        })
        .collect();
    let idle = if sys.whole_system {
        format!(
            " ({:.0}/s away from the idle task)",
            sys.idle_switches as f64 / secs
        )
    } else {
        " (in scope)".to_string()
    };
    format!(
        "system: {traced_per_s:.0} switches/s traced{idle}, /proc/stat ctxt {}/s; runnable tasks {}; steal {}",
        sys.ctxt_per_s
            .map(|c| format!("{c:.0}"))
            .unwrap_or_else(|| "?".into()),
        sys.procs_running
            .map(|r| r.to_string())
            .unwrap_or_else(|| "?".into()),
        if steal.is_empty() {
            "not reported".to_string()
        } else {
            steal.join(", ")
        }
    )
}

/// Sort orders of the table and the live view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SortBy {
    Total,
    Voluntary,
    Involuntary,
    Migrations,
    DelayP99,
}

impl SortBy {
    const ALL: [SortBy; 5] = [
        SortBy::Total,
        SortBy::Voluntary,
        SortBy::Involuntary,
        SortBy::Migrations,
        SortBy::DelayP99,
    ];
    fn column(self) -> usize {
        match self {
            SortBy::Total => 2,
            SortBy::Voluntary => 3,
            SortBy::Involuntary => 4,
            SortBy::Migrations => 5,
            SortBy::DelayP99 => 7,
        }
    }
    fn next(self) -> SortBy {
        let i = SortBy::ALL.iter().position(|s| *s == self).unwrap_or(0);
        SortBy::ALL[(i + 1) % SortBy::ALL.len()]
    }
    fn key(self, r: &Rated) -> f64 {
        match self {
            SortBy::Total => r.total_s(),
            SortBy::Voluntary => r.vol_s,
            SortBy::Involuntary => r.invol_s,
            SortBy::Migrations => r.migr_s,
            SortBy::DelayP99 => r.p99_ns as f64,
        }
    }
}

fn sort_rows(rows: &mut [Rated], by: SortBy) {
    rows.sort_by(|a, b| {
        by.key(b)
            .total_cmp(&by.key(a))
            .then(a.row.id.cmp(&b.row.id))
    });
}

const COLUMNS: [(&str, Align); 9] = [
    ("PID", Align::Right),
    ("COMM", Align::Left),
    ("SW/s", Align::Right),
    ("VOL/s", Align::Right),
    ("INVOL/s", Align::Right),
    ("MIGR/s", Align::Right),
    ("RQ_P50", Align::Right),
    ("RQ_P99", Align::Right),
    ("PREEMPTED_BY", Align::Left),
];

fn cells(t: &Ctxsw, r: &Rated) -> Vec<String> {
    vec![
        r.row.id.to_string(),
        r.row.name_text(),
        format!("{:.1}", r.total_s()),
        format!("{:.1}", r.vol_s),
        format!("{:.1}", r.invol_s),
        format!("{:.1}", r.migr_s),
        if r.waits > 0 {
            fmt_ns(r.p50_ns)
        } else {
            "-".into()
        },
        if r.waits > 0 {
            fmt_ns(r.p99_ns)
        } else {
            "-".into()
        },
        t.preemptors_text(&r.row),
    ]
}

impl Collector for Ctxsw {
    fn preamble(&self) -> Option<Report> {
        tools::meta_report(
            NAME,
            &self.common,
            &self.s.session,
            json!({"notes": self.s.notes}),
        )
    }

    fn collect(&mut self, w: &Window) -> anyhow::Result<Report> {
        let secs = w.secs();
        let Drained {
            mut rows,
            sys,
            stats: st,
        } = self.interval(secs)?;
        sort_rows(&mut rows, SortBy::Total);
        let switches: u64 = rows.iter().map(|r| r.row.switches()).sum();
        let vol: u64 = rows.iter().map(|r| r.row.voluntary).sum();
        let mut report = Report::default();
        let when = if w.interval {
            format!("interval {} ending {}, ", w.index + 1, w.end_json().0)
        } else {
            String::new()
        };
        report.title = format!(
            "ctxsw: {switches} switches ({vol} voluntary, {} involuntary) in {}; {when}{secs:.2}s ({})",
            switches - vol,
            tools::scope(&self.common),
            w.stop.as_str(),
        );
        report.notes.push(system_text(&sys, secs));
        report.notes.extend(self.s.notes.iter().cloned());
        report.notes.extend(sched::stats_notes(&st));
        let mut cols = COLUMNS;
        if self.common.threads {
            cols[0].0 = "TID";
        }
        let mut t = Table::new(&cols);
        let shown = if self.max_rows == 0 {
            rows.len()
        } else {
            self.max_rows.min(rows.len())
        };
        let (end_text, end_ns) = w.end_json();
        for (pos, r) in rows.iter().enumerate() {
            if pos == shown {
                report.footnotes.push(format!(
                    "{} more row(s) with fewer switches not shown (--rows 0 shows all)",
                    rows.len() - shown
                ));
            }
            if pos < shown {
                t.push(cells(self, r));
                report.hists.push((
                    format!("runq[{} {}]", r.row.id, sanitize::text(&r.row.comm)),
                    r.row.waits(),
                ));
            }
            let mut line = json!({
                "tool": NAME,
                "type": "summary",
                "pid": if self.common.threads { r.row.tgid } else { r.row.id },
                "voluntary": r.row.voluntary,
                "involuntary": r.row.involuntary,
                "migrations": r.row.migrations,
                "switches_per_s": per_s(r.total_s()),
                "voluntary_per_s": per_s(r.vol_s),
                "involuntary_per_s": per_s(r.invol_s),
                "migrations_per_s": per_s(r.migr_s),
                "runq_count": r.waits,
                "runq_total_ns": r.wait_total_ns,
                "runq_p50_ns": r.p50_ns,
                "runq_p99_ns": r.p99_ns,
                "preempted_by": r.row.preemptors.iter().map(|(p, n)| {
                    sanitize::json_with("comm", &self.name_of(*p), json!({"pid": p, "count": n}))
                }).collect::<Vec<_>>(),
                "interval_ns": w.elapsed.as_nanos() as u64,
                "interval_end": end_text,
                "interval_end_ns": end_ns,
            });
            r.row.put_names(&mut line);
            if self.common.threads {
                line["tid"] = json!(r.row.id);
            }
            report.json.push(line);
        }
        if rows.is_empty() {
            report.notes.push("no context switches seen".into());
        }
        report.tables.push(t);
        report.json.push(json!({
            "tool": NAME,
            "type": "system",
            "switches_per_s": per_s(sys.switches as f64 / secs),
            "switches": sys.switches,
            "idle_switches": sys.idle_switches,
            "proc_stat_ctxt_per_s": sys.ctxt_per_s.map(per_s),
            "procs_running": sys.procs_running,
            "steal_ppm": sys.steal_pct.iter().map(|s| s.map(|p| (p * 10_000.0).round() as u64)).collect::<Vec<_>>(),
            "interval_ns": w.elapsed.as_nanos() as u64,
            "interval_end_ns": end_ns,
        }));
        report.json.push(sched::stats_line(NAME, w, &st, switches));
        Ok(report)
    }
}

/// A rate for JSON: a float to the thousandth (a rare event per interval is not 0).
fn per_s(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Restores the terminal however the live view ends (return, error or panic).
struct TermGuard;

impl Drop for TermGuard {
    fn drop(&mut self) {
        use ratatui::crossterm::{execute, terminal};
        let _ = terminal::disable_raw_mode();
        let _ = execute!(
            std::io::stdout(),
            terminal::LeaveAlternateScreen,
            ratatui::crossterm::cursor::Show
        );
    }
}

/// The `--top` live view: redraws every interval; keys change the sort, pause, quit.
fn live_view(t: &mut Ctxsw, limit: usize) -> anyhow::Result<()> {
    use ratatui::{
        crossterm::{
            event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
            execute, terminal,
        },
        layout::{Constraint, Layout},
        style::{Modifier, Style},
        text::Line,
        widgets::{Cell, Paragraph, Row as TRow, Table as TTable},
    };
    terminal::enable_raw_mode()?;
    let _guard = TermGuard;
    execute!(std::io::stdout(), terminal::EnterAlternateScreen)?;
    let mut term =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    let interval = t.common.interval.unwrap_or(Duration::from_secs(1));
    let deadline = t
        .common
        .duration
        .and_then(|d| Instant::now().checked_add(d));
    let mut sort = SortBy::Total;
    let mut paused = false;
    let mut win_start = Instant::now();
    let mut rows: Vec<Rated> = Vec::new();
    let mut header = format!(
        "ctxsw --top: {} ({}); collecting the first {}…",
        tools::scope(&t.common),
        t.s.session.programs_text(),
        humantime::format_duration(interval)
    );
    let mut notes: Vec<String> = Vec::new();
    let mut dirty = true;
    loop {
        if dirty {
            let mut ordered: Vec<&Rated> = rows.iter().collect();
            ordered.sort_by(|a, b| {
                sort.key(b)
                    .total_cmp(&sort.key(a))
                    .then(a.row.id.cmp(&b.row.id))
            });
            let head: Vec<Cell> = COLUMNS
                .iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let name = if i == 0 && t.common.threads {
                        "TID"
                    } else {
                        name
                    };
                    if i == sort.column() {
                        Cell::from(format!("{name}▼"))
                            .style(Style::default().add_modifier(Modifier::REVERSED))
                    } else {
                        Cell::from(name.to_string())
                    }
                })
                .collect();
            let body: Vec<TRow> = ordered
                .iter()
                .take(if limit == 0 { usize::MAX } else { limit })
                .map(|r| TRow::new(cells(t, r)))
                .collect();
            let status = format!(
                "sort: {:?}  [s/Tab] next column  [v/i/m/d] vol/invol/migr/delay  [p] {}  [q] quit{}",
                sort,
                if paused { "resume" } else { "pause" },
                if paused { "   PAUSED" } else { "" }
            );
            term.draw(|f| {
                let mut lines = vec![Line::from(header.clone())];
                lines.extend(notes.iter().map(|n| Line::from(n.clone())));
                let [top, mid, bottom] = Layout::vertical([
                    Constraint::Length(lines.len() as u16),
                    Constraint::Min(3),
                    Constraint::Length(1),
                ])
                .areas(f.area());
                f.render_widget(Paragraph::new(lines), top);
                let widths = [
                    Constraint::Length(8),
                    Constraint::Length(16),
                    Constraint::Length(10),
                    Constraint::Length(10),
                    Constraint::Length(10),
                    Constraint::Length(8),
                    Constraint::Length(9),
                    Constraint::Length(9),
                    Constraint::Min(20),
                ];
                f.render_widget(
                    TTable::new(body, widths).header(
                        TRow::new(head).style(Style::default().add_modifier(Modifier::BOLD)),
                    ),
                    mid,
                );
                f.render_widget(Paragraph::new(status), bottom);
            })?;
            dirty = false;
        }
        // SIGTERM, SIGHUP, or SIGINT from another process: caught since main started.
        if engine::stop_signal().is_some() || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let next = win_start + interval;
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        // Input is waited for with poll(2), not crossterm: when the terminal goes away (a closed
        // tmux pane, a dropped ssh session) no SIGHUP reaches a process in its shell's group,
        // and crossterm's poll and read spin forever on the end-of-file, keeping the programs
        // attached. poll(2) reports the hang-up.
        let mut pfd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a bounded timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as i32) };
        if n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            break;
        }
        let mut quit = false;
        // Every event the input holds: one read may bring several keys.
        while n > 0 && event::poll(Duration::ZERO)? {
            if let Event::Key(k) = event::read()? {
                if k.kind == KeyEventKind::Press {
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => quit = true,
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            quit = true
                        }
                        KeyCode::Char('s') | KeyCode::Tab | KeyCode::Right => sort = sort.next(),
                        KeyCode::Char('t') => sort = SortBy::Total,
                        KeyCode::Char('v') => sort = SortBy::Voluntary,
                        KeyCode::Char('i') => sort = SortBy::Involuntary,
                        KeyCode::Char('m') => sort = SortBy::Migrations,
                        KeyCode::Char('d') => sort = SortBy::DelayP99,
                        KeyCode::Char('p') | KeyCode::Char(' ') => paused = !paused,
                        _ => {}
                    }
                    dirty = true;
                }
            } else {
                dirty = true;
            }
        }
        if quit {
            break;
        }
        if Instant::now() >= next {
            let secs = win_start.elapsed().as_secs_f64().max(1e-9);
            win_start = Instant::now();
            // Always drain, so a pause does not overflow the kernel's maps; only the display
            // stands still.
            let Drained {
                rows: r,
                sys,
                stats: st,
            } = t.interval(secs)?;
            if !paused {
                rows = r;
                header = format!(
                    "ctxsw --top: {} ({}), every {}; {}",
                    tools::scope(&t.common),
                    t.s.session.programs_text(),
                    humantime::format_duration(interval),
                    humantime::format_rfc3339_seconds(SystemTime::now()),
                );
                notes = vec![system_text(&sys, secs)];
                notes.extend(sched::stats_notes(&st));
                dirty = true;
            }
        }
    }
    drop(term);
    drop(_guard);
    Ok(())
}
