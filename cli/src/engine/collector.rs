//! What a tool gives the engine: a [`Collector`] (opened, loaded and attached by the tool), its
//! [`Meta`] (what was attached and skipped, once), and an [`Output`] per window.

use std::os::fd::RawFd;

use serde_json::{Map, Value};

pub use crate::report::render::{Output, Stats};
use crate::{error::Result, kernel::loader::Session};

use super::Window;

/// One tool's collection, driven by the engine. A tool's `open` checks it can run, loads and
/// attaches (returning why not when it cannot); the engine then drives any number of
/// collectors in one loop.
pub trait Collector {
    /// The tool's name (`fsync-lat`), the `"tool"` key of its JSON lines.
    fn name(&self) -> &'static str;
    /// What was attached and skipped; asked once, before the first window.
    fn meta(&self) -> Meta;
    /// Ring buffers to watch for streamed records (announcements of new keys).
    fn event_fds(&self) -> Vec<RawFd> {
        Vec::new()
    }
    /// Called when one of [`Collector::event_fds`] is readable, every
    /// [`Collector::poll_interval`], and before each collection.
    fn on_events(&mut self) -> Result<()> {
        Ok(())
    }
    /// How often the engine calls [`Collector::on_events`] regardless of readiness: for
    /// kernel programs that stream without waking userspace (`BPF_RB_NO_WAKEUP`), because a
    /// wakeup from inside a traced operation (an IPI, then the tracer's event loop) lands in
    /// the durations this and every other tracer on the same event measure.
    fn poll_interval(&self) -> Option<std::time::Duration> {
        None
    }
    /// Ends the window in the kernel: the programs switch to the other generation (the
    /// session's; a collector with more to do at the window's edge overrides it). The engine
    /// flips every collector, waits once for programs still writing the old generation, then
    /// collects each, draining [`Session::drained`].
    fn flip(&mut self) -> Result<()> {
        if let Some(s) = self.session() {
            s.flip_generation()?;
        }
        Ok(())
    }
    /// Refreshes the `--pid --children` filter to `pids` (the session's; a collector sharing
    /// another's object overrides it).
    fn set_filter_pids(&mut self, pids: &[u32]) -> Result<()> {
        if let Some(s) = self.session() {
            s.set_filter_pids(pids)?;
        }
        Ok(())
    }
    /// Everything recorded in `window`.
    fn collect(&mut self, window: &Window) -> Result<Output>;
    /// Links whose detach is slow (see [`super::detach_in_background`]).
    fn slow_links(&mut self) -> usize {
        self.session().map_or(0, |s| s.slow_links())
    }
    /// The loaded object, for what the engine does to every collector alike (flipping,
    /// refreshing the `--pid --children` filter, counting slow links). A collector with a
    /// session of its own returns it; one without (the node checks) keeps this default, and one
    /// sharing an object ([`crate::tools::sched`]) overrides those three instead.
    fn session(&mut self) -> Option<&mut Session> {
        None
    }
}

/// What a collector attached, once, for the text announcement and the JSON `meta` line.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub tool: &'static str,
    /// What is traced, for "Tracing {what} in {scope} …".
    pub what: String,
    /// `all processes`, `pid 42`, …
    pub scope: String,
    pub per_thread: bool,
    /// The attached programs (JSON array of name, id, attach mode, targets).
    pub programs: Value,
    /// `2 tracepoint hooks, 1 tp_btf hook`.
    pub programs_text: String,
    /// Hooks or groups skipped on this kernel, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Conditional hooks this run left out ([`crate::kernel::hooks::Hook::when`]), with the
    /// reason: in the JSON meta line only, as nothing is missing from the report.
    pub left_out: Vec<(String, String)>,
    /// Tool-specific keys of the meta line.
    pub extra: Map<String, Value>,
}

impl Meta {
    /// The common part from a session.
    pub fn of(
        tool: &'static str,
        what: impl Into<String>,
        scope: &super::Scope,
        s: &Session,
    ) -> Meta {
        Meta {
            tool,
            what: what.into(),
            scope: scope.describe(),
            per_thread: scope.threads,
            programs: s.programs_json(),
            programs_text: s.programs_text(),
            skipped: s
                .skipped
                .iter()
                .map(|(e, w)| (e.to_string(), w.clone()))
                .collect(),
            left_out: s
                .left_out
                .iter()
                .map(|(e, w)| (e.to_string(), w.clone()))
                .collect(),
            extra: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, v: impl Into<Value>) -> Meta {
        self.extra.insert(key.to_string(), v.into());
        self
    }
}
