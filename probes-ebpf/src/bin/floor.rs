//! The benchmark's floor: the cheapest possible program on a hook (bump a per-CPU counter), so
//! `cargo xtask bench` can say how much of a tool's cost is the hook itself and how much is the
//! tool. Not a user-facing tool (`tracekit bench-floor` is hidden).
#![no_std]
#![no_main]

// The library provides the panic handler.
use probes_ebpf as _;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    net_rx::SkbOffsets,
    sched::{PairKey, PairVal, TaskOffsets},
};
use probes_ebpf::{
    atomic_add, get_or_insert, get_or_insert_copy,
    kread::{probe, Direct, Kread},
    ro, rq_steal,
};

#[map]
static FLOOR_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn bump() {
    if let Some(p) = FLOOR_COUNT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; tracepoint programs do not nest on one CPU.
        unsafe { *p += 1 };
    }
}

#[btf_tracepoint(function = "sched_switch")]
pub fn tk_floor_btf(_ctx: BtfTracePointContext) -> i32 {
    bump();
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn tk_floor_raw(_ctx: RawTracePointContext) -> i32 {
    bump();
    0
}

probes_ebpf::passing! {
    pub fn tk_floor_tp(_ctx: TracePointContext) -> u32 {
        bump();
        0
    }
}

/// The raw `sys_enter` tracepoint: the floor of what every syscall pays under `fsync-lat`.
#[btf_tracepoint(function = "sys_enter")]
pub fn tk_floor_sys(_ctx: BtfTracePointContext) -> i32 {
    bump();
    0
}

/// Wake-wait lower bound: the last wakeup per task, at a slot derived from the task's address
/// (no BTF offset read, no hash: the cheapest possible per-task state).
#[map]
static FLOOR_WAKE: Array<u64> = Array::with_max_entries(65536, 0);

/// Wake-wait lower bound: a per-CPU log2 histogram of the waits (no per-process key).
#[map]
static FLOOR_HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(64, 0);

/// Wake-wait lower bound with the one thing every per-process tool adds: a switch count per
/// process (tgid of the task switched out), in a hash.
#[map]
static FLOOR_PROC: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// `task_struct.pid`'s offset, from the kernel's BTF (set by userspace before load).
#[no_mangle]
static FLOOR_PID_OFF: u32 = 0;

/// The slot of a task: its pid, read with a direct load from the BTF-typed task pointer.
#[inline(always)]
fn wake_slot(task: *const u8) -> u32 {
    // SAFETY: a static patched by userspace before load (read-only data).
    let off = unsafe { core::ptr::read_volatile(&FLOOR_PID_OFF) };
    // SAFETY: `task` is a BTF-typed task_struct pointer from a tp_btf argument, `off` a member
    // offset from the kernel's BTF; the verifier checks the load.
    let pid = unsafe { core::ptr::read_volatile(task.add(off as usize) as *const u32) };
    pid & 0xffff
}

/// `sched_waking(p)`: remembers when `p` was woken.
#[btf_tracepoint(function = "sched_waking")]
pub fn tk_floor_waking(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    if let Some(s) = FLOOR_WAKE.get_ptr_mut(wake_slot(p)) {
        // SAFETY: a live array slot; a racing wakeup of a task sharing it only mixes timestamps.
        unsafe { *s = bpf_ktime_get_ns() };
    }
    0
}

/// The wait of the task switched in (`next`, argument 2) since its wakeup, into the histogram;
/// the wait, if one ended here.
#[inline(always)]
fn wake_wait(ctx: &BtfTracePointContext) -> Option<u64> {
    let next: *const u8 = ctx.arg(2);
    let s = FLOOR_WAKE.get_ptr_mut(wake_slot(next))?;
    // SAFETY: as in tk_floor_waking.
    let ts = unsafe { *s };
    if ts == 0 {
        return None;
    }
    // SAFETY: as above.
    unsafe { *s = 0 };
    // SAFETY: a helper without arguments.
    let d = unsafe { bpf_ktime_get_ns() }.saturating_sub(ts);
    let b = 63 - (d | 1).leading_zeros();
    if let Some(h) = FLOOR_HIST.get_ptr_mut(b) {
        // SAFETY: this CPU's slot; programs on one CPU do not nest on sched_switch.
        unsafe { *h += 1 };
    }
    Some(d)
}

/// `sched_switch`: the wake-wait lower bound (a timestamp pair and a histogram bucket).
#[btf_tracepoint(function = "sched_switch")]
pub fn tk_floor_wwait(ctx: BtfTracePointContext) -> i32 {
    let _ = wake_wait(&ctx);
    bump();
    0
}

/// `sched_switch`: the same, plus a per-process switch count in a hash.
#[btf_tracepoint(function = "sched_switch")]
pub fn tk_floor_wwait_proc(ctx: BtfTracePointContext) -> i32 {
    let _ = wake_wait(&ctx);
    bump();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(v) = get_or_insert_copy(&FLOOR_PROC, &tgid, 0u64) {
        // SAFETY: a live map value pointer.
        unsafe { atomic_add(v, 1) };
    }
    0
}

/// `task_struct` offsets for the counters control (from the kernel's BTF, set before load).
#[no_mangle]
static FLOOR_TASK_OFFS: TaskOffsets = TaskOffsets::ZERO;

/// The kernel's own switch counters of each task at its last switch-out (`nvcsw`, `nivcsw`,
/// `sched_info.run_delay`, `se.nr_migrations`), by tid: the baseline a tool that counts
/// exactly what /proc says (as ctxsw does) keeps to turn them into deltas.
#[map]
static FLOOR_TASK: HashMap<u32, [u64; 4]> = HashMap::with_max_entries(16384, 0);

/// Those deltas summed per process (tgid).
#[map]
static FLOOR_PROC_CTR: HashMap<u32, [u64; 4]> = HashMap::with_max_entries(16384, 0);

/// A u64 (or, with `u32`, a u32) member of `task` at `off`.
#[inline(always)]
fn task_u64(task: *const u8, off: u32) -> u64 {
    // SAFETY: `task` is a BTF-typed task_struct pointer from a tp_btf argument, `off` a member
    // offset from the kernel's BTF; the verifier checks the load.
    unsafe { core::ptr::read_volatile(task.add(off as usize) as *const u64) }
}

#[inline(always)]
fn task_u32(task: *const u8, off: u32) -> u32 {
    // SAFETY: as in task_u64.
    unsafe { core::ptr::read_volatile(task.add(off as usize) as *const u32) }
}

/// `sched_switch`: the wake-wait lower bound, plus what counting from the kernel's own
/// counters adds on every switch: the switched-out task's four counters read, its baseline
/// looked up by tid and replaced, the deltas added to its process's row. ctxsw's cost beside
/// this control is what it records beyond the counts (pairs, per-process histograms, filters).
#[btf_tracepoint(function = "sched_switch")]
pub fn tk_floor_wwait_ctr(ctx: BtfTracePointContext) -> i32 {
    let _ = wake_wait(&ctx);
    bump();
    switch_counters(ctx.arg(1));
    0
}

/// The kernel's four switch counters of `prev` (switched out) against its baseline by tid, the
/// deltas added to its process's row.
#[inline(always)]
fn switch_counters(prev: *const u8) {
    let o = ro(&FLOOR_TASK_OFFS);
    let (tid, tgid) = (task_u32(prev, o.pid), task_u32(prev, o.tgid));
    let now = [
        task_u64(prev, o.nvcsw),
        task_u64(prev, o.nivcsw),
        task_u64(prev, o.run_delay),
        task_u64(prev, o.nr_migrations),
    ];
    let Some(base) = FLOOR_TASK.get_ptr_mut(tid) else {
        // First switch seen: the baseline only.
        let _ = FLOOR_TASK.insert(tid, now, 0);
        return;
    };
    // SAFETY: a live map value; only this task's switch-out (one CPU at a time) writes it.
    let base = unsafe { &mut *base };
    let d = [
        now[0].wrapping_sub(base[0]),
        now[1].wrapping_sub(base[1]),
        now[2].wrapping_sub(base[2]),
        now[3].wrapping_sub(base[3]),
    ];
    *base = now;
    if let Some(v) = get_or_insert_copy(&FLOOR_PROC_CTR, &tgid, [0u64; 4]) {
        // SAFETY: a live map value pointer.
        unsafe {
            let v = &mut *v;
            for (c, d) in v.iter_mut().zip(d) {
                if d != 0 {
                    atomic_add(c, d);
                }
            }
        }
    }
}

/// What each CPU switched in last: its tid and `se.sum_exec_runtime` then.
#[map]
static FLOOR_LAST_IN: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// Node of each CPU (all node 0 here: the lookup is the cost, as numa's).
#[map]
static FLOOR_CPU_NODE: Array<u32> = Array::with_max_entries(1024, 0);

/// Runs and on-CPU ns per process and node (8 nodes).
#[map]
static FLOOR_NODE_PROC: HashMap<u32, [u64; 9]> = HashMap::with_max_entries(16384, 0);

/// `sched_switch`: the least on-CPU time per process and node costs, numa's work without its
/// filters, names and fallbacks: this CPU's last switch-in swapped for `next`'s run time,
/// `prev`'s run since then read from its `se.sum_exec_runtime`, its CPU's node looked up and
/// the run added to its process's row for that node.
#[btf_tracepoint(function = "sched_switch")]
pub fn tk_floor_node(ctx: BtfTracePointContext) -> i32 {
    let o = ro(&FLOOR_TASK_OFFS);
    let (prev, next): (*const u8, *const u8) = (ctx.arg(1), ctx.arg(2));
    let Some(last) = FLOOR_LAST_IN.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; sched_switch programs do not nest on one CPU.
    let base = unsafe { *last };
    // SAFETY: as above.
    unsafe {
        *last = [
            task_u32(next, o.pid) as u64,
            task_u64(next, o.run.sum_exec_runtime),
        ]
    };
    let tid = task_u32(prev, o.pid);
    if tid == 0 || base[0] != tid as u64 {
        return 0;
    }
    bump();
    let ran = task_u64(prev, o.run.sum_exec_runtime).wrapping_sub(base[1]);
    // SAFETY: a helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let node = FLOOR_CPU_NODE.get(cpu).copied().unwrap_or(0) as u64;
    let tgid = task_u32(prev, o.tgid);
    if let Some(v) = get_or_insert_copy(&FLOOR_NODE_PROC, &tgid, [0u64; 9]) {
        // SAFETY: reads a local (the bound check must be on the index used, see numa.rs).
        let idx = unsafe { core::ptr::read_volatile(&node) };
        // SAFETY: a live map value pointer; the index is checked against the array length.
        unsafe {
            atomic_add(&raw mut (*v)[0], 1);
            if idx < 8 {
                atomic_add(&raw mut (*v)[1 + idx as usize], ran);
            }
        }
    }
    0
}

/// The run queue and its steal clock at each task's enqueue, at the task's `FLOOR_WAKE` slot.
#[map]
static FLOOR_STEAL: Array<[u64; 2]> = Array::with_max_entries(65536, 0);

/// Waits charged to the task that held the CPU: (woken, holder) by tid and tgid → count and
/// ns, the hypervisor's part under holder `u32::MAX`, as runq-lat's culprit pairs.
#[map]
static FLOOR_PAIRS: HashMap<PairKey, PairVal> = HashMap::with_max_entries(16384, 0);

/// `sched_wakeup(p)`: `p` is on its run queue; that queue and its steal clock now, as
/// runq-lat notes them for the steal part of the wait.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn tk_floor_wakeup_steal(ctx: BtfTracePointContext) -> i32 {
    let p: *const u8 = ctx.arg(0);
    if let Some(s) = FLOOR_STEAL.get_ptr_mut(wake_slot(p)) {
        let (rq, steal) = rq_steal(p, &ro(&FLOOR_TASK_OFFS));
        // SAFETY: a live array slot; a racing wakeup of a task sharing it only mixes values.
        unsafe { *s = [rq, steal] };
    }
    0
}

