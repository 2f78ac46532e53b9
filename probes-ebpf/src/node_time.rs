//! On-CPU time per NUMA node, measured at `sched:sched_switch`: numa's own switch program and,
//! when `numa` runs beside ctxsw or runq-lat (`triage`, `serve`, `record`), the shared `sched`
//! object's (`SCHED_NODE_TIME`), so a switch runs one program for all three.
//!
//! The outgoing task's `se.sum_exec_runtime` minus its value when this CPU switched it in (kept
//! per CPU, [`Stint`]) is exactly the run that just ended, and it ran on this CPU's node. A run
//! whose switch-in was not seen (begun before the attach, or an event this host's kernel skips)
//! is `sum_exec_runtime - se.prev_sum_exec_runtime` for fair-class tasks (`set_next_entity` sets
//! it at each pick, every kernel since 2.6.23), clipped to the attach.
//!
//! Declares no maps (every map of this library lands in every object): each object that records
//! node time declares its own with [`node_time_maps!`](crate::node_time_maps).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    maps::{Array, HashMap, PerCpuArray},
};
use probes_common::numa::{
    NumaKey, NumaVal, RunOffsets, Stint, MAX_NODES, STAT_NO_BASELINE, STAT_NO_NODE,
};

use crate::{atomic_add, generation, kread::Kread, slot, stat};

/// The maps one object records node time in.
pub struct NodeMaps {
    /// Node of each CPU, sized and filled by userspace.
    pub cpu_node: &'static Array<u32>,
    /// What each CPU switched in last.
    pub last_in: &'static PerCpuArray<Stint>,
    /// Per process (or thread) and generation.
    pub agg: &'static HashMap<NumaKey, NumaVal>,
    /// What did not fit `agg`, one row per generation.
    pub other: &'static Array<NumaVal>,
    pub scratch: &'static PerCpuArray<NumaVal>,
}

/// How the object reads a run: member offsets, row ids, and when it attached.
#[derive(Clone, Copy)]
pub struct RunCfg {
    pub offs: RunOffsets,
    pub per_thread: bool,
    /// `bpf_ktime_get_ns` when userspace loaded the programs: a run measured from the task's
    /// pick time is clipped to it, so time from before the attach is never counted.
    pub start_ns: u64,
}

impl NodeMaps {
    /// The node of `cpu` (node 0 for a CPU beyond the map, counted as `STAT_NO_NODE`).
    #[inline(always)]
    pub fn node_of(&self, cpu: u32) -> u32 {
        match self.cpu_node.get(cpu) {
            Some(n) => *n,
            None => {
                stat(STAT_NO_NODE);
                0
            }
        }
    }

    /// The aggregate of `tid` (or its process, `tgid`) in the current generation, created with
    /// `init` filling the name; every path ends in one pointer (see `crate::slot`).
    #[inline(always)]
    pub fn value(
        &self,
        per_thread: bool,
        tid: u32,
        tgid: u32,
        init: impl FnOnce(*mut NumaVal),
    ) -> Option<*mut NumaVal> {
        let gen = generation();
        let key = NumaKey {
            id: if per_thread { tid } else { tgid },
            gen,
        };
        slot(self.agg, self.other, self.scratch, &key, gen, |v| {
            init(v);
            // SAFETY: this CPU's scratch slot, owned by this run.
            unsafe { (*v).tgid = tgid };
        })
        .map(|s| s.ptr)
    }

    /// The switch-in half: `next` (a `task_struct` pointer, `pid` at `pid_off`) becomes this
    /// CPU's stint; returns the one it ends, for [`NodeMaps::switch_out`].
    #[inline(always)]
    pub fn switch_in<K: Kread>(&self, next: u64, pid_off: u32, cfg: &RunCfg) -> Option<Stint> {
        let last = self.last_in.get_ptr_mut(0)?;
        // SAFETY: this CPU's slot; sched_switch programs do not nest on one CPU.
        let base = unsafe { *last };
        // SAFETY: as above.
        unsafe {
            *last = Stint {
                tid: K::u32(next, pid_off),
                valid: 1,
                sum_exec_runtime: K::u64(next, cfg.offs.sum_exec_runtime),
            };
        }
        Some(base)
    }

