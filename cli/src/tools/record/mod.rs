//! `tracekit record`: runs collectors (by default the ones `triage` runs) for a while and writes
//! one file, a `.tkr` recording (see [`format`] and `docs/record-format.md`): per interval every
//! row and its full histograms, plus the node's own series (`sar -u`, `sar -w`, `sar -q`, PSI)
//! and, once, the node settings that explain a difference. `tracekit compare` reads two.

use crate::report::schema::{Direction, NodeSeries};
use std::{path::PathBuf, time::Duration};

use serde_json::{json, Map, Value};

use crate::{
    engine::{Emitter, Meta, Output, RunOpts, Scope, Window},
    error::{Error, Result},
    host::sysstat::SysStat,
    options::{parse_comm, parse_duration, parse_pid},
    report::output::{OutputError, Sink},
    tools::{self, triage::node::Node, ToolInfo},
};

pub mod format;

pub const INFO: ToolInfo = ToolInfo::command(
    "record",
    "Record a run for a before/after comparison: every row and full histogram of the collectors triage runs, per interval, plus the node's CPU split, pressure, context switches and run queue, and its settings (sysctls, THP, I/O schedulers, governor), in one versioned NDJSON file (`.tkr`).",
);

const EXAMPLES: &str = "  tracekit record --duration 60s --output before.tkr     # the collectors triage runs, 1 s intervals
  tracekit record --duration 5m --interval 5s --tools fsync-lat,io-lat --output after.tkr --force";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, "root, or the union of the collectors' capabilities (CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH); collectors that cannot run are listed in the file's header."))]
pub struct Args {
    /// How long to record (humantime).
    #[arg(long, short = 'd', value_parser = parse_duration, default_value = "60s", value_name = "DURATION")]
    pub duration: Duration,

    /// Length of each interval: the samples `compare` tests (humantime).
    #[arg(long, short = 'i', value_parser = parse_duration, default_value = "1s", value_name = "INTERVAL")]
    pub interval: Duration,

    /// Collectors to run (comma-separated), instead of every one triage runs.
    #[arg(long, value_delimiter = ',', value_name = "TOOL")]
    pub tools: Vec<String>,

    /// The recording to write. An existing file is refused unless --force.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: PathBuf,

    /// Replace an existing recording.
    #[arg(long)]
    pub force: bool,

    /// Record only this process (repeatable; also comma-separated); the node series stay
    /// node-wide.
    #[arg(long = "pid", short = 'p', value_parser = parse_pid, value_delimiter = ',', value_name = "PID")]
    pub pids: Vec<u32>,

    /// Record only tasks whose comm is exactly COMM.
    #[arg(long, value_parser = parse_comm, value_name = "COMM")]
    pub comm: Option<String>,

    /// Cap on the distinct keys each collector holds at once, 16 to 1000000 (default from
    /// pid_max); what does not fit is recorded as `[other]`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(16..=1_000_000))]
    pub max_keys: Option<u32>,
}

/// Refuses to replace an existing regular file without `--force` (a recording is evidence).
/// With it the old file is left as it is: the new recording is written beside it ([`Sink`]'s
/// temporary file) and renamed over it once its first interval is in, so a run refused at
/// start (`--tools nosuchtool`, a `--pid` that is gone) or killed before any interval ended
/// costs nothing. Other kinds of target (devices, FIFOs, directories) are left to [`Sink`]'s
/// rules.
fn claim(path: &std::path::Path, force: bool) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() && !force => Err(Error::Usage(format!(
            "{} exists: give --force to replace it, or another name",
            path.display()
        ))),
        _ => Ok(()),
    }
}

pub fn run(args: Args) -> Result<()> {
    crate::host::proc::check_privileges(INFO.name)?;
    claim(&args.output, args.force)?;
    let common = crate::options::Common {
        duration: Some(args.duration),
        // No interval here: it would make the sink append to the target.
        interval: None,
        pids: args.pids.clone(),
        comm: args.comm.clone(),
        json: true,
        output: Some(args.output.clone()),
        ..Default::default()
    };
    // A replacement (temporary file renamed over the target), not an append: see `claim`.
    // Renamed after the first interval and written in place from then on, so a run killed
    // midway still leaves every interval before the kill readable.
    let sink = tools::preflight(INFO.name, &common)?;
    let scope = Scope {
        pids: args.pids.clone(),
        comm: args.comm.clone(),
        max_keys: args.max_keys,
        ..Default::default()
    };
    let opts = RunOpts {
        duration: Some(args.duration),
        interval: Some(args.interval),
        json: true,
        ..Default::default()
    };
    let mut opened = tools::open_many(&args.tools, scope, &opts)?;
    opened.collectors.push(Box::new(Node::open()));
    let mut emit = Recorder {
        sink,
        dest: args.output.clone(),
        placed: None,
        ran: opened.ran.clone(),
        cannot: std::mem::take(&mut opened.cannot),
        tools: Vec::new(),
        stat: SysStat::read().ok(),
        intervals: 0,
        rows: 0,
    };
    let stop = tools::run_many(INFO.name, &mut opened, &opts, &mut emit)?;
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "Recorded {} interval(s), {} row(s) to {} ({}).",
        emit.intervals,
        emit.rows,
        args.output.display(),
        stop.as_str()
    );
    Ok(())
}

