//! `ctxsw` kernel programs: voluntary/involuntary switches, migrations, run-queue waits and
//! preemptors per process. All the work is in `sched.rs` (shared with `runq-lat`); see there
//! for the hooks, the fields read and the cost argument.
#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

#[path = "sched.rs"]
mod sched;

#[btf_tracepoint(function = "sched_switch")]
pub fn tk_ctxsw_switch(ctx: BtfTracePointContext) -> i32 {
    sched::on_switch::<sched::Direct>(
        ctx.arg::<u64>(0) & 1 != 0,
        ctx.arg(1),
        ctx.arg(2),
        sched::prev_state(|| ctx.arg::<u64>(3)),
    );
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn tk_ctxsw_switch_raw(ctx: RawTracePointContext) -> i32 {
    sched::on_switch::<sched::Probe>(
        ctx.arg::<u64>(0) & 1 != 0,
        ctx.arg(1),
        ctx.arg(2),
        sched::prev_state(|| ctx.arg::<u64>(3)),
    );
    0
}

#[btf_tracepoint(function = "sched_process_free")]
pub fn tk_ctxsw_free(ctx: BtfTracePointContext) -> i32 {
    sched::on_free::<sched::Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn tk_ctxsw_free_raw(ctx: RawTracePointContext) -> i32 {
    sched::on_free::<sched::Probe>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_process_exec")]
pub fn tk_ctxsw_exec(_ctx: BtfTracePointContext) -> i32 {
    sched::on_exec();
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn tk_ctxsw_exec_raw(_ctx: RawTracePointContext) -> i32 {
    sched::on_exec();
    0
}
