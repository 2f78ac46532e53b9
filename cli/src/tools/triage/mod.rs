//! `tracekit triage`: one command on a sick node. Every collector the registry marks for triage
//! runs at once, in one process, for one window (15 s by default), beside the node checks of
//! [`node`]; then every finding is ranked by harm (time lost per second of wall time first, then
//! rates) and printed in one screen, with what ran and what could not.

use std::{path::PathBuf, time::Duration};

use serde_json::{json, Value};

use crate::{
    engine::{Emitter, Meta, Output, RunOpts, Scope, Window},
    error::Result,
    options::{parse_comm, parse_duration, parse_pid},
    report::{
        findings::{fold, rank, Cause, Finding},
        output::Sink,
        sanitize,
    },
    tools::{self, ToolInfo},
};

mod links;
pub mod node;

use crate::tools::runq_lat as runq;

pub const INFO: ToolInfo = ToolInfo::command(
    "triage",
    "Run it first on a sick node: every collector that can run here, at once, for 15 s, plus the node's own counters (CPU steal, pressure, memory cgroups at their limit, swap, conntrack, backlog drops); prints the findings ranked by harm, each with who, why, the evidence, the fix and the next command. `--output report.md` for an incident channel.",
)
.with_causes(&[CPU_STEAL, PRESSURE]);

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const CPU_STEAL: Cause = Cause::new(
    "cpu-steal",
    "The hypervisor takes CPU time from the node (/proc/stat steal).",
);
pub const PRESSURE: Cause = Cause::new(
    "pressure",
    "Tasks stall on CPU, memory or I/O (/proc/pressure) without a collector naming a process.",
);

const EXAMPLES: &str = "  tracekit triage                                   # 15 s, ranked findings
  tracekit triage --duration 60s --output incident.md   # Markdown to paste in the incident channel
  tracekit triage --json | jq 'select(.type==\"finding\")'";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, "root, or the union of the collectors' capabilities (CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH); collectors that cannot run are listed with the reason and triage goes on."))]
pub struct Args {
    /// How long to watch (humantime).
    #[arg(long, short = 'd', value_parser = parse_duration, default_value = "15s", value_name = "DURATION")]
    pub duration: Duration,

    /// Watch only this process (repeatable; also comma-separated); node checks stay node-wide.
    #[arg(long = "pid", short = 'p', value_parser = parse_pid, value_delimiter = ',', value_name = "PID")]
    pub pids: Vec<u32>,

    /// Watch only tasks whose comm is exactly COMM.
    #[arg(long, value_parser = parse_comm, value_name = "COMM")]
    pub comm: Option<String>,

    /// NDJSON: one `finding` line per finding (ranked), then one `checked` line.
    #[arg(long)]
    pub json: bool,

    /// Write the report to FILE (Markdown when FILE ends in `.md`).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Collectors to run (comma-separated), instead of every one the registry marks for triage.
    #[arg(long, value_delimiter = ',', value_name = "TOOL")]
    pub tools: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let common = crate::options::Common {
        duration: Some(args.duration),
        pids: args.pids.clone(),
        comm: args.comm.clone(),
        json: args.json,
        output: args.output.clone(),
        ..Default::default()
    };
    let sink = tools::preflight(INFO.name, &common)?;
    let scope = Scope {
        pids: args.pids.clone(),
        comm: args.comm.clone(),
        ..Default::default()
    };
    let opts = RunOpts {
        duration: Some(args.duration),
        json: args.json,
        ..Default::default()
    };
    let mut opened = tools::open_many(&args.tools, scope, &opts)?;
    opened.collectors.push(Box::new(node::Node::open()));
    let markdown = args
        .output
        .as_ref()
        .is_some_and(|p| p.extension().is_some_and(|x| x == "md"));
    // The report is written as the run ends, from a queue: a reader that never reads holds
    // tracekit for the output's grace, never in write() with the programs attached.
    sink.pace_stdout();
    let mut emit = Triage {
        sink,
        json: args.json,
        markdown,
        ran: opened.ran.clone(),
        cannot: std::mem::take(&mut opened.cannot),
    };
    tools::run_many(INFO.name, &mut opened, &opts, &mut emit)?;
    Ok(())
}

