//! OOM kills (`oom:mark_victim`: the victim, its memory cgroup read in the kernel, streamed)
//! and process exits (`sched:sched_process_exit`: when a tracked process or thread ended).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_probe_read_kernel},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use probes_common::{memstall::MsOom, stats, COMM_LEN};
use probes_ebpf::{allowed, ro, stat};

use super::{
    current_memcg, fill_cgroup, ids, memcg_kn, now_ns, per_thread, read_u64, MS_ATTEMPT,
    MS_CG_CHASE, MS_LIFE, MS_OFF_KN_ID, MS_OFF_TASK_COMM, MS_OFF_TASK_TGID, MS_OOM, MS_OOM_PID_OFF,
    MS_OOM_TASK_ARG,
};

/// Streams one OOM kill: the victim `task` (a `struct task_struct *`) when the tracepoint
/// passes it, else only its `pid` (the cgroup is then the killing task's). OOM kills are rare
/// and end no measured interval, so this record wakes userspace.
#[inline(always)]
fn oom_emit(task: u64, pid: u32) {
    let (ktgid, _) = ids();
    let mut victim = pid;
    if task != 0 && ro(&MS_OFF_TASK_TGID) != u32::MAX {
        victim = read_u64(task + ro(&MS_OFF_TASK_TGID) as u64) as u32;
    }
    if !allowed(ktgid) && !allowed(victim) {
        return;
    }
    stat(stats::EVENTS);
    let Some(mut e) = MS_OOM.reserve::<MsOom>(0) else {
        stat(stats::RINGBUF_FULL);
        return;
    };
    let p = e.as_mut_ptr();
    let own = task != 0 && ro(&MS_CG_CHASE) != 0;
    let (kn, id) = if own {
        let kn = memcg_kn(task);
        (
            kn,
            if kn == 0 {
                0
            } else {
                read_u64(kn + ro(&MS_OFF_KN_ID) as u64)
            },
        )
    } else {
        current_memcg()
    };
    // SAFETY: `p` is the reserved record; every field is written before submit.
    unsafe {
        (*p).ts_ns = now_ns();
        (*p).victim_pid = victim;
        (*p).killer_pid = ktgid;
        (*p).killer_comm = bpf_get_current_comm().unwrap_or_default();
        (*p).victim_comm = [0; COMM_LEN];
        if task != 0 && ro(&MS_OFF_TASK_COMM) != u32::MAX {
            let src = (task + ro(&MS_OFF_TASK_COMM) as u64) as *const [u8; COMM_LEN];
            (*p).victim_comm = bpf_probe_read_kernel(src).unwrap_or_default();
        }
        (*p).victim_task = u32::from(own);
        (*p)._pad = 0;
        fill_cgroup(&raw mut (*p).cgroup, kn, id);
    }
    e.submit(0);
}

probes_ebpf::passing! {
    pub fn tk_ms_oom_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from mark_victim's format file.
        let pid = unsafe { ctx.read_at::<i32>(ro(&MS_OOM_PID_OFF) as usize) }.unwrap_or(0);
        oom_emit(0, pid as u32);
        0
    }
}

#[btf_tracepoint(function = "mark_victim")]
pub fn tk_ms_oom(ctx: BtfTracePointContext) -> i32 {
    let a0: u64 = ctx.arg(0);
    if ro(&MS_OOM_TASK_ARG) != 0 {
        oom_emit(a0, 0);
    } else {
        oom_emit(0, a0 as u32);
    }
    0
}

/// A task exits: if its process (or thread) is tracked, note when (the last thread's exit
/// wins); its direct-compaction attempt, if any, is over.
#[inline(always)]
fn task_exit() {
    let (tgid, tid) = ids();
    let id = if per_thread() { tid } else { tgid };
    if let Some(p) = MS_LIFE.get_ptr_mut(id) {
        // SAFETY: a live map value pointer.
        unsafe { (*p).exit_ns = now_ns() };
    }
    let _ = MS_ATTEMPT.remove(tid);
}

both!(tk_ms_exit_tp, tk_ms_exit, "sched_process_exit", task_exit());
