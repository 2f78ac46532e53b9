//! `numa` on a single-node host: nothing to misplace, so nothing is loaded; one line (at once
//! without a window, else once per window).

use probes_common::stats::NSTATS;
use serde_json::{json, Value};

use super::{report, INFO};
use crate::{
    engine::{Collector, Meta, Output, Scope, Stats, Window},
    error::Result,
    host::numa::{self as hnuma, Topology},
    options::Common,
    report::output::Sink,
};

/// The one line of a single-node host.
pub(super) fn one_node_line(t: &Topology) -> String {
    let n = &t.nodes[0];
    let cpus: Vec<String> = n.cpus.iter().map(u32::to_string).collect();
    format!(
        "numa: one NUMA node here (node {}: {} CPUs, {}): nothing to misplace. On a host with \
         several nodes it looks for processes running on one node while their memory sits on \
         another (CPU time per node against /proc/<pid>/numa_maps) and for NUMA balancing \
         migrating their pages.",
        n.id,
        cpus.len(),
        n.mem_total_kib
            .map_or("memory unknown".into(), report::fmt_kib),
    )
}

pub(super) fn one_node_json(t: &Topology) -> Value {
    json!({
        "type": "system",
        "nodes": t.len(),
        "node_ids": t.nodes.iter().map(|n| n.id).collect::<Vec<_>>(),
        "numa_balancing": hnuma::numa_balancing(),
        "note": "one NUMA node: nothing to misplace",
    })
}

/// Without a window asked for, a single-node host gets its line at once (no privileges
/// needed: nothing is loaded).
pub(super) fn one_node_now(c: &Common, t: &Topology) -> Result<()> {
    crate::host::proc::check_pids(&c.pids)?;
    let mut sink = Sink::open(c.output.as_deref(), false)?;
    let mut line = if c.json {
        let mut v = one_node_json(t);
        v["tool"] = INFO.name.into();
        v.to_string()
    } else {
        one_node_line(t)
    };
    line.push('\n');
    if !sink.put(&line)? {
        return Ok(());
    }
    Ok(sink.finish()?)
}

/// A single-node host: nothing loaded, one line per window.
pub(super) struct OneNode {
    pub(super) scope: Scope,
    pub(super) topo: Topology,
}

impl Collector for OneNode {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        Meta {
            tool: INFO.name,
            what: "nothing (one NUMA node)".into(),
            scope: self.scope.describe(),
            per_thread: self.scope.threads,
            programs: json!([]),
            programs_text: "nothing loaded".into(),
            ..Default::default()
        }
        .with("nodes", self.topo.len())
    }

    fn flip(&mut self) -> Result<()> {
        Ok(())
    }

    fn collect(&mut self, _w: &Window) -> Result<Output> {
        Ok(Output {
            title: one_node_line(&self.topo),
            extra_json: vec![one_node_json(&self.topo)],
            stats: Some(Stats::new([0; NSTATS as usize])),
            ..Default::default()
        })
    }
}
