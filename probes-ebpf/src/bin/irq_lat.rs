//! `irq-lat` kernel programs: time in hard-IRQ handlers per (CPU, IRQ) and in softirqs per
//! (CPU, vector), each run's duration in a log-linear histogram, aggregated in the kernel.
//!
//! Hooks (BTF prototypes on 6.18, `btf_trace_<event>`):
//! - `irq:irq_handler_entry(int irq, struct irqaction *action)` and
//!   `irq:irq_handler_exit(int irq, struct irqaction *action, int ret)`: one pair per handler
//!   (a shared line runs each of its handlers between its own pair). `ret` 0 is `IRQ_NONE`: the
//!   handler said the interrupt was not its device's. The handler's name (`action->name`, the
//!   classic event's `__data_loc name`) is not read per event: userspace names IRQ numbers from
//!   `/proc/interrupts`, one read per window.
//! - `irq:softirq_entry/exit(unsigned int vec_nr)`.
//!
//! Each in three modes, cheapest first: tp_btf, raw_tp, and the classic tracepoint (fields
//! `irq`, `ret`, `vec` at offsets from the format files, passed in as globals; `passing!` so
//! that `perf record -e irq:*` beside us still sees every event).
//!
//! Nothing is filtered by task: an interrupt runs on behalf of no process. The run in flight
//! is one slot per CPU and kind (see [`IrqStart`]); time is recorded at the exit, under the
//! generation current then.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    irq_lat::{IrqKey, IrqStart, IrqVal, KIND_HARD, KIND_SOFT, STAT_MISMATCH, STAT_UNFINISHED},
    stats,
};
use probes_ebpf::{atomic_add, generation, hist_record, ro, slot, stat};

/// Classic-tracepoint field offsets from the format files (`irq_handler_entry.irq`,
/// `irq_handler_exit.irq`, `irq_handler_exit.ret`, `softirq_entry.vec`, `softirq_exit.vec`).
#[no_mangle]
static IRQ_TP_ENTRY_IRQ: u32 = 8;
#[no_mangle]
static IRQ_TP_EXIT_IRQ: u32 = 8;
#[no_mangle]
static IRQ_TP_EXIT_RET: u32 = 12;
#[no_mangle]
static IRQ_TP_SOFT_VEC: u32 = 8;
#[no_mangle]
static IRQ_TP_SOFTX_VEC: u32 = 8;

/// Aggregates per (CPU, kind, IRQ or vector, generation). Each CPU writes only its own keys.
/// Sized by userspace (possible CPUs × (vectors + IRQs) × 2, capped by `--max-keys`).
#[map]
static IRQ_AGG: HashMap<IrqKey, IrqVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `IRQ_AGG`, one row per generation: the `[other]` row.
#[map]
static IRQ_OTHER: Array<IrqVal> = Array::with_max_entries(2, 0);

/// The zero value new keys start from (nothing in it is ever written: a nested program on the
/// same CPU, a hard IRQ during a softirq's exit, may use it at the same time).
#[map]
static IRQ_SCRATCH: PerCpuArray<IrqVal> = PerCpuArray::with_max_entries(1, 0);

/// The hard IRQ and the softirq in flight on each CPU.
#[map]
static IRQ_START: PerCpuArray<IrqStart> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn start_slot() -> Option<&'static mut IrqStart> {
    // SAFETY: this CPU's slot. Only the entry and exit programs of one kind write its half,
    // and runs of one kind do not nest on a CPU; a hard IRQ's programs may interrupt a
    // softirq's, but touch only the hard half (the `armed` bits are set once).
    IRQ_START.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn on_entry(kind: u32, num: u32) {
    let Some(s) = start_slot() else { return };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let bit = 1 << kind;
    if s.armed & bit == 0 {
        s.armed |= bit;
    }
    if kind == KIND_HARD {
        if s.hard_ns != 0 {
            stat(STAT_UNFINISHED);
        }
        s.hard_ns = now;
        s.hard_num = num;
    } else {
        if s.soft_ns != 0 {
            stat(STAT_UNFINISHED);
        }
        s.soft_ns = now;
        s.soft_num = num;
    }
}