/// Adds one wait of `ns` to `key`.
#[inline(always)]
fn charge(key: &PairKey, ns: u64) {
    if let Some(v) = get_or_insert_copy(&FLOOR_PAIRS, key, PairVal::default()) {
        // SAFETY: a live map value pointer.
        unsafe {
            atomic_add(&raw mut (*v).count, 1);
            atomic_add(&raw mut (*v).ns, ns);
        }
    }
}

/// `sched_switch`: the counters control, plus what runq-lat adds for the waits' culprits: for a
/// wait that ends here, the steal clock of the woken task's queue read again, the wait charged
/// to the task switched out (one pair in a hash), and its stolen part to the hypervisor. What
/// runq-lat does beyond this: the CPU's holder history (a second holder charged for its part),
/// long waits counted twice (`LATE_CULPRITS`), filters and exits.
#[btf_tracepoint(function = "sched_switch")]
pub fn tk_floor_wwait_cul(ctx: BtfTracePointContext) -> i32 {
    let wait = wake_wait(&ctx);
    bump();
    let prev: *const u8 = ctx.arg(1);
    switch_counters(prev);
    let Some(wait) = wait else {
        return 0;
    };
    let next: *const u8 = ctx.arg(2);
    let o = ro(&FLOOR_TASK_OFFS);
    let (rq, steal_now) = rq_steal(next, &o);
    let stolen = match FLOOR_STEAL.get_ptr(wake_slot(next)) {
        // SAFETY: a live array slot.
        Some(s) if rq != 0 && unsafe { (*s)[0] } == rq => {
            steal_now.saturating_sub(unsafe { (*s)[1] }).min(wait)
        }
        _ => 0,
    };
    let key = PairKey {
        a: task_u32(next, o.pid),
        a_tgid: task_u32(next, o.tgid),
        b: task_u32(prev, o.pid),
        b_tgid: task_u32(prev, o.tgid),
        gen: 0,
        _pad: 0,
    };
    charge(&key, wait - stolen);
    if stolen != 0 {
        charge(
            &PairKey {
                b: u32::MAX,
                b_tgid: u32::MAX,
                ..key
            },
            stolen,
        );
    }
    0
}