/// Ranks every collector's findings at the end of the window and writes one report.
struct Triage {
    sink: Sink,
    json: bool,
    markdown: bool,
    ran: Vec<&'static str>,
    cannot: Vec<(&'static str, String)>,
}

/// Triage's judgement of one window's outputs: node checks a collector's finding covers
/// dropped, waits folded into the storms that cause them, causes linked across collectors
/// ([`links`]), the node's CPU steal ranked below the processes that lost time, a service's
/// processes grouped, every finding ranked by harm. `serve` exports
/// the same judgement of each of its windows.
pub fn judge(outs: &[Output]) -> Vec<Finding> {
    let mut f: Vec<Finding> = outs
        .iter()
        .flat_map(|o| o.findings.iter().cloned())
        .collect();
    let all: Vec<crate::report::links::Link> =
        outs.iter().flat_map(|o| o.links.iter().cloned()).collect();
    dedupe(&mut f);
    fold(&mut f);
    links::link_sync_waits(&mut f, &all);
    links::link_drops_to_cpu_waits(&mut f);
    links::link_cpu_waits_to_softirq(&mut f);
    node::rank_steal_below_victims(&mut f);
    crate::report::group::group(&mut f);
    rank(&mut f);
    f
}

/// A node-check finding that a collector's finding covers (same cause and cgroup) is dropped:
/// the collector's names the process and the advice is given once. CPU pressure is covered by
/// runq-lat's saturation finding, which carries the pressure and names the hogs.
fn dedupe(f: &mut Vec<Finding>) {
    let covered: Vec<(Cause, Option<String>)> = f
        .iter()
        .filter(|x| x.tool != "triage")
        .map(|x| (x.cause, x.subject.cgroup.clone()))
        .collect();
    let saturated = covered.iter().any(|(c, _)| *c == runq::CPU_SATURATED);
    f.retain(|x| {
        if x.tool != "triage" {
            return true;
        }
        if saturated && x.cause == PRESSURE && x.subject.name.as_deref() == Some("cpu pressure") {
            return false;
        }
        !covered
            .iter()
            .any(|(c, g)| *c == x.cause && (g.is_none() || *g == x.subject.cgroup))
    });
}

impl Triage {
    fn checked(&self, w: &Window) -> Value {
        let (rss, hwm) = crate::host::proc::self_rss_kib();
        json!({
            "tool": "triage",
            "type": "checked",
            "ran": self.ran,
            "could_not_run": tools::could_not_run(&self.cannot),
            "node_checks": node::Node::checks(),
            "interval_ns": w.elapsed.as_nanos() as u64,
            // tracekit's own memory, its peak after every collector's end-of-window work.
            "rss_kib": rss,
            "rss_peak_kib": hwm,
        })
    }

