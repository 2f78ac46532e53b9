//! `tracekit serve`: the collectors run continuously, one window every `--interval`, and
//! `/metrics` serves their totals so far in the Prometheus text format, for a fleet's
//! Prometheus and Grafana instead of a terminal.
//!
//! The HTTP server runs on the engine's own tokio runtime: [`Serve::begin`] (called inside the
//! run loop) spawns it on the listener bound before anything was loaded, so a port in use fails
//! at once, and it ends with the run (SIGTERM, SIGINT, `--duration`), when the runtime is
//! dropped and the collectors detach. Scrapes read the totals accumulated at the last window's
//! end ([`exporter::State`]), a scrape more than a second after it ending the window first
//! (fresh at scrape, whatever `--interval` is); see [`metrics`] for what is exported and how series are bounded,
//! [`findings`] for the findings (triage's judgement of each window) as series, [`buckets`]
//! for the histogram buckets and their quantile error.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{json, Value};

use crate::{
    engine::{self, Emitter, Meta, Output, RunOpts, Scope, Window},
    error::{Error, Result},
    options::parse_duration,
    report::output::Sink,
    tools::{self, ToolInfo},
};

#[cfg(test)]
mod alerts;
pub mod auth;
pub mod buckets;
pub mod exporter;
pub mod findings;
pub mod http;
pub mod metrics;
pub mod pprof;

pub const INFO: ToolInfo = ToolInfo::command(
    "serve",
    "A Prometheus exporter: the low-cost collectors (or `--tools`) run continuously and `/metrics` serves latency histograms and counters per comm and container, with bounded cardinality (`--max-series`) and tracekit's own cost; `deploy/` has the DaemonSet, scrape config and Grafana dashboard.",
);

const EXAMPLES: &str = "  tracekit serve --duration 24h                      # 127.0.0.1:9435/metrics, every low-cost collector
  tracekit serve --listen 127.0.0.1:0 --tools fsync-lat,io-lat --interval 15s --duration 1h
  tracekit serve --listen 127.0.0.1:0 --max-series 10 --max-keys 4096 --duration 3s   # port in the meta line";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, "root, or the union of the collectors' capabilities (CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH; CAP_SYS_ADMIN to mount tracefs); collectors that cannot run are listed in tracekit_collector_up and serve goes on."))]
pub struct Args {
    /// Address and port to serve /metrics on (port 0: any free port, printed in the meta line).
    /// Whoever reaches it reads every process name, container and latency of the node: a
    /// non-loopback address without --web-config prints a warning.
    #[arg(long, default_value = "127.0.0.1:9435", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,

    /// The Prometheus exporter-toolkit web config (`--web.config.file`): `basic_auth_users:`
    /// user: bcrypt hash. Every request then needs those credentials (401 otherwise). TLS
    /// (`tls_server_config`) is not supported: terminate it in front, or fence the port.
    #[arg(long, value_name = "FILE")]
    pub web_config: Option<std::path::PathBuf>,

    /// Collectors to run (comma-separated), instead of every low-cost one (those triage runs).
    #[arg(long, value_delimiter = ',', value_name = "TOOL")]
    pub tools: Vec<String>,

    /// How often windows end and the totals /metrics serves are updated.
    #[arg(long, value_parser = parse_duration, default_value = "10s", value_name = "DURATION")]
    pub interval: Duration,

    /// Series per metric at most: the most active label sets are kept, the rest are summed in
    /// one overflow="true" series and counted in tracekit_series_dropped_total.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000), value_name = "N")]
    pub max_series: u32,

    /// Add a `pid` label (one series per process: mind --max-series).
    #[arg(long)]
    pub pid_labels: bool,

    /// Cap on the distinct keys (processes × kinds) each collector's kernel maps hold at once, 16
    /// to 1000000; default from pid_max. What does not fit is counted in `[other]` rows.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(16..=1_000_000))]
    pub max_keys: Option<u32>,

    /// Export no findings (no tracekit_finding_score, tracekit_findings): the windows' data
    /// only, as before serve judged them (the benchmark's baseline; or a fleet that alerts on
    /// its own rules).
    #[arg(long)]
    pub no_findings: bool,
    /// Stop after this long (humantime); default: until SIGTERM or Ctrl-C.
    #[arg(long, short = 'd', value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
}

