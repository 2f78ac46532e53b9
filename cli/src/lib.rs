//! tracekit: eBPF tracing for the slow node whose dashboards look normal.
//!
//! Layers, each importing only those below it:
//! - [`error`]: the exit codes and the one error type every layer folds into;
//! - [`host`]: what `/proc` and `/sys` say (parsers tested on fixtures, no BPF);
//! - [`kernel`]: tracefs, BTF, feature probes, the attach policy, loading, generation maps;
//! - [`report`]: typed rows, findings, histograms, sanitising, rendering, output sinks;
//! - [`engine`]: collectors, scope, the run loop that drives several at once, the live view;
//! - [`tools`]: one file per tool and the registry.

pub mod engine;
pub mod error;
pub mod host;
pub mod kernel;
pub mod options;
pub mod report;
pub mod tools;
