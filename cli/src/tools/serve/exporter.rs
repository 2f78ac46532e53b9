//! The state a scrape reads (totals so far, tracekit's own figures) and its rendering in the
//! Prometheus text format 0.0.4 through `prometheus-client` (the Prometheus project's Rust
//! client: names, escaping, `_total`, `_bucket`/`_sum`/`_count` and `le` done by the crate).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{prometheus_text, DescriptorEncoder, EncodeMetric as _, NoLabelSet},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::{
    http::Pages,
    metrics::{Family, Total, Totals},
};
use crate::{engine::Output, kernel::proginfo};

/// Everything a scrape reads, updated at the end of each window.
#[derive(Debug)]
pub struct State {
    pub totals: Totals,
    /// Collectors running, and those that could not run here (with why).
    pub ran: Vec<&'static str>,
    pub cannot: Vec<(&'static str, String)>,
    /// Attached programs: tool, program name, id.
    pub programs: Vec<(&'static str, String, u32)>,
    /// Events the programs could not record, per tool, since the start.
    pub missed: BTreeMap<&'static str, u64>,
    pub windows: u64,
    /// How long the previous scrape took to render.
    pub scrape_seconds: f64,
    pub listen: String,
    /// The last window's findings as series (see [`super::findings`]), at most `max_findings`,
    /// how many it had in all, and how many were left out since the start.
    pub findings: Vec<super::findings::Series>,
    /// `None` with --no-findings: windows are not judged.
    pub max_findings: Option<usize>,
    pub findings_last: u64,
    pub findings_dropped: u64,
    /// When the last window ended (the run's start before the first).
    pub last_end: Instant,
}

impl State {
    /// Adds one window's outputs (one per collector of `ran`, in order).
    pub fn window(&mut self, outs: &[Output]) {
        self.totals.ingest(&self.ran, outs);
        if let Some(max) = self.max_findings {
            let f = crate::tools::triage::judge(outs);
            let (series, dropped) = super::findings::series(&f, max, self.totals.pid_labels());
            self.findings = series;
            self.findings_last = f.len() as u64;
            self.findings_dropped += dropped;
        }
        self.last_end = Instant::now();
        for (tool, o) in self.ran.iter().zip(outs) {
            if let Some(s) = &o.stats {
                use probes_common::stats::{RINGBUF_FULL, START_MAP_FULL};
                let n = s.extra.get("missed").and_then(|v| v.as_u64()).unwrap_or(
                    s.counters[START_MAP_FULL as usize] + s.counters[RINGBUF_FULL as usize],
                );
                *self.missed.entry(tool).or_default() += n;
            }
        }
        self.windows += 1;
    }
}

/// Shared between the emitter (writes each window) and the HTTP server (reads per scrape).
#[derive(Clone, Debug)]
pub struct Shared(pub Arc<Mutex<State>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A scrape this long after the last window ended ends the window first.
pub const FRESH: Duration = Duration::from_secs(1);
/// How long a scrape waits for the window it asked for before rendering what there is.
const FRESH_WAIT: Duration = Duration::from_secs(5);

/// The `/metrics` and `/` pages.
pub struct Exporter {
    shared: Shared,
    registry: Registry,
    /// Ends the run loop's window early (the emitter's [`crate::engine::Emitter::early`]).
    early: Arc<tokio::sync::Notify>,
}

impl Exporter {
    pub fn new(shared: Shared, early: Arc<tokio::sync::Notify>) -> Exporter {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(shared.clone()));
        Exporter {
            shared,
            registry,
            early,
        }
    }
}

impl Pages for Exporter {
    fn metrics(&self) -> String {
        let t0 = Instant::now();
        let mut s = String::new();
        if let Err(e) = prometheus_text::encode(&mut s, &self.registry) {
            tracing::debug!("encoding metrics: {e}");
        }
        self.shared.lock().scrape_seconds = t0.elapsed().as_secs_f64();
        s
    }

    /// Fresh at scrape, whatever --interval is: a scrape more than [`FRESH`] after the last
    /// window ended ends the window now and waits for it (at most [`FRESH_WAIT`]), so what
    /// happened up to the scrape is in its answer, and the windows follow the scrapes. Scrapes
    /// closer together than that read the totals as they are (no window per scrape under a
    /// flood of them).
    fn fresh(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let seen = {
                let st = self.shared.lock();
                if st.last_end.elapsed() < FRESH {
                    return;
                }
                st.windows
            };
            self.early.notify_one();
            let deadline = tokio::time::Instant::now() + FRESH_WAIT;
            while self.shared.lock().windows <= seen && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    }

    fn index(&self) -> String {
        let st = self.shared.lock();
        let cannot: Vec<String> = st
            .cannot
            .iter()
            .map(|(t, why)| format!("<li>{t}: {}</li>", html(why)))
            .collect();
        format!(
            "<!doctype html><title>tracekit serve</title><h1>tracekit serve</h1>\
             <p>Collectors: {}. Windows so far: {}.</p><p><a href=\"/metrics\">/metrics</a></p>{}\n",
            st.ran.join(", "),
            st.windows,
            if cannot.is_empty() {
                String::new()
            } else {
                format!("<p>Could not run:</p><ul>{}</ul>", cannot.join(""))
            }
        )
    }
}

fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One metric with one value per label set.
fn family<V>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    values: impl IntoIterator<Item = (Vec<(&'static str, String)>, V)>,
    put: impl Fn(prometheus_client::encoding::MetricEncoder, &V) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in values {
        put(m.encode_family(&labels)?, &v)?;
    }
    Ok(())
}

fn counter<N: prometheus_client::encoding::EncodeCounterValue + Clone + std::fmt::Debug>(
    m: prometheus_client::encoding::MetricEncoder,
    v: &N,
) -> std::fmt::Result {
    ConstCounter::new(v.clone()).encode(m)
}

fn gauge(m: prometheus_client::encoding::MetricEncoder, v: &f64) -> std::fmt::Result {
    ConstGauge::new(*v).encode(m)
}

fn no_labels<V>(v: V) -> [(Vec<(&'static str, String)>, V); 1] {
    [(Vec::new(), v)]
}

fn by_tool<V>(tool: &str, v: V) -> (Vec<(&'static str, String)>, V) {
    (vec![("tool", tool.to_string())], v)
}

/// One collector metric: counters in their unit, histograms in seconds.
fn encode_family(enc: &mut DescriptorEncoder, f: &Family) -> std::fmt::Result {
    let kind = if f.hist {
        MetricType::Histogram
    } else {
        MetricType::Counter
    };
    family(enc, f.name, f.help, kind, f.sorted(), |mut m, v| match v {
        Total::Counter(n) if f.ns => counter(m, &(*n as f64 / 1e9)),
        Total::Counter(n) => counter(m, n),
        Total::Hist(b) => {
            m.encode_histogram::<NoLabelSet>(b.sum_ns as f64 / 1e9, b.count, &b.prometheus(), None)
        }
    })
}

impl Collector for Shared {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let st = self.lock();
        // The metrics of every running collector (declared even before their first sample).
        for f in st
            .totals
            .families
            .iter()
            .filter(|f| st.ran.contains(&f.tool))
        {
            encode_family(&mut enc, f)?;
        }
        family(
            &mut enc,
            "tracekit_series_dropped",
            "Series folded into the overflow=\"true\" series of their metric (--max-series).",
            MetricType::Counter,
            st.totals
                .families
                .iter()
                .filter(|f| f.dropped > 0)
                .map(|f| (vec![("metric", f.name.to_string())], f.dropped)),
            counter,
        )?;
        family(
            &mut enc,
            "tracekit_finding_score",
            "Each finding of the last window (triage's judgement): its score in its unit (seconds_per_second: the victim's time lost per second, or the share of its packets lost; per_second: a rate). Gone when the finding is.",
            MetricType::Gauge,
            st.findings.iter().map(|s| (s.labels.clone(), s.value)),
            gauge,
        )?;
        // Not judged (--no-findings): no count, which 0 would misstate.
        if st.max_findings.is_some() {
            family(
                &mut enc,
                "tracekit_findings",
                "Findings in the last window, before the --max-series cap.",
                MetricType::Gauge,
                no_labels(st.findings_last as f64),
                gauge,
            )?;
            family(
                &mut enc,
                "tracekit_findings_dropped",
                "Findings left out of tracekit_finding_score by the --max-series cap, since the start.",
                MetricType::Counter,
                no_labels(st.findings_dropped),
                counter,
            )?;
        }
        let up = st
            .ran
            .iter()
            .map(|t| by_tool(t, 1.0))
            .chain(st.cannot.iter().map(|(t, _)| by_tool(t, 0.0)));
        family(
            &mut enc,
            "tracekit_collector_up",
            "1 for a collector running, 0 for one that could not run here.",
            MetricType::Gauge,
            up,
            gauge,
        )?;
        let mut per_tool: BTreeMap<&str, f64> = BTreeMap::new();
        for (t, _, _) in &st.programs {
            *per_tool.entry(t).or_default() += 1.0;
        }
        family(
            &mut enc,
            "tracekit_programs_loaded",
            "BPF programs attached, per collector.",
            MetricType::Gauge,
            per_tool.into_iter().map(|(t, n)| by_tool(t, n)),
            gauge,
        )?;
        family(
            &mut enc,
            "tracekit_events_missed",
            "Events the programs could not record (in-flight map or ring buffer full).",
            MetricType::Counter,
            st.missed.iter().map(|(t, n)| by_tool(t, *n)),
            counter,
        )?;
        self_metrics(&mut enc, &st)
    }
}

/// tracekit's own cost: memory, CPU, kernel time of its programs, scrape time, windows.
fn self_metrics(enc: &mut DescriptorEncoder, st: &State) -> std::fmt::Result {
    let (rss_kib, _) = crate::host::proc::self_rss_kib();
    family(
        enc,
        "tracekit_rss_bytes",
        "tracekit's resident memory.",
        MetricType::Gauge,
        no_labels((rss_kib * 1024) as f64),
        gauge,
    )?;
    family(
        enc,
        "tracekit_cpu_seconds",
        "CPU time tracekit's process used (user + system), not counting its BPF programs.",
        MetricType::Counter,
        no_labels(crate::host::proc::self_cpu_seconds()),
        counter,
    )?;
    let enabled = crate::host::read_trim(&crate::host::proc_path("sys/kernel/bpf_stats_enabled"))
        .is_some_and(|v| v == "1");
    family(
        enc,
        "tracekit_bpf_stats_enabled",
        "1 when kernel.bpf_stats_enabled is on (program run time and counts below are then counted).",
        MetricType::Gauge,
        no_labels(if enabled { 1.0 } else { 0.0 }),
        gauge,
    )?;
    let ids: Vec<u32> = st.programs.iter().map(|p| p.2).collect();
    let counters = &proginfo::counters_by_id(&ids);
    let per_prog = |f: fn(&proginfo::ProgCounters) -> f64| {
        st.programs.iter().filter_map(move |(t, name, id)| {
            let c = counters.iter().find(|(i, _)| i == id)?;
            Some((
                vec![("tool", t.to_string()), ("program", name.clone())],
                f(&c.1),
            ))
        })
    };
    family(
        enc,
        "tracekit_bpf_run_seconds",
        "Kernel time spent in each tracekit program (kernel.bpf_stats_enabled=1 only).",
        MetricType::Counter,
        per_prog(|c| c.run_time_ns as f64 / 1e9),
        counter,
    )?;
    family(
        enc,
        "tracekit_bpf_runs",
        "Runs of each tracekit program (kernel.bpf_stats_enabled=1 only).",
        MetricType::Counter,
        per_prog(|c| c.run_cnt as f64),
        counter,
    )?;
    family(
        enc,
        "tracekit_scrape_duration_seconds",
        "How long the previous scrape of /metrics took to render.",
        MetricType::Gauge,
        no_labels(st.scrape_seconds),
        gauge,
    )?;
    family(
        enc,
        "tracekit_windows",
        "Collection windows completed (--interval each).",
        MetricType::Counter,
        no_labels(st.windows),
        counter,
    )
}
