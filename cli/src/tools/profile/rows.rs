//! profile's rows (per process, per function) and its findings.

use crate::report::units::ppm;
use serde::Serialize;

use super::stacks::{label, top, ProcAgg};
use super::symbols::Frame;
use crate::report::{
    findings::{Finding, Score},
    rows::Column,
    sanitize,
    schema::{Direction::*, Field, Rows},
    who::ID_FIELDS,
    who::{Id, Title},
};

/// One process (or thread) in one window.
#[derive(Serialize)]
pub struct ProcRow {
    #[serde(flatten)]
    pub who: Id,
    pub samples: u64,
    /// CPU time the samples stand for, in parts per million of one CPU.
    pub cpu_ppm: u64,
    /// Share of all CPUs' time, parts per million.
    pub all_ppm: u64,
}

impl crate::report::rows::Row for ProcRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

const PROFILE_PROCESS: &[Field] = &[
    Field::count("samples", Neutral),
    Field::level("cpu_ppm", Neutral),
    Field::level("all_ppm", Neutral),
    Field::count("blocked_ns", LowerIsBetter),
    Field::count("blocks", Neutral),
    Field::level("wall_ppm", Neutral),
];

const PROFILE_FUNCTION: &[Field] = &[
    Field::key("line"),
    Field::count("self_samples", Neutral),
    Field::count("total_samples", Neutral),
    Field::level("self_ppm", Neutral),
    Field::level("total_ppm", Neutral),
    Field::level("self_all_ppm", Neutral),
    Field::count("total_ns", LowerIsBetter),
    Field::count("blocks", Neutral),
];

const PROFILE_STACK: &[Field] = &[
    Field::count("blocked_ns", LowerIsBetter),
    Field::count("blocks", Neutral),
];

/// Per process (or thread): CPU samples, or with `--off-cpu` blocked time.
pub const PROCESS_ROWS: Rows = Rows {
    kind: "process",
    labels: &[],
    fields: &[ID_FIELDS, PROFILE_PROCESS],
    dists: &[],
};

/// Top functions by self samples.
pub const FUNCTION_ROWS: Rows = Rows {
    kind: "function",
    labels: &[],
    fields: &[ID_FIELDS, PROFILE_FUNCTION],
    dists: &[],
};

/// Top functions by total samples, or with `--off-cpu` by blocked time.
pub const FUNCTION_TOTAL_ROWS: Rows = Rows {
    kind: "function_total",
    labels: &[],
    fields: &[ID_FIELDS, PROFILE_FUNCTION],
    dists: &[],
};

/// `--off-cpu`: the blocking stacks.
pub const STACK_ROWS: Rows = Rows {
    kind: "stack",
    labels: &[],
    fields: &[ID_FIELDS, PROFILE_STACK],
    dists: &[],
};

pub const PROCS: &[Column<ProcRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::right("SAMPLES", |r, _| r.samples.to_string()),
    Column::right("%CPU", |r, _| format!("{:.1}", r.cpu_ppm as f64 / 1e4)),
    Column::right("%ALL", |r, _| format!("{:.1}", r.all_ppm as f64 / 1e4)),
];

/// One function of one process in one window.
#[derive(Serialize)]
pub struct FnRow {
    #[serde(flatten)]
    pub who: Id,
    pub function: String,
    /// The binary's name; for a Python frame its source file.
    pub module: String,
    /// A Python frame's line (absent for native frames).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Samples with this function innermost.
    pub self_samples: u64,
    /// Samples with this function anywhere on the stack.
    pub total_samples: u64,
    /// Shares of the process's samples, and of all CPUs' time, parts per million.
    pub self_ppm: u64,
    pub total_ppm: u64,
    pub self_all_ppm: u64,
    #[serde(skip)]
    pub label: String,
}

impl crate::report::rows::Row for FnRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

pub const FUNCS: &[Column<FnRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| sanitize::text(&r.who.comm_raw)),
    Column::right("SELF", |r, _| r.self_samples.to_string()),
    Column::right("SELF%", |r, _| format!("{:.1}", r.self_ppm as f64 / 1e4)),
    Column::right("TOTAL", |r, _| r.total_samples.to_string()),
    Column::right("TOTAL%", |r, _| format!("{:.1}", r.total_ppm as f64 / 1e4)),
    Column::right("%ALL", |r, _| format!("{:.1}", r.self_all_ppm as f64 / 1e4)),
    Column::left("FUNCTION", |r, _| r.label.clone()),
];

