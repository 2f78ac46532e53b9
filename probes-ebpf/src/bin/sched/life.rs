//! A task's life around its switches (`sched_process_exit`, `sched_process_exec`,
//! `sched_process_free`): when a row's process ended, the name it exec'd to, and forgetting a
//! task's snapshot and wakeup once its tid can be reused.

use super::*;

/// `sched_process_exit(p)`, in `do_exit` of `p` (`current`): a process dies with its last
/// thread, the one whose exit took `signal->live` to zero (decremented just before this
/// tracepoint in every kernel since 2.6: `group_dead` in `do_exit`, passed to the tracepoint
/// itself only since 6.16). With `--threads` every thread's exit is its row's end. The key
/// is created if this window had not seen the task switch yet (its final switch-out follows).
#[inline(always)]
pub(super) fn on_exit<R: Reader>(p: *const u8) {
    let o = ro(&SCHED_OFFS);
    let (tid, tgid) = (R::i32(p, o.pid) as u32, R::i32(p, o.tgid) as u32);
    if !allowed(tgid) {
        return;
    }
    if ro(&SCHED_PER_THREAD) == 0 {
        let signal = R::u64(p, o.signal) as *const u8;
        // SAFETY: the helper checks the address; a failed read counts as "threads left".
        let live = unsafe {
            bpf_probe_read_kernel(signal.wrapping_add(o.signal_live as usize) as *const i32)
        }
        .unwrap_or(1);
        if live != 0 {
            return;
        }
    }
    let key = SchedKey {
        id: row_id(tid, tgid),
        gen: generation(),
    };
    let Some(val) = agg_slot::<R>(p, tgid, &key) else {
        return;
    };
    // SAFETY: a live map value pointer; a plain store (a process dies once).
    unsafe { (*val).exit_ns = bpf_ktime_get_ns() };
}

/// `sched_process_exec`: the current task runs a new program, and `current->comm` already holds
/// its name. Only the current interval's aggregate is renamed: later intervals create theirs
/// with the new name anyway.
#[inline(always)]
pub(super) fn on_exec() {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // No filter check: a key exists only for a task that passed the filters, and a --comm
    // filter would test the new name.
    let key = SchedKey {
        id: row_id(tid, tgid),
        gen: generation(),
    };
    let Some(v) = SCHED_AGG.get_ptr_mut(key) else {
        return;
    };
    let new = bpf_get_current_comm().unwrap_or_default();
    // SAFETY: live map value; an exec happens once at a time per task, and the aggregate's
    // counters are not touched here.
    unsafe {
        // The name right before this exec: after `fork; exec sh; exec python3` the row reads
        // python3, exec'd from sh.
        (*v).exec_from = (*v).comm;
        (*v).comm = new;
    }
}

/// `sched_process_free(p)`: the tid may be reused from now on.
#[inline(always)]
pub(super) fn on_free<R: Reader>(task: *const u8) {
    let tid = R::i32(task, ro(&SCHED_OFFS).pid) as u32;
    let _ = TASKS.remove(tid);
    if let Some(w) = wake_slot(tid) {
        // SAFETY: a live array slot.
        unsafe {
            if (*w).tid == tid {
                (*w).ts = 0;
                (*w).wait = 0;
            }
        }
    }
}
