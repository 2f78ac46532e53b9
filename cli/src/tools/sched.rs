//! What `ctxsw` and `runq-lat` share: loading their `sched_switch` object with `task_struct`
//! offsets from the kernel's BTF, and draining one interval of per-process aggregates.
//!
//! Kernel side and cost argument: `probes-ebpf/src/sched.rs`.

use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::maps::{Array, HashMap, MapData};
use probes_common::{
    hist::LatHist,
    sched::{PreemptKey, SchedKey, SchedVal, TaskOffsets},
};

use crate::{
    error::UserError,
    kernel::btf::Btf,
    kernel::loader::{self, AttachMode, LoadSpec, Object, Session},
    options::Common,
    tools::{self, row_comm, Hook},
};

/// The hooks both tools use.
pub const HOOKS: &[Hook] = &[
    Hook {
        event: "sched:sched_switch",
        raw: None,
        fields: &[],
        modes: &[AttachMode::TpBtf, AttachMode::RawTp],
        optional: false,
    },
    Hook {
        event: "sched:sched_process_free",
        raw: None,
        fields: &[],
        modes: &[AttachMode::TpBtf, AttachMode::RawTp],
        optional: true,
    },
    Hook {
        event: "sched:sched_process_exec",
        raw: None,
        fields: &[],
        modes: &[AttachMode::TpBtf, AttachMode::RawTp],
        optional: true,
    },
];

/// Both tools read `task_struct` offsets from the kernel's BTF whatever the attach mode.
pub const REQUIRES_BTF: bool = true;

/// The privileges of both tools (`--help`).
pub const NEEDS: &str =
    "root, or exactly CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN stands in for both). \
They never read tracefs: they need the kernel's BTF (/sys/kernel/btf/vmlinux, or TRACEKIT_BTF), \
readable by anyone.";

/// `task_struct` member offsets the programs read, from the running kernel's BTF.
pub fn task_offsets(btf: &Btf) -> anyhow::Result<TaskOffsets> {
    let m = |path: &str, size: u32| -> anyhow::Result<u32> {
        let m = btf.member("task_struct", path)?;
        anyhow::ensure!(
            m.size == size,
            "kernel BTF: task_struct.{path} is {} bytes, expected {size}",
            m.size
        );
        Ok(m.offset)
    };
    Ok(TaskOffsets {
        pid: m("pid", 4)?,
        tgid: m("tgid", 4)?,
        nvcsw: m("nvcsw", 8)?,
        nivcsw: m("nivcsw", 8)?,
        run_delay: m("sched_info.run_delay", 8)?,
        nr_migrations: m("se.nr_migrations", 8)?,
        start_time: m("start_time", 8)?,
        _pad: 0,
    })
}

/// Entries of the per-task snapshot map: every thread that can exist at once, up to 64 Ki
/// (a thread beyond that falls back to classifying its switches from the tracepoint and is
/// counted as `start_map_full`).
pub fn task_cap() -> u32 {
    crate::host::proc::pid_max().clamp(4096, 65536)
}

pub struct SchedSession {
    pub session: Session,
    agg: HashMap<MapData, SchedKey, SchedVal>,
    other: Array<MapData, SchedVal>,
    preempt: Option<HashMap<MapData, PreemptKey, u64>>,
    /// The free hook is missing: tids of exited tasks keep their snapshot (LRU-less), see notes.
    pub notes: Vec<String>,
}

/// Program names in a tool's object.
pub struct Programs {
    pub switch_btf: &'static str,
    pub switch_raw: &'static str,
    pub free_btf: &'static str,
    pub free_raw: &'static str,
    pub exec_btf: &'static str,
    pub exec_raw: &'static str,
}