/// Writes the recording as the run goes.
struct Recorder {
    sink: Sink,
    dest: PathBuf,
    /// Once the recording has been renamed into place: the (device, inode) it has there, so a
    /// file removed (or its directory) mid-run is an error, not "Recorded 8 interval(s)" of a
    /// recording no one can open.
    placed: Option<(u64, u64)>,
    ran: Vec<&'static str>,
    cannot: Vec<(&'static str, String)>,
    tools: Vec<&'static str>,
    stat: Option<SysStat>,
    intervals: u64,
    rows: u64,
}

/// The `node` line's series and which way is better for each (compare's verdicts).
pub const NODE_SERIES: &[NodeSeries] = {
    use Direction::*;
    const fn n(key: &'static str, direction: Direction) -> NodeSeries {
        NodeSeries { key, direction }
    }
    &[
        n("cpu_user_pct", Neutral),
        n("cpu_system_pct", Neutral),
        n("cpu_iowait_pct", LowerIsBetter),
        n("cpu_steal_pct", LowerIsBetter),
        n("cpu_idle_pct", HigherIsBetter),
        n("ctxsw_per_s", Neutral),
        n("procs_running", LowerIsBetter),
        n("psi_*", LowerIsBetter),
    ]
};

impl Recorder {
    /// The `node` line: CPU split (`sar -u`), context switches (`sar -w`), runnable tasks
    /// (`sar -q`), from /proc/stat deltas; pressure from the node collector's own lines.
    fn node_line(&mut self, w: &Window, node: Option<&Output>) -> Value {
        let mut m = Map::new();
        m.insert("type".into(), "node".into());
        m.insert("i".into(), w.index.into());
        if let (Some(before), Ok(now)) = (&self.stat, SysStat::read()) {
            if let Some(s) = now.split_since(before) {
                for (k, v) in [
                    ("cpu_user_pct", s.user),
                    ("cpu_system_pct", s.system),
                    ("cpu_iowait_pct", s.iowait),
                    ("cpu_steal_pct", s.steal),
                    ("cpu_idle_pct", s.idle),
                ] {
                    m.insert(k.into(), json!(round3(v)));
                }
            }
            let cs = now.ctxt.saturating_sub(before.ctxt) as f64 / w.secs();
            m.insert("ctxsw_per_s".into(), json!(round3(cs)));
            if let Some(r) = now.procs_running {
                m.insert("procs_running".into(), r.into());
            }
            self.stat = Some(now);
        }
        for l in node.map(|o| o.extra_json.as_slice()).unwrap_or_default() {
            if l["check"] != "pressure" {
                continue;
            }
            let res = l["resource"].as_str().unwrap_or("?");
            for (k, key) in [("some", "some_ppm"), ("full", "full_ppm")] {
                if let Some(ppm) = l[key].as_u64() {
                    m.insert(
                        format!("psi_{res}_{k}_pct"),
                        json!(round3(ppm as f64 / 1e4)),
                    );
                }
            }
        }
        Value::Object(m)
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Recorder {
    fn file(&self) -> Option<&std::fs::File> {
        match &self.sink {
            Sink::Replace { file, .. } | Sink::Direct { file, .. } => Some(file),
            Sink::Stdout => None,
        }
    }

    fn lost(&self, why: std::io::Error) -> Error {
        OutputError::Io {
            path: self.dest.clone(),
            source: why,
        }
        .into()
    }

    /// Writes `s`; a write error names the recording (not the temporary file it was first
    /// written as).
    fn put(&mut self, s: &str) -> Result<bool> {
        match self.sink.put(s) {
            Err(OutputError::Io { source, .. }) => Err(self.lost(source)),
            r => Ok(r?),
        }
    }

    /// After the first interval: the recording takes the target's place (fsync, rename), and
    /// is written in place from then on. After each later one: the target still is it.
    fn place(&mut self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let Some(file) = self.file() else {
            return Ok(());
        };
        let ours = file.metadata().map_err(|e| self.lost(e))?;
        let ours = (ours.dev(), ours.ino());
        match self.placed {
            None => {
                // A Direct sink (a device, a FIFO) has nothing to rename and no inode to watch.
                if !matches!(self.sink, Sink::Replace { .. }) {
                    return Ok(());
                }
                self.sink.finish()?;
                self.placed = Some(ours);
            }
            Some(at) => {
                let there = std::fs::symlink_metadata(&self.dest).map(|m| (m.dev(), m.ino()));
                if there.as_ref().ok() != Some(&at) {
                    return Err(self.lost(std::io::Error::other(match there {
                        Err(e) => format!(
                            "it was removed during the run ({e}): the intervals recorded are lost"
                        ),
                        Ok(_) => "another file took its place during the run".into(),
                    })));
                }
            }
        }
        Ok(())
    }
}

impl Emitter for Recorder {
    fn begin(&mut self, metas: &[Meta], opts: &RunOpts) -> Result<bool> {
        self.tools = metas.iter().map(|m| m.tool).collect();
        let now = std::time::SystemTime::now();
        let facts = crate::host::tuning::read();
        let rest = json!({
            "type": "header",
            "tracekit": env!("CARGO_PKG_VERSION"),
            "started": humantime::format_rfc3339_millis(now).to_string(),
            "hostname": crate::host::sysctl("kernel.hostname"),
            "interval_ns": opts.interval.map(|d| d.as_nanos() as u64),
            "duration_ns": opts.duration.map(|d| d.as_nanos() as u64),
            "tools": self.ran,
            "could_not_run": tools::could_not_run(&self.cannot),
            "skipped": metas.iter().flat_map(|m| m.skipped.iter().map(|(h, r)| json!({"tool": m.tool, "hook": h, "reason": r}))).collect::<Vec<_>>(),
            "hist": format::layout_json(),
            "facts": facts,
        });
        // `format` and `version` first, so `head -c 50` identifies a recording.
        let rest = rest.to_string();
        let header = format!(
            "{{\"format\":\"{}\",\"version\":{},{}",
            format::FORMAT,
            format::VERSION,
            &rest[1..]
        );
        let ok = self.put(&format!("{header}\n"))?;
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "Recording {} every {} for {}{}.",
            self.ran.join(", "),
            humantime::format_duration(opts.interval.unwrap_or_default()),
            humantime::format_duration(opts.duration.unwrap_or_default()),
            if self.cannot.is_empty() {
                String::new()
            } else {
                let c: Vec<&str> = self.cannot.iter().map(|(t, _)| *t).collect();
                format!("; could not run: {}", c.join(", "))
            }
        );
        Ok(ok)
    }

    fn window(&mut self, w: &Window, outs: &[Output]) -> Result<bool> {
        let (end, end_ns) = w.end_json();
        let mut s = json!({"type": "interval", "i": w.index, "end": end, "end_ns": end_ns, "secs": w.secs()}).to_string();
        s.push('\n');
        let mut node = None;
        for (out, tool) in outs.iter().zip(&self.tools) {
            if *tool == "node" {
                node = Some(out);
                continue;
            }
            for sec in &out.sections {
                for (j, row) in sec.json.iter().enumerate() {
                    let mut line = json!({"type": "row", "i": w.index, "tool": tool, "kind": sec.kind, "row": row});
                    let d = sec.dists_of(j);
                    if !d.is_empty() {
                        let m: Map<String, Value> = d
                            .iter()
                            .map(|(k, h)| (k.to_string(), format::dist_json(h)))
                            .collect();
                        line["dists"] = Value::Object(m);
                    }
                    s.push_str(&line.to_string());
                    s.push('\n');
                    self.rows += 1;
                }
            }
        }
        s.push_str(&self.node_line(w, node).to_string());
        s.push('\n');
        if w.last {
            s.push_str(
                &json!({"type": "end", "intervals": w.index + 1, "stop": w.stop.as_str()})
                    .to_string(),
            );
            s.push('\n');
        }
        if !self.put(&s)? {
            return Ok(false);
        }
        self.place()?;
        self.intervals += 1;
        Ok(true)
    }

    fn finish(&mut self) -> Result<()> {
        if self.placed.is_none() {
            // A device or FIFO gets what its reader takes at once; its grace is `settle`'s,
            // after the programs are detached.
            return Ok(self.sink.end_run()?);
        }
        // In place already: made durable, and checked to still be there.
        if let Some(file) = self.file() {
            file.sync_all().map_err(|e| self.lost(e))?;
        }
        self.place()
    }

    // `settle` (the default, through the sink): a replacement was completed already (placed,
    // or by `end_run`), so nothing is left but a device's or FIFO's grace.
    fn sink(&mut self) -> Option<&mut Sink> {
        Some(&mut self.sink)
    }
}
