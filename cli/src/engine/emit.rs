//! Where windows go: the [`Emitter`] the run loop hands each window to. [`Stream`] writes text
//! or NDJSON to stdout or `--output`; the live view (`--top`), `triage`'s ranking and the
//! Prometheus exporter are other emitters of the same loop.

use std::{future::Future, pin::Pin};

use serde_json::{json, Map, Value};

use super::{collector::Meta, scope::RunOpts, Window};
use crate::{
    error::Result,
    report::{
        output::Sink,
        render::{self, Output},
    },
};

/// Receives what the run loop produces.
pub trait Emitter {
    /// Once, after every collector attached. `Ok(false)`: the reader went away, end the run.
    fn begin(&mut self, metas: &[Meta], opts: &RunOpts) -> Result<bool>;
    /// Each window's outputs, one per collector in `begin`'s order.
    fn window(&mut self, w: &Window, outs: &[Output]) -> Result<bool>;
    /// Where the emitter writes, if to a [`Sink`] (the ends of a run below default to it).
    fn sink(&mut self) -> Option<&mut Sink> {
        None
    }
    /// After the last window, with the programs still attached: must not wait for a reader.
    fn finish(&mut self) -> Result<()> {
        match self.sink() {
            Some(s) => Ok(s.end_run()?),
            None => Ok(()),
        }
    }
    /// After `finish`: whether the output's reader has not taken everything, so the programs
    /// are detached before [`settle`](Emitter::settle) waits for it.
    fn stalled(&mut self) -> bool {
        self.sink().is_some_and(|s| s.stalled())
    }
    /// After the programs are detached: gives a slow or stalled reader its bounded grace, and
    /// fails naming what it never took.
    fn settle(&mut self) -> Result<()> {
        match self.sink() {
            Some(s) => Ok(s.finish()?),
            None => Ok(()),
        }
    }
    /// Whether the emitter shows the windows' rows (tables, NDJSON rows, histograms). One that
    /// reads only findings and counters (`triage`) says no, and the loop drops each collector's
    /// rows as soon as it is collected: under process churn they are one JSON object per pid
    /// per collector, and holding every collector's at once is what grew triage to 462 MB.
    fn wants_rows(&self) -> bool {
        true
    }
    /// Resolves to `true` when the user asked to quit (a key in the live view), `false` when
    /// the loop should just look again; emitters without input never resolve.
    fn input(&mut self) -> Pin<Box<dyn Future<Output = bool> + '_>> {
        Box::pin(std::future::pending())
    }
    /// Notified when the emitter wants the window ended now, before its interval (serve, when
    /// a scrape asks for data fresher than the last window); None (the default): never.
    fn early(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }
}

/// The keys every JSON line of a window carries.
pub fn window_keys(w: &Window) -> Map<String, Value> {
    let (end, end_ns) = w.end_json();
    let mut m = Map::new();
    m.insert("interval_ns".into(), (w.elapsed.as_nanos() as u64).into());
    m.insert("interval_end".into(), end.into());
    m.insert("interval_end_ns".into(), end_ns.into());
    m
}

/// The keys of each window's `stats` line that are about the run, not the tool: why the window
/// ended, and tracekit's own memory (`rss_kib`, `rss_peak_kib`).
pub fn run_keys(w: &Window) -> Map<String, Value> {
    let (rss, hwm) = crate::host::proc::self_rss_kib();
    let mut m = Map::new();
    m.insert("stop".into(), w.stop.as_str().into());
    m.insert("rss_kib".into(), rss.into());
    m.insert("rss_peak_kib".into(), hwm.into());
    m
}

/// Every program a run of several collectors holds, once each: collectors sharing an object
/// (ctxsw and runq-lat) list the same programs.
pub fn run_programs(metas: &[Meta]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for p in metas
        .iter()
        .flat_map(|m| m.programs.as_array().cloned().unwrap_or_default())
    {
        if !out.iter().any(|q| q["id"] == p["id"]) {
            out.push(p);
        }
    }
    out
}

/// The `"type":"meta"` line of a collector (tests and scripts wait for it).
pub fn meta_json(m: &Meta) -> Value {
    let mut v = json!({
        "tool": m.tool,
        "type": "meta",
        "scope": m.scope,
        "per_thread": m.per_thread,
        "programs": m.programs,
        "skipped": m.skipped.iter().map(|(h, r)| json!({"hook": h, "reason": r})).collect::<Vec<_>>(),
        "left_out": m.left_out.iter().map(|(h, r)| json!({"hook": h, "reason": r})).collect::<Vec<_>>(),
    });
    for (k, x) in &m.extra {
        v[k] = x.clone();
    }
    v
}

/// The text announcement on stderr: what is traced where, what was skipped, how it ends.
pub fn announcement(m: &Meta, opts: &RunOpts) -> String {
    let skipped = if m.skipped.is_empty() {
        String::new()
    } else {
        let s: Vec<String> = m
            .skipped
            .iter()
            .map(|(n, r)| format!("{n} ({r})"))
            .collect();
        format!("; skipped: {}", s.join(", "))
    };
    let end = match opts.duration {
        Some(d) => format!("Ending after {}.", humantime::format_duration(d)),
        None => "Ctrl-C to end.".to_string(),
    };
    format!(
        "Tracing {} in {} ({}){skipped}. {end}",
        m.what, m.scope, m.programs_text
    )
}

/// Text or NDJSON to stdout or `--output`.
pub struct Stream {
    sink: Sink,
    json: bool,
    hist: bool,
    tools: Vec<&'static str>,
}

impl Stream {
    pub fn new(sink: Sink, opts: &RunOpts) -> Stream {
        sink.pace_stdout();
        Stream {
            sink,
            json: opts.json,
            hist: opts.hist,
            tools: Vec::new(),
        }
    }
}

impl Emitter for Stream {
    fn begin(&mut self, metas: &[Meta], opts: &RunOpts) -> Result<bool> {
        self.tools = metas.iter().map(|m| m.tool).collect();
        if self.json {
            let mut s = String::new();
            for m in metas {
                s.push_str(&meta_json(m).to_string());
                s.push('\n');
            }
            return Ok(self.sink.put(&s)?);
        }
        use std::io::Write;
        for m in metas {
            // A closed stderr is no reason to stop tracing.
            let _ = writeln!(std::io::stderr(), "{}", announcement(m, opts));
        }
        Ok(true)
    }

    fn window(&mut self, w: &Window, outs: &[Output]) -> Result<bool> {
        let keys = window_keys(w);
        let run = run_keys(w);
        let mut s = String::new();
        for (i, o) in outs.iter().enumerate() {
            if self.json {
                let tool = self.tools.get(i).copied().unwrap_or("?");
                s.push_str(&render::json(o, tool, &keys, &run));
            } else {
                if i > 0 {
                    s.push('\n');
                }
                s.push_str(&render::text(o, self.hist));
            }
        }
        Ok(self.sink.put(&s)?)
    }

    fn sink(&mut self) -> Option<&mut Sink> {
        Some(&mut self.sink)
    }
}