/// Latency lower bound for a syscall: when each thread entered, by tid (a hash, as any tool
/// timing calls across enter and exit needs).
#[map]
static FLOOR_START: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

probes_ebpf::passing! {
    /// Enter of a timed call: remember when, by thread.
    pub fn tk_floor_ts_enter(_ctx: TracePointContext) -> u32 {
        let tid = bpf_get_current_pid_tgid() as u32;
        // SAFETY: a helper without arguments.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = FLOOR_START.insert(tid, now, 0);
        0
    }
}

probes_ebpf::passing! {
    /// Exit of a timed call: its latency into a per-CPU log2 histogram, nothing per process.
    pub fn tk_floor_ts_exit(_ctx: TracePointContext) -> u32 {
        let tid = bpf_get_current_pid_tgid() as u32;
        // SAFETY: the value is copied out before the delete.
        let Some(ts) = (unsafe { FLOOR_START.get(tid) }).copied() else {
            return 0;
        };
        let _ = FLOOR_START.remove(tid);
        // SAFETY: a helper without arguments.
        let d = unsafe { bpf_ktime_get_ns() }.saturating_sub(ts);
        let b = 63 - (d | 1).leading_zeros();
        if let Some(h) = FLOOR_HIST.get_ptr_mut(b) {
            // SAFETY: this CPU's slot; tracepoint programs do not nest on one CPU.
            unsafe { *h += 1 };
        }
        bump();
        0
    }
}