pub fn open(
    object: Object,
    progs: &Programs,
    common: &Common,
    preemptors: bool,
) -> anyhow::Result<SchedSession> {
    if !crate::kernel::features::btf_present() {
        return Err(UserError::KernelFeature(format!(
            "{} needs the kernel's BTF ({} is missing: CONFIG_DEBUG_INFO_BTF, or point TRACEKIT_BTF at a BTF file for this kernel) to find task_struct fields",
            object.name,
            crate::kernel::btf::vmlinux_path().display()
        ))
        .into());
    }
    let btf = crate::kernel::btf::vmlinux().map_err(|e| {
        UserError::KernelFeature(format!(
            "{} needs the kernel's BTF to find task_struct fields: {e}",
            object.name
        ))
    })?;
    let offs = task_offsets(btf).map_err(|e| {
        UserError::KernelFeature(format!("{e}: this kernel's task_struct is not supported"))
    })?;
    // `btf_trace_sched_switch` is (void *, bool preempt, prev, next[, unsigned int prev_state]);
    // prev_state was added in 5.18. Without BTF for it, assume the modern layout.
    let has_state = btf
        .proto_params("btf_trace_sched_switch")
        .is_none_or(|n| n >= 5);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain syscall writing into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let start_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    let spec = LoadSpec::new()
        .global("SCHED_OFFS", &offs)
        .global("SCHED_START_NS", &start_ns)
        .global("SCHED_PER_THREAD", &u8::from(common.threads))
        .global("SCHED_PREEMPTORS", &u8::from(preemptors))
        .global("SCHED_HAS_STATE", &u8::from(has_state))
        .max_entries("TASKS", task_cap())
        .max_entries("SCHED_AGG", tools::key_cap(common))
        .max_entries("PREEMPTORS", tools::key_cap(common))
        .tp_btf(&["sched_process_free", "sched_switch", "sched_process_exec"]);
    let mut session = Session::load(object, common, spec)?;
    let mut notes = Vec::new();
    // The free hook first: once sched_switch runs, snapshots exist that must be cleaned up.
    if let Err(e) = session.attach_raw(progs.free_btf, progs.free_raw, "sched_process_free") {
        tracing::info!("sched_process_free: {e}");
        notes.push(format!(
            "sched:sched_process_free unavailable ({e}): a reused tid may inherit an exited task's baseline"
        ));
    }
    // Before sched_switch too: an exec seen late would leave a row under the old name.
    if let Err(e) = session.attach_raw(progs.exec_btf, progs.exec_raw, "sched_process_exec") {
        tracing::info!("sched_process_exec: {e}");
        notes.push(format!(
            "sched:sched_process_exec unavailable ({e}): a process that exec'd may be shown under its name before the exec"
        ));
    }
    session.attach_raw(progs.switch_btf, progs.switch_raw, "sched_switch")?;
    let take = |s: &mut Session, m: &str| -> anyhow::Result<aya::maps::Map> {
        s.ebpf.take_map(m).ok_or_else(|| {
            loader::LoadError::NoMap {
                object: s.object,
                map: m.into(),
            }
            .into()
        })
    };
    let agg = HashMap::try_from(take(&mut session, "SCHED_AGG")?).context("SCHED_AGG")?;
    let other = Array::try_from(take(&mut session, "SCHED_OTHER")?).context("SCHED_OTHER")?;
    let preempt = if preemptors {
        Some(HashMap::try_from(take(&mut session, "PREEMPTORS")?).context("PREEMPTORS")?)
    } else {
        None
    };
    Ok(SchedSession {
        session,
        agg,
        other,
        preempt,
        notes,
    })
}

/// One process (or thread) in one interval.
#[derive(Clone, Debug)]
pub struct Row {
    /// tgid, or tid with `--threads`; 0 for the `[other]` row.
    pub id: u32,
    pub tgid: u32,
    pub comm: Vec<u8>,
    /// The name before an exec during the interval (the row spans it), if any.
    pub exec_from: Option<Vec<u8>>,
    pub voluntary: u64,
    pub involuntary: u64,
    pub migrations: u64,
    pub wake: LatHist,
    pub preempt: LatHist,
    /// (preemptor tgid, involuntary switches), most first.
    pub preemptors: Vec<(u32, u64)>,
}

impl Row {
    pub fn switches(&self) -> u64 {
        self.voluntary + self.involuntary
    }

    /// Every run-queue wait, however it began.
    pub fn waits(&self) -> LatHist {
        let mut h = self.wake;
        h.merge(&self.preempt);
        h
    }
}

/// Per-CPU stats and rows of one interval.
pub struct Interval {
    pub rows: Vec<Row>,
    pub stats: [u64; probes_common::stats::NSTATS as usize],
}