    fn render_text(&self, w: &Window, f: &[Finding]) -> String {
        let md = self.markdown;
        let mut s = String::new();
        let head = format!(
            "tracekit triage: {:.1} s on Linux {}; ran {}; node checks",
            w.secs(),
            crate::host::read_trim(&crate::host::proc_path("sys/kernel/osrelease"))
                .unwrap_or_default(),
            if self.ran.is_empty() {
                "no collector".to_string()
            } else {
                self.ran.join(", ")
            },
        );
        // Markdown: everything from outside (comm, title, container, paths, the reasons a
        // collector could not run) is made literal, so a title cannot inject HTML or markup.
        let esc = |t: &str| {
            if md {
                sanitize::markdown(t)
            } else {
                t.to_string()
            }
        };
        s.push_str(&if md {
            format!("# {}\n\n", esc(&head))
        } else {
            format!("{head}\n")
        });
        for (t, why) in &self.cannot {
            s.push_str(&format!(
                "{}could not run {}: {}\n",
                if md { "- " } else { "  " },
                esc(t),
                esc(why)
            ));
        }
        s.push('\n');
        if f.is_empty() {
            s.push_str("Nothing abnormal seen: no collector and no node check found anything above its threshold.\n");
        }
        for (i, x) in f.iter().enumerate() {
            let who = match &x.culprit {
                Some(c) => format!(" (culprit: {})", c.text()),
                None => String::new(),
            };
            if md {
                s.push_str(&format!(
                    "{}. **{}** — {}\n   - Fix: {}\n",
                    i + 1,
                    esc(x.cause.as_str()),
                    esc(&format!("{}{who}", x.summary)),
                    esc(&x.advice)
                ));
                if let Some(n) = &x.next {
                    s.push_str(&format!("   - Next: {}\n", sanitize::markdown_code(n)));
                }
                if let Some(n) = why_next(x) {
                    s.push_str(&format!("   - Why: {}\n", sanitize::markdown_code(&n)));
                }
            } else {
                s.push_str(&format!(
                    "{}\n",
                    Finding {
                        summary: format!("[{}] {}{who}", x.cause.as_str(), x.summary),
                        ..x.clone()
                    }
                    .text(&format!("{}. ", i + 1))
                ));
                if let Some(n) = why_next(x) {
                    let pad = " ".repeat(format!("{}. ", i + 1).len());
                    s.push_str(&format!("{pad}Why: {n}\n"));
                }
            }
        }
        let checked = format!(
            "Checked: {}; node: {}.",
            if self.ran.is_empty() {
                "no collector".into()
            } else {
                self.ran.join(", ")
            },
            node::Node::checks().join(", ")
        );
        s.push_str(&if md {
            format!("\n_{}_\n", esc(&checked))
        } else {
            format!("\n{checked}\n")
        });
        s
    }
}

/// Where the whole of a process's time goes, for a finding about a process: `tracekit why`
/// splits its wall time into parts with the culprit of each, the step after any one tool's
/// detail.
fn why_next(f: &Finding) -> Option<String> {
    let pid = f
        .subject
        .pid
        .filter(|_| f.subject.kind == "process" && f.tool != "why")?;
    Some(format!("tracekit why --pid {pid} --duration 10s"))
}

impl Emitter for Triage {
    fn begin(&mut self, metas: &[Meta], opts: &RunOpts) -> Result<bool> {
        if self.json {
            // One meta line for the run, every collector's inside: what attached where, the
            // program ids (to check nothing stays loaded), what each skipped.
            let programs = crate::engine::emit::run_programs(metas);
            let line = json!({
                "tool": "triage",
                "type": "meta",
                "watching": metas.iter().map(|m| m.tool).collect::<Vec<_>>(),
                "could_not_run": tools::could_not_run(&self.cannot),
                "programs": programs,
                "collectors": metas.iter().map(crate::engine::emit::meta_json).collect::<Vec<_>>(),
            });
            return Ok(self.sink.put(&format!("{line}\n"))?);
        }
        {
            use std::io::Write;
            let names: Vec<&str> = metas.iter().map(|m| m.tool).collect();
            let _ = writeln!(
                std::io::stderr(),
                "Triage: watching with {} for {}{}.",
                names.join(", "),
                humantime::format_duration(opts.duration.unwrap_or_default()),
                if self.cannot.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; could not run: {}",
                        self.cannot
                            .iter()
                            .map(|(t, _)| *t)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            );
        }
        Ok(true)
    }

