//! Wakeups and waits after them (`sched_waking`, `sched_wakeup`, `sched_wakeup_new`, and the
//! switch-in half of `sched_switch`): when each task was woken, the wait it becomes at its
//! switch-in, and, for runq-lat, whom that wait was spent behind and how much of it the
//! hypervisor stole (see the object's doc, `sched.rs`).

use super::*;

/// The run queue `task` is on and its steal clock (see [`probes_ebpf::rq_steal`]).
#[inline(always)]
fn rq_steal(task: *const u8) -> (u64, u64) {
    probes_ebpf::rq_steal(task, &ro(&SCHED_OFFS))
}

/// Notes the queue a woken task was put on and its steal clock then, for its switch-in to
/// take the steal of its wait from.
#[inline(always)]
fn note_steal(p: *const u8, tid: u32, w: *mut WakeSlot) {
    let (rq, steal) = rq_steal(p);
    // SAFETY: a live array slot (see on_waking for the races); the tid tag is checked so a
    // slot another tid took over is left alone.
    unsafe {
        if (*w).tid == tid && (*w).ts != 0 {
            (*w).steal_rq = rq;
            (*w).steal = steal;
        }
    }
}

/// `sched_waking(p)` (and `sched_wakeup_new(p)` with `new`): remembers when `p` was woken.
///
/// Every wakeup is stored, even of a task still on a run queue (`ttwu_runnable`: woken before it
/// blocked, while preempted, or in a 6.12+ delayed dequeue): the switch-out decides what the
/// wait was. A wait after an involuntary switch-out is a preemption wait whatever wakeups came
/// meanwhile; a stale timestamp (a wakeup while the task ran) is overwritten by the next wakeup.
#[inline(always)]
pub(super) fn on_waking<R: Reader>(p: *const u8, new: bool) {
    let o = ro(&SCHED_OFFS);
    let tid = R::i32(p, o.pid) as u32;
    let Some(w) = wake_slot(tid) else {
        return;
    };
    let waker_tgid = if new {
        0
    } else {
        (bpf_get_current_pid_tgid() >> 32) as u32
    };
    // SAFETY: a live array slot; concurrent wakeups of two tids sharing it may mix their fields
    // (the tid tag then rarely matches a mixed timestamp: a wrong wait, very rarely). The
    // measured wait of the current run, if any, stays for its switch-out.
    unsafe {
        (*w).tid = tid;
        (*w).waker_tgid = waker_tgid;
        (*w).ts = bpf_ktime_get_ns();
        (*w).steal_rq = 0;
    }
    if new && ro(&SCHED_STEAL) != 0 {
        // wake_up_new_task has enqueued it, its queue's clock just updated.
        note_steal(p, tid, w);
    }
    if !new && ro(&SCHED_WAKERS) != 0 && allowed(waker_tgid) {
        let waker_tid = bpf_get_current_pid_tgid() as u32;
        let tgid = R::i32(p, o.tgid) as u32;
        let key = PairKey {
            a: row_id(waker_tid, waker_tgid),
            a_tgid: waker_tgid,
            b: row_id(tid, tgid),
            b_tgid: tgid,
            gen: generation(),
            _pad: 0,
        };
        pair_add(&WAKERS, &key, 1, 0);
    }
}