#[inline(always)]
fn on_exit(kind: u32, num: u32, unhandled: bool) {
    let Some(s) = start_slot() else { return };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let (t, n) = if kind == KIND_HARD {
        let v = (s.hard_ns, s.hard_num);
        s.hard_ns = 0;
        v
    } else {
        let v = (s.soft_ns, s.soft_num);
        s.soft_ns = 0;
        v
    };
    if t == 0 {
        // The first exit on a CPU may end a run that began before the attach: not a loss.
        if s.armed & (1 << kind) != 0 {
            stat(stats::NO_START);
        }
        return;
    }
    if n != num {
        stat(STAT_MISMATCH);
        return;
    }
    let gen = generation();
    let key = IrqKey {
        // SAFETY: plain helper call.
        cpu: unsafe { bpf_get_smp_processor_id() },
        kind,
        num,
        gen,
    };
    let Some(at) = slot(&IRQ_AGG, &IRQ_OTHER, &IRQ_SCRATCH, &key, gen, |_| {}) else {
        return;
    };
    stat(stats::EVENTS);
    // SAFETY: `at.ptr` is a live value of IRQ_AGG or IRQ_OTHER from this run's lookup.
    unsafe {
        hist_record(&raw mut (*at.ptr).hist, now.saturating_sub(t));
        if unhandled {
            atomic_add(&raw mut (*at.ptr).unhandled, 1);
        }
    }
}

#[btf_tracepoint(function = "irq_handler_entry")]
pub fn tk_irq_hard_entry(ctx: BtfTracePointContext) -> i32 {
    on_entry(KIND_HARD, ctx.arg::<u64>(0) as u32);
    0
}

#[btf_tracepoint(function = "irq_handler_exit")]
pub fn tk_irq_hard_exit(ctx: BtfTracePointContext) -> i32 {
    on_exit(
        KIND_HARD,
        ctx.arg::<u64>(0) as u32,
        ctx.arg::<u64>(2) as u32 == 0,
    );
    0
}

#[btf_tracepoint(function = "softirq_entry")]
pub fn tk_irq_soft_entry(ctx: BtfTracePointContext) -> i32 {
    on_entry(KIND_SOFT, ctx.arg::<u64>(0) as u32);
    0
}

#[btf_tracepoint(function = "softirq_exit")]
pub fn tk_irq_soft_exit(ctx: BtfTracePointContext) -> i32 {
    on_exit(KIND_SOFT, ctx.arg::<u64>(0) as u32, false);
    0
}

#[raw_tracepoint(tracepoint = "irq_handler_entry")]
pub fn tk_irq_hard_entry_raw(ctx: RawTracePointContext) -> i32 {
    on_entry(KIND_HARD, ctx.arg::<u64>(0) as u32);
    0
}

#[raw_tracepoint(tracepoint = "irq_handler_exit")]
pub fn tk_irq_hard_exit_raw(ctx: RawTracePointContext) -> i32 {
    on_exit(
        KIND_HARD,
        ctx.arg::<u64>(0) as u32,
        ctx.arg::<u64>(2) as u32 == 0,
    );
    0
}

#[raw_tracepoint(tracepoint = "softirq_entry")]
pub fn tk_irq_soft_entry_raw(ctx: RawTracePointContext) -> i32 {
    on_entry(KIND_SOFT, ctx.arg::<u64>(0) as u32);
    0
}

#[raw_tracepoint(tracepoint = "softirq_exit")]
pub fn tk_irq_soft_exit_raw(ctx: RawTracePointContext) -> i32 {
    on_exit(KIND_SOFT, ctx.arg::<u64>(0) as u32, false);
    0
}

probes_ebpf::passing! {
    pub fn tk_irq_hard_entry_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from irq_handler_entry's format file; read_at goes through the helper.
        if let Ok(irq) = unsafe { ctx.read_at::<u32>(ro(&IRQ_TP_ENTRY_IRQ) as usize) } {
            on_entry(KIND_HARD, irq);
        }
        0
    }
}

probes_ebpf::passing! {
    pub fn tk_irq_hard_exit_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offsets from irq_handler_exit's format file; read_at goes through the helper.
        let irq = unsafe { ctx.read_at::<u32>(ro(&IRQ_TP_EXIT_IRQ) as usize) };
        // SAFETY: as above.
        let ret = unsafe { ctx.read_at::<u32>(ro(&IRQ_TP_EXIT_RET) as usize) }.unwrap_or(1);
        if let Ok(irq) = irq {
            on_exit(KIND_HARD, irq, ret == 0);
        }
        0
    }
}

probes_ebpf::passing! {
    pub fn tk_irq_soft_entry_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from softirq_entry's format file; read_at goes through the helper.
        if let Ok(vec) = unsafe { ctx.read_at::<u32>(ro(&IRQ_TP_SOFT_VEC) as usize) } {
            on_entry(KIND_SOFT, vec);
        }
        0
    }
}

probes_ebpf::passing! {
    pub fn tk_irq_soft_exit_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from softirq_exit's format file; read_at goes through the helper.
        if let Ok(vec) = unsafe { ctx.read_at::<u32>(ro(&IRQ_TP_SOFTX_VEC) as usize) } {
            on_exit(KIND_SOFT, vec, false);
        }
        0
    }
}