    fn window(&mut self, w: &Window, outs: &[Output]) -> Result<bool> {
        let f = judge(outs);
        let text = if self.json {
            let mut s = String::new();
            for (i, x) in f.iter().enumerate() {
                let mut v = x.json();
                v["tool"] = "triage".into();
                v["type"] = "finding".into();
                v["rank"] = (i + 1).into();
                v["from"] = x.tool.into();
                if let Some(w) = why_next(x) {
                    v["why"] = w.into();
                }
                s.push_str(&v.to_string());
                s.push('\n');
            }
            s.push_str(&self.checked(w).to_string());
            s.push('\n');
            s
        } else {
            self.render_text(w, &f)
        };
        Ok(self.sink.put(&text)?)
    }

    fn sink(&mut self) -> Option<&mut Sink> {
        Some(&mut self.sink)
    }

    /// Findings and the checked line only.
    fn wants_rows(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::findings::{Score, Subject, WINDOW_NS};
    use crate::tools::ctxsw;

    fn storm(pid: u32, vol_per_s: f64) -> Finding {
        Finding::new(
            "ctxsw",
            ctxsw::CTXSW_STORM,
            Subject::process(pid, "pp"),
            Score::RatePerS(vol_per_s * 1.5),
            "pp switched.".into(),
        )
        .evidence(ctxsw::ev::VOLUNTARY_PER_S, vol_per_s)
        .evidence(WINDOW_NS, 6_000_000_000u64)
    }

    fn waited(pid: u32, waits: u64, wait_ns: u64, culprit_ns: u64) -> Finding {
        let mut f = Finding::new(
            "runq-lat",
            runq::RUNQ_DELAY,
            Subject::process(pid, "pp"),
            Score::NsPerS(wait_ns / 6),
            "pp waited.".into(),
        )
        .evidence(runq::ev::WAKE_WAITS, waits)
        .evidence(runq::ev::WAKE_WAIT_TOTAL_NS, wait_ns)
        .evidence(runq::ev::WAKE_P50_NS, 2_177u64)
        .evidence(WINDOW_NS, 6_000_000_000u64);
        if culprit_ns > 0 {
            f.culprit = Some(Subject::process(9, "hog"));
            f = f.evidence(runq::ev::CULPRIT_DELAY_NS, culprit_ns);
        }
        // As runq-lat's findings end: the fold into a storm is its declaration.
        runq::handoffs(f)
    }

    /// The numbers of a ping-pong under triage on this host (99 k waits in 6 s, 1.14 s waited,
    /// 268 ms of it behind a light job): the storm takes the wait and ranks first.
    #[test]
    fn a_storms_own_waits_fold_into_the_storm() {
        let mut f = vec![
            waited(7, 98_998, 1_144_204_474, 268_055_037),
            storm(7, 16_446.7),
            storm(8, 16_847.2),
        ];
        fold(&mut f);
        rank(&mut f);
        assert_eq!(f.len(), 2, "{f:#?}");
        assert_eq!(f[0].cause, ctxsw::CTXSW_STORM);
        assert_eq!(f[0].subject.pid, Some(7));
        assert_eq!(f[0].score, Score::NsPerS(1_144_204_474 / 6));
        assert_eq!(f[0].ev(runq::ev::WAKE_WAITS), Some(98_998.0));
        assert!(
            f[0].summary.contains("waited 1.14s for a CPU (19.1 %"),
            "{}",
            f[0].summary
        );
        assert_eq!(f[1].subject.pid, Some(8));
        assert!(matches!(f[1].score, Score::RatePerS(_)));
    }

    /// CPU pressure is a symptom the saturation finding already states with its hogs: the node
    /// check's pressure finding goes when runq-lat found the node saturated, and stays when not.
    #[test]
    fn cpu_pressure_is_covered_by_the_saturation_finding() {
        let pressure = || {
            Finding::new(
                "triage",
                PRESSURE,
                Subject::named("system", "cpu pressure"),
                Score::RatePerS(45.0),
                "Some tasks were stalled on cpu 45 % of the window.".into(),
            )
        };
        let sat = Finding::new(
            "runq-lat",
            runq::CPU_SATURATED,
            Subject::named("node", "2 CPUs"),
            Score::NsPerS(400_000_000),
            "2 CPUs saturated.".into(),
        );
        let mut f = vec![pressure(), sat];
        dedupe(&mut f);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].cause, runq::CPU_SATURATED);
        let mut alone = vec![pressure(), waited(7, 10, 1_000, 0)];
        dedupe(&mut alone);
        assert_eq!(alone.len(), 2, "{alone:#?}");
    }