/// Block request lower bound: per request in flight, when it was inserted and issued and who
/// issued it, by `struct request *` (as any tool splitting queue time from device time per
/// process must keep).
#[map]
static FLOOR_RQ: HashMap<u64, FloorRq> = HashMap::with_max_entries(16384, 0);

#[derive(Clone, Copy)]
#[repr(C)]
pub struct FloorRq {
    insert_ns: u64,
    issue_ns: u64,
    tgid: u64,
}

/// Queue and device time per issuing process: two log2 histograms in one hash value.
#[map]
static FLOOR_IO_PROC: HashMap<u32, [u64; 64]> = HashMap::with_max_entries(4096, 0);

/// `block_rq_insert(rq)` (5.11+ prototype): the request enters a queue.
#[btf_tracepoint(function = "block_rq_insert")]
pub fn tk_floor_rq_insert(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let e = FloorRq {
        // SAFETY: a helper without arguments.
        insert_ns: unsafe { bpf_ktime_get_ns() },
        issue_ns: 0,
        tgid: bpf_get_current_pid_tgid() >> 32,
    };
    let _ = FLOOR_RQ.insert(rq, e, 0);
    0
}

/// `block_rq_issue(rq)`: to the driver; a request never inserted (scheduler `none`) starts here.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn tk_floor_rq_issue(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(e) = FLOOR_RQ.get_ptr_mut(rq) {
        // SAFETY: a live map value; one CPU handles a request at a time.
        unsafe { (*e).issue_ns = now };
        return 0;
    }
    let e = FloorRq {
        insert_ns: 0,
        issue_ns: now,
        tgid: bpf_get_current_pid_tgid() >> 32,
    };
    let _ = FLOOR_RQ.insert(rq, e, 0);
    0
}