/// The rows of the functions of `p`: the `n` with the most self samples, then those among the
/// `n` with the most total samples not listed yet (`by_total`: ranked by total instead).
pub fn fn_rows(
    p: &ProcAgg,
    id: u32,
    threads: bool,
    n: usize,
    all: f64,
    by_total: bool,
) -> Vec<FnRow> {
    let ranked = if by_total {
        top(&p.total, n)
    } else {
        top(&p.self_, n)
    };
    // The process's title is on its process row, not repeated on each of its functions.
    let who = Id::new(id, p.tgid, threads, p.comm.clone(), Title::default());
    ranked
        .into_iter()
        .map(|(f, _)| {
            let s = p.self_.get(&f).copied().unwrap_or(0);
            let t = p.total.get(&f).copied().unwrap_or(0);
            FnRow {
                who: who.clone(),
                function: f.function.to_string(),
                module: f.module.to_string(),
                line: (f.line > 0).then_some(f.line),
                self_samples: s,
                total_samples: t,
                self_ppm: ppm(s, p.samples as f64),
                total_ppm: ppm(t, p.samples as f64),
                self_all_ppm: ppm(s, all),
                label: label(&f),
            }
        })
        .collect()
}

pub fn proc_row(
    p: &ProcAgg,
    id: u32,
    threads: bool,
    one_cpu: f64,
    all: f64,
    title: Title,
) -> ProcRow {
    ProcRow {
        who: Id::new(id, p.tgid, threads, p.comm.clone(), title),
        samples: p.samples,
        cpu_ppm: ppm(p.samples, one_cpu),
        all_ppm: ppm(p.samples, all),
    }
}

/// A process worth a finding uses at least this share of one CPU …
const MIN_CPU: f64 = 0.10;
/// … and one function holds at least this share of its samples as self time.
const MIN_SELF_SHARE: f64 = 0.25;
/// Fewer samples than this say too little.
const MIN_SAMPLES: u64 = 20;

/// What is known of a few hot functions: what they are, the usual fix, and whether the
/// function is named by its total samples (a library entry point; not the interpreter loop,
/// which is on every stack of an interpreted program).
fn known(f: &str, module: &str) -> Option<(&'static str, &'static str, bool)> {
    if module == "_json" || f.starts_with("encoder_") {
        return Some((
            "the stdlib JSON encoder",
            "serialise with a faster encoder (orjson, ujson: several times faster), cache serialised responses, or send less",
            true,
        ));
    }
    if f.starts_with("_PyEval_EvalFrame") {
        return Some((
            "the Python interpreter loop",
            "the time is in Python code itself: profile at the Python level (py-spy) or move the hot loop to a compiled extension",
            false,
        ));
    }
    None
}

/// A busy Python process's finding in Python terms: where in the application's code most of
/// its CPU went ("61 % under `save` (app.py:12) → `dumps` (json/__init__.py:231)"), with the
/// native function it ended in when one is known (the C JSON encoder).
fn python_finding(
    tool: &'static str,
    id: u32,
    p: &ProcAgg,
    title: &Title,
    freq: u64,
    secs: f64,
) -> Option<Finding> {
    let ((app, callee), n) = p
        .python
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(k, n)| (k.clone(), *n))?;
    let share = n as f64 / p.samples as f64;
    let cpu = p.samples as f64 / freq as f64 / secs;
    if share < MIN_SELF_SHARE || cpu < MIN_CPU {
        return None;
    }
    let native = top(&p.total, 0)
        .into_iter()
        .find(|(f, _)| f.line == 0 && known(&f.function, &f.module).is_some_and(|k| k.2));
    let subject = Id::new(id, p.tgid, false, p.comm.clone(), title.clone()).subject();
    let at = |f: &Frame| {
        format!(
            "`{}` ({}:{})",
            sanitize::text(f.function.as_bytes()),
            sanitize::text(f.module.as_bytes()),
            f.line
        )
    };
    let path = match &callee {
        Some(c) => format!("{} → {}", at(&app), at(c)),
        None => at(&app),
    };
    let what = native
        .as_ref()
        .and_then(|(f, _)| known(&f.function, &f.module));
    let fname = sanitize::text(app.function.as_bytes());
    let summary = format!(
        "{}: {:.0} % of its CPU under {path}{}; it used {:.0} % of a CPU ({} samples at {freq} Hz).",
        subject.text(),
        share * 100.0,
        match (&native, what) {
            (Some((f, _)), Some(w)) if f.function.starts_with('[') => {
                format!(", in {} ({})", w.0, sanitize::text(f.module.as_bytes()))
            }
            (Some((f, _)), Some(w)) => {
                format!(", in {} (`{}`)", w.0, sanitize::text(f.function.as_bytes()))
            }
            _ => String::new(),
        },
        cpu * 100.0,
        p.samples,
    );
    let advice = match what {
        Some(w) => format!("in `{fname}`: {}", w.1),
        None => {
            format!("make `{fname}` cheaper or call it less: the flame graph shows what it calls")
        }
    };
    Some(hot_finding(
        tool, subject, p, n, freq, secs, summary, advice,
    ))
}