    /// A process that a hog holds off the CPU for most of its wait, or whose waits are far
    /// fewer than its switches, or that is in no storm, keeps its run-queue finding.
    #[test]
    fn a_starved_victim_keeps_its_finding() {
        for (mut f, why) in [
            (
                vec![
                    waited(7, 98_998, 1_000_000_000, 600_000_000),
                    storm(7, 16_000.0),
                ],
                "hog",
            ),
            (
                vec![waited(7, 10_000, 1_000_000_000, 0), storm(7, 16_000.0)],
                "few waits",
            ),
            (
                vec![waited(7, 98_998, 1_000_000_000, 0), storm(8, 16_000.0)],
                "other pid",
            ),
        ] {
            fold(&mut f);
            assert_eq!(f.len(), 2, "{why}");
            assert!(f.iter().any(|x| x.cause == runq::RUNQ_DELAY), "{why}");
            assert!(
                f.iter()
                    .all(|x| x.cause != ctxsw::CTXSW_STORM || matches!(x.score, Score::RatePerS(_))),
                "{why}"
            );
        }
    }

    /// A hostile process title and comm reach the Markdown report as text, never as HTML, a
    /// code span or a table cell.
    #[test]
    fn markdown_escapes_names_from_outside() {
        let mut subject = Subject::process(7, sanitize::text(b"ev|l`x`"));
        subject.cmdline = Some("<img src=x onerror=alert(1)>".into());
        subject.container = Some("[c](http://x)".into());
        let who = subject.text();
        let f = Finding::new(
            "fsync-lat",
            crate::tools::fsync_lat::FSYNC,
            subject,
            Score::NsPerS(500_000_000),
            format!("{who} spent 2s of 4s in fsync (50.0 % of the time)."),
        )
        .evidence(WINDOW_NS, 4_000_000_000u64);
        let f = Finding {
            advice: "batch *them*".into(),
            next: Some("tracekit fsync-lat --comm 'ev|l`x`'".into()),
            ..f
        };
        let t = Triage {
            sink: Sink::Stdout,
            json: false,
            markdown: true,
            ran: vec!["fsync-lat"],
            cannot: vec![("io-lat", "no <b>BTF</b>".into())],
        };
        let now = std::time::SystemTime::now();
        let w = Window {
            index: 0,
            start: now,
            end: now,
            elapsed: Duration::from_secs(4),
            last: true,
            interval: false,
            stop: crate::engine::Stop::Duration,
        };
        let md = t.render_text(&w, &[f]);
        assert!(!md.contains('<') && !md.contains('>'), "{md}");
        assert!(md.contains("&lt;img src=x onerror=alert(1)&gt;"), "{md}");
        assert!(md.contains("ev\\|l\\`x\\`"), "{md}");
        assert!(md.contains("\\[c\\](http://x)"), "{md}");
        assert!(md.contains("batch \\*them\\*"), "{md}");
        assert!(md.contains("no &lt;b&gt;BTF&lt;/b&gt;"), "{md}");
        assert!(
            md.contains("   - Next: ``tracekit fsync-lat --comm 'ev|l`x`'``\n"),
            "{md}"
        );
        // The text report is unchanged: names as the terminal escaping left them.
        let text = Triage {
            markdown: false,
            ..t
        }
        .render_text(&w, &[]);
        assert!(!text.contains("&lt;"), "{text}");
    }
}