/// `block_rq_complete(rq, error, nr_bytes)`: queue and device time into the issuer's
/// histograms (32 log2 buckets each).
#[btf_tracepoint(function = "block_rq_complete")]
pub fn tk_floor_rq_complete(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    // SAFETY: the value is copied out before the delete.
    let Some(e) = (unsafe { FLOOR_RQ.get(rq) }).copied() else {
        return 0;
    };
    let _ = FLOOR_RQ.remove(rq);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let device = now.saturating_sub(e.issue_ns);
    let queue = if e.insert_ns == 0 {
        0
    } else {
        e.issue_ns.saturating_sub(e.insert_ns)
    };
    // 512 bytes of zeros: too big for the stack, so a read-only constant, which no tunable of
    // this object can alias (none is an array; see `get_or_insert`).
    let Some(h) = get_or_insert(&FLOOR_IO_PROC, &(e.tgid as u32), &[0; 64]) else {
        return 0;
    };
    let qb = (63 - (queue | 1).leading_zeros()) & 31;
    let db = 32 + ((63 - (device | 1).leading_zeros()) & 31);
    // SAFETY: a live map value pointer; both indices are below 64.
    unsafe {
        atomic_add(&raw mut (*h)[qb as usize], 1);
        atomic_add(&raw mut (*h)[db as usize], 1);
    }
    bump();
    0
}

/// Each bio's submission time, per CPU: the least a tool timing requests from their first
/// bio's submission adds (`io-split-submit`). A lower bound, not a method: it keeps one stamp
/// per CPU, where io-lat keeps one per bio until its request is seen.
#[map]
static FLOOR_BIO_TS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `block_bio_queue`: the hook, a clock read and one store (and the counter: a run counts its
/// bios and its requests).
#[btf_tracepoint(function = "block_bio_queue")]
pub fn tk_floor_bio(_ctx: BtfTracePointContext) -> i32 {
    if let Some(p) = FLOOR_BIO_TS.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; block_bio_queue programs do not nest on one CPU. A helper
        // without arguments.
        unsafe { *p = bpf_ktime_get_ns() };
    }
    bump();
    0
}

/// The receive path's control (`net-rx-keyed`): `sk_buff`/`sock` offsets from the kernel's
/// BTF, and `SKB_CONSUMED` of its `enum skb_drop_reason` (set before load).
#[no_mangle]
static FLOOR_SKB: SkbOffsets = SkbOffsets::ZERO;
#[no_mangle]
static FLOOR_SKB_CONSUMED: u32 = 1;
/// `NET_RX_SOFTIRQ`.
#[no_mangle]
static FLOOR_NET_RX_VEC: u32 = 3;

/// Drops by (location, reason << 32 | IPv4 destination, destination port), per CPU.
#[map]
static FLOOR_DROPS: PerCpuHashMap<[u64; 3], u64> = PerCpuHashMap::with_max_entries(4096, 0);

/// Drops by receiving socket (its inode), per CPU.
#[map]
static FLOOR_SOCK_DROPS: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(4096, 0);

