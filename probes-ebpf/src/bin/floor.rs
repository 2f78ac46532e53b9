//! The benchmark's floor: the cheapest possible program on a hook (bump a per-CPU counter), so
//! `cargo xtask bench` can say how much of a tool's cost is the hook itself and how much is the
//! tool. Not a user-facing tool (`tracekit bench-floor` is hidden).
#![no_std]
#![no_main]

// The library provides the panic handler.
use probes_ebpf as _;

use aya_ebpf::{
    macros::{btf_tracepoint, map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
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

#[tracepoint]
pub fn tk_floor_tp(_ctx: TracePointContext) -> u32 {
    bump();
    0
}

/// The raw `sys_enter` tracepoint: the floor of what every syscall pays under `fsync-lat`.
#[btf_tracepoint(function = "sys_enter")]
pub fn tk_floor_sys(_ctx: BtfTracePointContext) -> i32 {
    bump();
    0
}