impl SchedSession {
    /// Ends the interval and returns what it recorded (the `[other]` row last, if non-empty).
    pub fn drain(&mut self, threads: bool) -> anyhow::Result<Interval> {
        let gen = self.session.flip_generation()?;
        let drained =
            loader::drain_generation(&mut self.agg, gen, |k| k.gen).context("reading SCHED_AGG")?;
        let other = self.other.get(&gen, 0).context("reading SCHED_OTHER")?;
        // The kernel writes the other generation now, so the reset races with nothing.
        self.other
            .set(gen, SchedVal::ZERO, 0)
            .context("resetting SCHED_OTHER")?;
        let mut by: BTreeMap<u32, Vec<(u32, u64)>> = BTreeMap::new();
        if let Some(p) = self.preempt.as_mut() {
            for (k, n) in
                loader::drain_generation(p, gen, |k| k.gen).context("reading PREEMPTORS")?
            {
                by.entry(k.victim).or_default().push((k.by, n));
            }
        }
        let stats = self.session.stats_delta()?;
        let mut rows: Vec<Row> = drained
            .into_iter()
            .map(|(k, v)| {
                let mut preemptors = by.remove(&k.id).unwrap_or_default();
                preemptors.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                let comm = row_comm(k.id, v.tgid, threads, &v.comm);
                let from = crate::report::sanitize::comm_bytes(&v.exec_from);
                Row {
                    id: k.id,
                    tgid: v.tgid,
                    exec_from: (!from.is_empty() && from != comm.as_slice()).then(|| from.to_vec()),
                    comm,
                    voluntary: v.voluntary,
                    involuntary: v.involuntary,
                    migrations: v.migrations,
                    wake: v.wake,
                    preempt: v.preempt,
                    preemptors,
                }
            })
            .collect();
        if other.voluntary + other.involuntary > 0 {
            rows.push(Row {
                id: 0,
                tgid: 0,
                comm: b"[other]".to_vec(),
                exec_from: None,
                voluntary: other.voluntary,
                involuntary: other.involuntary,
                migrations: other.migrations,
                wake: other.wake,
                preempt: other.preempt,
                preemptors: Vec::new(),
            });
        }
        Ok(Interval { rows, stats })
    }
}

impl Row {
    /// The name for the text table: `python3 (was sh)` when the row spans an exec.
    pub fn name_text(&self) -> String {
        match &self.exec_from {
            Some(old) => format!(
                "{} (was {})",
                crate::report::sanitize::text(&self.comm),
                crate::report::sanitize::text(old)
            ),
            None => crate::report::sanitize::text(&self.comm),
        }
    }

    /// `comm`, and `exec_from` when the row spans an exec, in tracekit's JSON representation.
    pub fn put_names(&self, line: &mut serde_json::Value) {
        crate::report::sanitize::put_json(line, "comm", &self.comm);
        if let Some(old) = &self.exec_from {
            crate::report::sanitize::put_json(line, "exec_from", old);
        }
    }
}

/// Name of a preemptor (a tgid): its comm while it lives.
pub fn preemptor_name(tgid: u32) -> Vec<u8> {
    if tgid == 0 {
        return b"[idle]".to_vec();
    }
    crate::host::proc::comm(tgid).unwrap_or_else(|| b"[exited]".to_vec())
}

/// Header lines for what the programs could not record in an interval.
pub fn stats_notes(st: &[u64]) -> Vec<String> {
    use probes_common::{sched as ps, stats};
    let mut out = Vec::new();
    let (full, keys, pre, nobase) = (
        st[stats::START_MAP_FULL as usize],
        st[stats::KEY_MAP_FULL as usize],
        st[ps::STAT_PREEMPT_MAP_FULL as usize],
        st[ps::STAT_NO_BASELINE as usize],
    );
    if full > 0 {
        out.push(format!(
            "{full} switch(es) of tasks beyond the {}-task snapshot cap were classified from the tracepoint alone, their waits not measured",
            task_cap()
        ));
    }
    if keys > 0 {
        out.push(format!(
            "{keys} switch(es) over the --max-keys cap are counted in the [other] row"
        ));
    }
    if pre > 0 {
        out.push(format!(
            "{pre} preemption(s) not attributed: the preemptor map was full"
        ));
    }
    if nobase > 0 {
        out.push(format!(
            "{nobase} task(s) already running at start: their first switch was classified from the tracepoint and its wait not measured"
        ));
    }
    out
}

/// The `"type":"stats"` JSON line closing each interval.
pub fn stats_line(tool: &str, w: &crate::engine::Window, st: &[u64], n: u64) -> serde_json::Value {
    use probes_common::{sched as ps, stats};
    let mut all = [0u64; stats::NSTATS as usize];
    for (a, b) in all.iter_mut().zip(st) {
        *a = *b;
    }
    crate::engine::stats_line(
        tool,
        w,
        &all,
        serde_json::json!({
            "count": n,
            "missed": st[stats::START_MAP_FULL as usize],
            "preempt_map_full": st[ps::STAT_PREEMPT_MAP_FULL as usize],
            "no_baseline": st[ps::STAT_NO_BASELINE as usize],
        }),
    )
}