/// A `cpu-hot` finding about `p`, `n` of whose samples the summary names.
#[allow(clippy::too_many_arguments)]
fn hot_finding(
    tool: &'static str,
    subject: crate::report::findings::Subject,
    p: &ProcAgg,
    n: u64,
    freq: u64,
    secs: f64,
    summary: String,
    advice: String,
) -> Finding {
    Finding {
        tool,
        cause: super::CPU_HOT,
        subject,
        culprit: None,
        score: Score::NsPerS((n as f64 / freq as f64 / secs * 1e9) as u64),
        summary,
        evidence: vec![],
        advice,
        next: Some(format!(
            "tracekit profile --pid {} --duration 30s --svg cpu.svg",
            p.tgid
        )),
        fold: None,
        members: Vec::new(),
    }
    .evidence("samples", p.samples)
    .evidence("function_samples", n)
    .evidence("freq_hz", freq)
    .evidence("function_ppm", ppm(n, p.samples as f64))
}

/// One finding per busy process whose CPU goes mostly to one function.
pub fn findings(
    tool: &'static str,
    procs: &[(u32, &ProcAgg, Title)],
    freq: u64,
    secs: f64,
) -> Vec<Finding> {
    let me = std::process::id();
    let mut out = Vec::new();
    for (id, p, title) in procs {
        if p.tgid == me || p.samples < MIN_SAMPLES {
            continue;
        }
        let cpu = p.samples as f64 / freq as f64 / secs;
        // A known costly library function (the JSON encoder) is named by its total samples
        // (it and its callees: with full stacks its work spreads over many leaf functions);
        // otherwise the top function by self samples.
        let library = top(&p.total, 0).into_iter().find(|(f, n)| {
            known(&f.function, &f.module).is_some_and(|k| k.2)
                && *n as f64 >= MIN_SELF_SHARE * p.samples as f64
        });
        let Some((f, n)) = library.or_else(|| top(&p.self_, 1).into_iter().next()) else {
            continue;
        };
        if let Some(found) = python_finding(tool, *id, p, title, freq, secs) {
            out.push(found);
            continue;
        }
        let share = n as f64 / p.samples as f64;
        if cpu < MIN_CPU || share < MIN_SELF_SHARE || f.function.starts_with('[') {
            continue;
        }
        let subject = Id::new(*id, p.tgid, false, p.comm.clone(), title.clone()).subject();
        let what = known(&f.function, &f.module);
        let fname = sanitize::text(f.function.as_bytes());
        let module = sanitize::text(f.module.as_bytes());
        let summary = format!(
            "{}: {:.0} % of its CPU in `{fname}` ({module}){}; it used {:.0} % of a CPU ({} samples at {freq} Hz).",
            subject.text(),
            share * 100.0,
            what.map(|w| format!(", {}", w.0)).unwrap_or_default(),
            cpu * 100.0,
            p.samples,
        );
        let advice = what.map(|w| w.1.to_string()).unwrap_or_else(|| {
            format!("make `{fname}` cheaper or call it less: the flame graph shows who calls it")
        });
        out.push(hot_finding(
            tool, subject, p, n, freq, secs, summary, advice,
        ));
    }
    crate::report::findings::rank(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::stacks::{aggregate, marker, Sample};
    use super::*;

    #[test]
    fn finding_names_the_hot_function_of_a_busy_process() {
        let s = vec![
            Sample {
                id: 812,
                tgid: 812,
                comm: b"python3".to_vec(),
                frames: vec![
                    marker("main", "python3.11"),
                    marker("encoder_listencode_obj", "_json"),
                ],
                count: 410,
            },
            Sample {
                id: 812,
                tgid: 812,
                comm: b"python3".to_vec(),
                frames: vec![marker("main", "python3.11")],
                count: 590,
            },
            Sample {
                id: 9,
                tgid: 9,
                comm: b"idle".to_vec(),
                frames: vec![marker("spin", "x")],
                count: 5,
            },
        ];
        let a = aggregate(&s);
        let procs: Vec<(u32, &ProcAgg, Title)> =
            a.iter().map(|(id, p)| (*id, p, Title::default())).collect();
        let f = findings("profile", &procs, 99, 10.0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].summary.starts_with("python3 (pid 812): 41 % of its CPU in `encoder_listencode_obj` (_json), the stdlib JSON encoder"),
            "{}",
            f[0].summary
        );
        let rows = fn_rows(&a[&812], 812, false, 5, 1980.0, false);
        assert_eq!(rows[0].function, "main");
        assert_eq!(rows[0].self_ppm, 590_000);
        assert_eq!(rows[1].total_ppm, 410_000);
    }
}