    /// The switch-out half: `prev` (thread `tid` of process `tgid`, already past the filters,
    /// and `current`) ran from `base` until now on this CPU's node.
    #[inline(always)]
    pub fn switch_out<K: Kread>(&self, prev: u64, tid: u32, tgid: u32, base: Stint, cfg: &RunCfg) {
        let sum = K::u64(prev, cfg.offs.sum_exec_runtime);
        let ran = if base.valid != 0 && base.tid == tid {
            sum.wrapping_sub(base.sum_exec_runtime)
        } else {
            // Its switch-in was not seen (the run began before the attach, or this host's
            // kernel skipped the event). The fair class records `sum_exec_runtime` when it picks
            // a task, which bounds this run from the kernel's own accounting, clipped to the
            // attach time.
            match unseen_run::<K>(prev, sum, cfg) {
                Some(ran) => ran,
                None => {
                    stat(STAT_NO_BASELINE);
                    return;
                }
            }
        };
        // The CPU id indexes the array; a CPU beyond it (hot-added after start) counts as
        // node 0.
        // SAFETY: a helper without arguments.
        let cpu = unsafe { bpf_get_smp_processor_id() };
        let node = self.node_of(cpu) as u64;
        // `current` is still `prev` here.
        let Some(v) = self.value(cfg.per_thread, tid, tgid, |v| {
            // SAFETY: this CPU's scratch slot, owned by this run.
            unsafe { (*v).comm = bpf_get_current_comm().unwrap_or_default() };
        }) else {
            return;
        };
        // The bound check must be on the index the pointer arithmetic uses (see hist_record):
        // a volatile round trip keeps LLVM from proving it away.
        // SAFETY: reads a local.
        let idx = unsafe { core::ptr::read_volatile(&node) };
        // SAFETY: `v` is a live map value; the index is checked against the array length.
        unsafe {
            atomic_add(&raw mut (*v).runs, 1);
            if idx < MAX_NODES as u64 {
                atomic_add(&raw mut (*v).cpu_ns[idx as usize], ran);
            }
        }
    }
}

/// The run of fair-class `task` that ends now, from `se.prev_sum_exec_runtime`, never longer
/// than the time since the attach; `None` for other classes (which leave that field stale).
#[inline(always)]
fn unseen_run<K: Kread>(task: u64, sum: u64, cfg: &RunCfg) -> Option<u64> {
    // `prio` is an int: deadline tasks have -1.
    if (K::u32(task, cfg.offs.prio) as i32) < 100 {
        return None;
    }
    let since_pick = sum.checked_sub(K::u64(task, cfg.offs.prev_sum_exec_runtime))?;
    // SAFETY: a helper without arguments.
    let since_attach = unsafe { bpf_ktime_get_ns() }.saturating_sub(cfg.start_ns);
    Some(since_pick.min(since_attach))
}

/// Declares, in the object that invokes it, the maps node time is recorded in (`CPU_NODE`,
/// `LAST_IN`, `NUMA_AGG` with `$agg` entries until userspace sizes it, `NUMA_OTHER`,
/// `NUMA_SCRATCH`: the names userspace takes them by) and `NODES`, the [`NodeMaps`] over them.
#[macro_export]
macro_rules! node_time_maps {
    ($agg:expr) => {
        /// Node of each CPU, sized and filled by userspace.
        #[aya_ebpf::macros::map]
        static CPU_NODE: aya_ebpf::maps::Array<u32> = aya_ebpf::maps::Array::with_max_entries(1, 0);

        /// What each CPU switched in last.
        #[aya_ebpf::macros::map]
        static LAST_IN: aya_ebpf::maps::PerCpuArray<probes_common::numa::Stint> =
            aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

        /// On-CPU time per node (and numa's other counters, in its own object), per process
        /// (or thread) and generation, sized by userspace.
        #[aya_ebpf::macros::map]
        static NUMA_AGG: aya_ebpf::maps::HashMap<
            probes_common::numa::NumaKey,
            probes_common::numa::NumaVal,
        > = aya_ebpf::maps::HashMap::with_max_entries(
            $agg,
            aya_ebpf::bindings::BPF_F_NO_PREALLOC,
        );

        /// What did not fit `NUMA_AGG`, one row per generation.
        #[aya_ebpf::macros::map]
        static NUMA_OTHER: aya_ebpf::maps::Array<probes_common::numa::NumaVal> =
            aya_ebpf::maps::Array::with_max_entries(2, 0);

        #[aya_ebpf::macros::map]
        static NUMA_SCRATCH: aya_ebpf::maps::PerCpuArray<probes_common::numa::NumaVal> =
            aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

        const NODES: $crate::node_time::NodeMaps = $crate::node_time::NodeMaps {
            cpu_node: &CPU_NODE,
            last_in: &LAST_IN,
            agg: &NUMA_AGG,
            other: &NUMA_OTHER,
            scratch: &NUMA_SCRATCH,
        };
    };
}
