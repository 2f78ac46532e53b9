//! tracekit: eBPF tracing for the slow node whose dashboards look normal.
//!
//! The shared engine (tracefs, feature probes, loading, the run loop, histograms, rendering,
//! output) lives here once; each tool in [`tools`] only declares its hooks and its report.

pub mod btf;
pub mod cgroup;
pub mod engine;
pub mod error;
pub mod features;
pub mod hist;
pub mod host;
pub mod kernel;
pub mod loader;
pub mod options;
pub mod output;
pub mod procinfo;
pub mod render;
pub mod report;
pub mod sanitize;
pub mod sysstat;
pub mod tools;
pub mod tracefs;