/// Per CPU: NET_RX softirq start, runs and time; NAPI polls and polls that used their budget.
#[map]
static FLOOR_NET_CPU: PerCpuArray<[u64; 5]> = PerCpuArray::with_max_entries(1, 0);

/// Adds one to this CPU's count of `key` in `map`, creating it.
#[inline(always)]
fn percpu_count<K>(map: &PerCpuHashMap<K, u64>, key: &K) {
    if let Some(v) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's copy; these programs do not nest on one CPU.
        unsafe { *v += 1 };
    } else {
        let _ = map.insert(key, 1, 0);
    }
}

/// `kfree_skb(skb, location, reason, rx_sk)` (6.12+ prototype): what net-rx records per drop,
/// at its least: the drop keyed by its reason and place (the IPv4 destination and port read
/// from the packet's headers) and by its socket (its inode, through `sk_socket`, `file`,
/// `f_inode`). What net-rx does beyond this: IPv6, the interface and protocols in the key,
/// bytes, the socket's buffer state and port, the `[other]` row and its filters.
#[btf_tracepoint(function = "kfree_skb")]
pub fn tk_floor_drop(ctx: BtfTracePointContext) -> i32 {
    bump();
    let skb: u64 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    let reason = ctx.arg::<u64>(2) as u32;
    let sk: u64 = ctx.arg(3);
    if reason == ro(&FLOOR_SKB_CONSUMED) {
        return 0;
    }
    let o = ro(&FLOOR_SKB);
    let head = Direct::u64(skb, o.skb_head);
    let (nh, th) = (
        Direct::u16(skb, o.skb_network_header),
        Direct::u16(skb, o.skb_transport_header),
    );
    let daddr: u32 = if head == 0 { 0 } else { probe(head + nh as u64 + 16) };
    let dport: u16 = if head == 0 { 0 } else { probe(head + th as u64 + 2) };
    percpu_count(
        &FLOOR_DROPS,
        &[location, (u64::from(reason) << 32) | u64::from(daddr), u64::from(dport)],
    );
    if sk != 0 {
        let file = Direct::u64(Direct::u64(sk, o.sk_socket), o.socket_file);
        let ino = Direct::u64(Direct::u64(file, o.file_inode), o.inode_ino);
        percpu_count(&FLOOR_SOCK_DROPS, &ino);
    }
    0
}

/// `softirq_entry`/`softirq_exit(vec)`: NET_RX time per CPU.
#[inline(always)]
fn net_softirq(vec: u32, entry: bool) {
    bump();
    if vec != ro(&FLOOR_NET_RX_VEC) {
        return;
    }
    let Some(c) = FLOOR_NET_CPU.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; softirqs do not nest on one CPU. A helper without arguments.
    unsafe {
        let now = bpf_ktime_get_ns();
        if entry {
            (*c)[0] = now;
        } else if (*c)[0] != 0 {
            (*c)[1] += 1;
            (*c)[2] += now - (*c)[0];
            (*c)[0] = 0;
        }
    }
}

#[btf_tracepoint(function = "softirq_entry")]
pub fn tk_floor_si_entry(ctx: BtfTracePointContext) -> i32 {
    net_softirq(ctx.arg::<u64>(0) as u32, true);
    0
}

#[btf_tracepoint(function = "softirq_exit")]
pub fn tk_floor_si_exit(ctx: BtfTracePointContext) -> i32 {
    net_softirq(ctx.arg::<u64>(0) as u32, false);
    0
}

/// `napi_poll(napi, work, budget)`: polls, and polls that used their whole budget, per CPU.
#[btf_tracepoint(function = "napi_poll")]
pub fn tk_floor_napi(ctx: BtfTracePointContext) -> i32 {
    bump();
    let (work, budget) = (ctx.arg::<u64>(1) as i32, ctx.arg::<u64>(2) as i32);
    if let Some(c) = FLOOR_NET_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; NAPI polls do not nest on one CPU.
        unsafe {
            (*c)[3] += 1;
            if budget > 0 && work >= budget {
                (*c)[4] += 1;
            }
        }
    }
    0
}