/// The switch-in of `next`: a pending wakeup becomes its wait; with `SCHED_CULPRITS`, the wait
/// is charged to the two tasks that held this CPU last, each for the part of the wait it ran
/// (the rest, when more tasks ran meanwhile, is charged to nobody; a holder whose start is not
/// known, one that resumed after a preemption, is charged from the wakeup on), and `next`
/// becomes the holder. The clock is read only for a switch-in that ends a wait after a wakeup.
///
/// Charging only the task switched out here (the last holder) named `rcu_preempt` and kworkers
/// for waits spent behind CPU hogs: they run briefly right before the woken task, after the hog.
#[inline(always)]
pub(super) fn switch_in<R: Reader>(prev: *const u8, next: *const u8) {
    let o = ro(&SCHED_OFFS);
    let culprits = ro(&SCHED_CULPRITS) != 0;
    let ntid = R::i32(next, o.pid) as u32;
    let ntgid = R::i32(next, o.tgid) as u32;
    let Some(w) = wake_slot(ntid) else {
        return;
    };
    // SAFETY: a live array slot (see on_waking for the races).
    let w = unsafe { &mut *w };
    let ts = w.ts;
    let pending = ntid != 0 && w.tid == ntid && ts != 0;
    if !pending {
        if culprits {
            // A task resuming after a preemption: it holds the CPU from now on, since when is
            // not worth a clock read on every switch (a later wait charged to it then counts
            // from that wait's wakeup).
            if let Some(h) = HOLDERS.get_ptr_mut(0) {
                // SAFETY: this CPU's slot; programs on one CPU do not nest on sched_switch.
                let h = unsafe { &mut *h };
                let (ptid, ptgid) = (R::i32(prev, o.pid) as u32, R::i32(prev, o.tgid) as u32);
                h.before_id = row_id(ptid, ptgid);
                h.before_tgid = ptgid;
                h.before_since = h.since;
                h.before_steal_at = h.steal_at;
                h.id = row_id(ntid, ntgid);
                h.tgid = ntgid;
                h.since = 0;
                h.steal_at = 0;
            }
        }
        return;
    }
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // The timestamp may come from another CPU: never negative.
    let wait = now.saturating_sub(ts) & !(WAKE_WAITED | WAKE_OWN);
    let own = if w.waker_tgid == ntgid { WAKE_OWN } else { 0 };
    w.ts = 0;
    w.wait = wait | WAKE_WAITED | own;
    if !culprits {
        return;
    }
    // The hypervisor's part of the wait: the steal clock of the queue it waited on, from its
    // enqueue to now (__schedule has just updated the clock); none when it changed queues.
    let (rq, steal_now) = if ro(&SCHED_STEAL) != 0 {
        rq_steal(next)
    } else {
        (0, 0)
    };
    let stolen = if rq != 0 && w.steal_rq == rq {
        steal_now.saturating_sub(w.steal).min(wait)
    } else {
        0
    };
    let Some(h) = HOLDERS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; programs on one CPU do not nest on sched_switch.
    let h = unsafe { &mut *h };
    let (ptid, ptgid) = (R::i32(prev, o.pid) as u32, R::i32(prev, o.tgid) as u32);
    let pid = row_id(ptid, ptgid);
    // `prev` held the CPU since h.since when the history knows it (else: all the wait).
    let known = h.id == pid && h.tgid == ptgid && h.since != 0;
    if wait >= ro(&SCHED_CULPRIT_MIN_NS) {
        let since = if known && h.since > ts { h.since } else { ts };
        let key = PairKey {
            a: row_id(ntid, ntgid),
            a_tgid: ntgid,
            b: pid,
            b_tgid: ptgid,
            gen: generation(),
            _pad: 0,
        };
        let late = wait >= ro(&SCHED_LATE_MIN_NS);
        // Each holder is charged the time it held the CPU less the steal in it: its own share
        // when its start's steal clock is known, else the whole wait's.
        let held = now.saturating_sub(since);
        let held_steal = if since > ts && h.steal_at != 0 {
            steal_now.saturating_sub(h.steal_at)
        } else {
            stolen
        }
        .min(stolen)
        .min(held);
        charge(&key, held - held_steal, late);
        if since > ts {
            // The task before it, for the part of the wait it ran.
            let from = if h.before_since > ts { h.before_since } else { ts };
            if since > from {
                let left = stolen - held_steal;
                let before_steal = if from > ts && h.before_steal_at != 0 {
                    h.steal_at.saturating_sub(h.before_steal_at)
                } else {
                    left
                }
                .min(left)
                .min(since - from);
                let key = PairKey {
                    b: h.before_id,
                    b_tgid: h.before_tgid,
                    ..key
                };
                charge(&key, since - from - before_steal, late);
            }
        }
        if stolen != 0 {
            let key = PairKey {
                b: STEAL_ID,
                b_tgid: STEAL_ID,
                ..key
            };
            charge(&key, stolen, late);
        }
    }
    h.before_id = pid;
    h.before_tgid = ptgid;
    h.before_since = if known { h.since } else { 0 };
    h.before_steal_at = if known { h.steal_at } else { 0 };
    h.id = row_id(ntid, ntgid);
    h.tgid = ntgid;
    h.since = now;
    h.steal_at = steal_now;
}

/// `sched_wakeup(p)`, attached only with `SCHED_STEAL` or `SCHED_FROM_WAKEUP`: `p` is on its
/// run queue now, whose clock the enqueue (`ttwu_do_activate`, or `ttwu_runnable`) has just
/// updated. With `SCHED_FROM_WAKEUP` the wait restarts here: `sched_waking` of the same wakeup
/// came first (in `try_to_wake_up`) and filled the slot's tid and waker, which stay. Re-stamping
/// the slot, rather than `sched_waking` skipping its own stamp, keeps `sched_waking`'s program
/// the same in both modes, and only runs that ask for it pay for this second program.
#[inline(always)]
pub(super) fn on_wakeup<R: Reader>(p: *const u8) {
    let (steal, from) = (ro(&SCHED_STEAL) != 0, ro(&SCHED_FROM_WAKEUP) != 0);
    if !steal && !from {
        return;
    }
    let tid = R::i32(p, ro(&SCHED_OFFS).pid) as u32;
    let Some(w) = wake_slot(tid) else {
        return;
    };
    // SAFETY: a live array slot (see on_waking for the races). A slot whose stamp is already
    // gone (`ttwu_runnable` of a preempted task that its CPU switched back in between the two
    // events) is left so: stamping it would start a wait for a task that is running.
    unsafe {
        if from && (*w).tid == tid && (*w).ts != 0 {
            (*w).ts = bpf_ktime_get_ns();
        }
    }
    if steal {
        note_steal(p, tid, w);
    }
}

/// Charges `ns` of one wait to the holder in `key`, and to `LATE_CULPRITS` too for a long wait.
#[inline(always)]
fn charge(key: &PairKey, ns: u64, late: bool) {
    pair_add(&CULPRITS, key, 1, ns);
    if late {
        pair_add(&LATE_CULPRITS, key, 1, ns);
    }
}