pub fn run(args: Args) -> Result<()> {
    let common = crate::options::Common {
        duration: args.duration,
        interval: Some(args.interval),
        json: true,
        ..Default::default()
    };
    let sink = tools::preflight(INFO.name, &common)?;
    let auth = match &args.web_config {
        Some(p) => Some(Arc::new(
            auth::WebConfig::load(p).map_err(|e| Error::Usage(e.to_string()))?,
        )),
        None => None,
    };
    // Bound before anything is loaded: an address in use costs nothing.
    let listener = std::net::TcpListener::bind(args.listen).map_err(|source| Error::Io {
        what: format!("listening on {}", args.listen),
        source,
    })?;
    let listen = listener.local_addr().map_or(args.listen, |a| a);
    if auth.is_none() && !listen.ip().is_loopback() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "warning: serve: {listen} is not loopback and no --web-config is given: whoever reaches this port reads every process name, container and latency of this node (use --web-config for basic auth, or fence the port: deploy/networkpolicy.yaml)"
        );
    }
    raise_nofile();
    listener.set_nonblocking(true).map_err(|source| Error::Io {
        what: "setting the listener non-blocking".into(),
        source,
    })?;
    let opts = RunOpts {
        duration: args.duration,
        interval: Some(args.interval),
        json: true,
        ..Default::default()
    };
    let scope = Scope {
        max_keys: args.max_keys,
        ..Default::default()
    };
    let mut opened = tools::open_many(&args.tools, scope, &opts)?;
    if opened.collectors.is_empty() {
        let why: Vec<String> = opened
            .cannot
            .iter()
            .map(|(t, w)| format!("{t}: {w}"))
            .collect();
        return Err(Error::ToolsUnavailable(format!(
            "serve: no collector can run here ({})",
            why.join("; ")
        )));
    }
    let state = exporter::State {
        totals: metrics::Totals::new(args.max_series as usize, args.pid_labels),
        ran: opened.ran,
        cannot: opened.cannot,
        programs: Vec::new(),
        missed: Default::default(),
        windows: 0,
        scrape_seconds: 0.0,
        listen: listen.to_string(),
        findings: Vec::new(),
        max_findings: (!args.no_findings).then_some(args.max_series as usize),
        findings_last: 0,
        findings_dropped: 0,
        last_end: std::time::Instant::now(),
    };
    // The meta and log lines go through a queue: a log reader that stalls holds tracekit
    // for the output's grace at the end, never the event loop in write().
    sink.pace_stdout();
    let mut emit = Serve {
        listener: Some(listener),
        auth,
        shared: exporter::Shared(Arc::new(Mutex::new(state))),
        sink,
        interval: args.interval,
        early: Arc::new(tokio::sync::Notify::new()),
    };
    let run = engine::run(&mut opened.collectors, &opts, &opened.facts, &mut emit);
    tools::end_run(INFO.name, &mut opened.collectors, run, &mut emit)?;
    // The listener closes now, not with the detaching child's descriptors.
    drop(emit);
    let slow = opened.collectors.iter_mut().map(|c| c.slow_links()).sum();
    engine::detach_in_background(slow);
    Ok(())
}

/// Hands the allocator's free pages back to the kernel once a window's rows are folded into the
/// totals. What serve keeps between windows is bounded (totals by `--max-series`, caches by
/// their caps), but glibc keeps the heap at the high-water mark of the busiest window and never
/// shrinks it from the middle: without this, RSS stays at the busiest window's transient rows.
/// Measured over 10 minutes and 3,000 short-lived `dd conv=fsync` processes (plus as many
/// `sleep`s), every default collector: RSS 44.9 MB from minute 2 on without, 37.8–39.9 MB with.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only returns free memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Raises the soft descriptor limit to the hard one (at most 65536), so that the HTTP server's
/// [`http::MAX_CONNS`] slots fit beside the collectors' own descriptors under a container's
/// usual soft limit of 1024. tracekit uses epoll, never select(), so a high limit costs nothing.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the rlimit struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            let want = lim.rlim_max.min(65536);
            if lim.rlim_cur < want {
                lim.rlim_cur = want;
                let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
}

/// The exporter's emitter: starts the server, then adds each window to the totals.
struct Serve {
    listener: Option<std::net::TcpListener>,
    auth: Option<Arc<auth::WebConfig>>,
    shared: exporter::Shared,
    sink: Sink,
    interval: Duration,
    /// Scrapes end the window early through it (see [`exporter::Exporter`]'s `fresh`).
    early: Arc<tokio::sync::Notify>,
}

impl Serve {
    /// The JSON meta line (scripts and tests wait for it): where it listens, what runs, the
    /// program ids (to check nothing stays loaded), each collector's, so a program collectors
    /// share is listed once per collector, as `tracekit_programs_loaded` counts it.
    fn meta_line(st: &exporter::State, metas: &[Meta]) -> Value {
        json!({
            "tool": "serve",
            "type": "meta",
            "listen": st.listen,
            "watching": st.ran,
            "could_not_run": tools::could_not_run(&st.cannot),
            "programs": metas.iter().flat_map(|m| m.programs.as_array().cloned().unwrap_or_default()).collect::<Vec<_>>(),
        })
    }
}

impl Emitter for Serve {
    fn begin(&mut self, metas: &[Meta], _opts: &RunOpts) -> Result<bool> {
        let listener = self
            .listener
            .take()
            .ok_or_else(|| Error::other("serve: begin called twice"))?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| Error::Io {
            what: "serving /metrics on the event loop".into(),
            source,
        })?;
        let line = {
            let mut st = self.shared.lock();
            for m in metas {
                for p in m.programs.as_array().into_iter().flatten() {
                    if let (Some(name), Some(id)) = (p["name"].as_str(), p["id"].as_u64()) {
                        st.programs.push((m.tool, name.to_string(), id as u32));
                    }
                }
            }
            let cannot: Vec<&str> = st.cannot.iter().map(|(t, _)| *t).collect();
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "Serving http://{}/metrics: {}, a window every {}{}. SIGTERM or Ctrl-C to end.",
                st.listen,
                st.ran.join(", "),
                humantime::format_duration(self.interval),
                if cannot.is_empty() {
                    String::new()
                } else {
                    format!("; could not run: {}", cannot.join(", "))
                }
            );
            Self::meta_line(&st, metas)
        };
        tokio::spawn(http::serve(
            listener,
            Arc::new(exporter::Exporter::new(
                self.shared.clone(),
                self.early.clone(),
            )),
            self.auth.clone(),
        ));
        // Nobody reads stdout (a DaemonSet's log may be gone): keep serving.
        self.sink.put(&format!("{line}\n"))?;
        Ok(true)
    }

    fn window(&mut self, _w: &Window, outs: &[Output]) -> Result<bool> {
        self.shared.lock().window(outs);
        trim_heap();
        Ok(true)
    }

    fn sink(&mut self) -> Option<&mut Sink> {
        Some(&mut self.sink)
    }

    fn early(&self) -> Option<Arc<tokio::sync::Notify>> {
        Some(self.early.clone())
    }
}
