//! `profile` kernel program: CPU-clock sampling with kernel and user stacks.
//!
//! `tk_profile` runs on a `perf_event` (`PERF_COUNT_SW_CPU_CLOCK`, one event per online CPU at
//! `--freq` Hz; the software clock exists in virtual machines that lack a hardware PMU). Each
//! sample takes the interrupted task's kernel and user stacks with `bpf_get_stackid` (frame
//! pointers; the stacks live in `PROFILE_STACKS`, deduplicated by hash) and counts one in
//! `PROFILE_COUNTS` under (tgid, tid, user stack id, kernel stack id), so userspace reads one
//! row per distinct stack pair instead of one record per sample.
//!
//! What could not be recorded is counted: a stack whose bucket held another stack (EEXIST,
//! `STAT_STACK_COLLIDED`; the sample still counts, without that stack), a user stack that failed
//! otherwise (`STAT_USTACK_FAILED`), a key that did not fit (`KEY_MAP_FULL`, the sample goes to
//! `[other]`). Idle samples (pid 0) are only counted (`STAT_IDLE`), for the share of all CPU.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK},
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext},
};
use probes_common::{
    profile::{
        ProfileKey, ProfileVal, NO_STACK, STAT_IDLE, STAT_STACK_COLLIDED, STAT_USTACK_FAILED,
    },
    stats,
};
use probes_ebpf::{allowed, atomic_add, generation, slot, stat};

/// Stacks by id (frame addresses, innermost first). Sized by userspace.
#[map]
static PROFILE_STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);

/// Samples per (process, thread, user stack, kernel stack, generation). Sized by userspace.
#[map]
static PROFILE_COUNTS: HashMap<ProfileKey, ProfileVal> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Samples whose key did not fit, one row per generation.
#[map]
static PROFILE_OTHER: Array<ProfileVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys (comm filled in, count zero).
#[map]
static PROFILE_SCRATCH: PerCpuArray<ProfileVal> = PerCpuArray::with_max_entries(1, 0);

const EEXIST: i32 = 17;

/// The id of the current stack of one kind, or [`NO_STACK`]; a collision is counted.
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, flags: u64) -> (i32, i32) {
    match ctx.get_stackid(&PROFILE_STACKS, flags) {
        Ok(id) => (id as i32, 0),
        Err(e) => {
            if e == -EEXIST {
                stat(STAT_STACK_COLLIDED);
            }
            (NO_STACK, e)
        }
    }
}

#[perf_event]
pub fn tk_profile(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if pid == 0 {
        stat(STAT_IDLE);
        return 0;
    }
    if !allowed(tgid) {
        return 0;
    }
    stat(stats::EVENTS);
    let (kernel_stack, _) = stack_id(&ctx, 0);
    let (user_stack, uerr) = stack_id(&ctx, BPF_F_USER_STACK as u64);
    // EFAULT: no user stack (kernel threads); EEXIST is counted above.
    if uerr != 0 && uerr != -EEXIST && uerr != -14 {
        stat(STAT_USTACK_FAILED);
    }
    let gen = generation();
    let key = ProfileKey {
        tgid,
        pid,
        user_stack,
        kernel_stack,
        gen,
        _pad: 0,
    };
    let init = |v: *mut ProfileVal| {
        // SAFETY: this CPU's scratch slot (see `slot`).
        unsafe { (*v).comm = bpf_get_current_comm().unwrap_or([0; 16]) };
    };
    if let Some(s) = slot(
        &PROFILE_COUNTS,
        &PROFILE_OTHER,
        &PROFILE_SCRATCH,
        &key,
        gen,
        init,
    ) {
        // SAFETY: a live map value from this run.
        unsafe { atomic_add(&raw mut (*s.ptr).samples, 1) };
    }
    0
}
