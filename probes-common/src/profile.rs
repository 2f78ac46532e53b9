//! `profile`: shared types for the CPU-clock sampling program (`perf_event` on
//! `PERF_COUNT_SW_CPU_CLOCK`, one per online CPU). Samples are counted in the kernel per
//! (process, thread, user stack, kernel stack); the stacks themselves live in a stack-trace map
//! keyed by the ids `bpf_get_stackid` returns.

use crate::COMM_LEN;

/// A stack id that could not be recorded (`bpf_get_stackid` failed, or the sample had no stack
/// of that kind: no kernel stack when it interrupted user code, no user stack for kernel
/// threads).
pub const NO_STACK: i32 = -1;

/// Per-CPU stats slots of the profile object (after the shared ones of [`crate::stats`]).
/// A stack whose hash bucket held another stack (`bpf_get_stackid` answered EEXIST): the
/// sample is counted, its stack of that kind is lost.
pub const STAT_STACK_COLLIDED: u32 = 5;
/// A user stack could not be walked (EFAULT or another error, not a collision) for a task that
/// has a user address space.
pub const STAT_USTACK_FAILED: u32 = 6;
/// Samples that hit an idle CPU (pid 0): counted, not keyed.
pub const STAT_IDLE: u32 = 7;

/// Aggregation key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProfileKey {
    pub tgid: u32,
    pub pid: u32,
    /// Id in the stack-trace map, or [`NO_STACK`].
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
    /// Id in `PY_STACKS` of the Python stack, or 0 (not a Python thread, or none found).
    pub py_stack: u32,
}

/// Aggregated value per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileVal {
    /// `comm` of the thread when the key was created.
    pub comm: [u8; COMM_LEN],
    pub samples: u64,
}

/// Bytes of user stack copied per sample in DWARF mode (from the user stack pointer up).
pub const DWARF_STACK: usize = 8192;

/// One sample in DWARF mode (`PROFILE_DWARF` set), streamed through the `PROFILE_SAMPLES` ring
/// buffer: the user registers the unwinder starts from and a copy of the user stack above `sp`,
/// unwound in userspace with the binaries' `.eh_frame` tables.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DwarfSample {
    pub tgid: u32,
    pub pid: u32,
    /// Id in the stack-trace map, or [`NO_STACK`].
    pub kernel_stack: i32,
    /// Bytes of `stack` that hold the user stack from `sp` up (0: it could not be read).
    pub len: u32,
    /// Id in `PY_STACKS` of the Python stack, or 0.
    pub py_stack: u32,
    pub _pad: u32,
    /// User registers at the sample (the task's saved user registers when the sample hit the
    /// kernel).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub comm: [u8; COMM_LEN],
    pub stack: [u8; DWARF_STACK],
}

crate::gen_keys!(ProfileKey);
crate::impl_pod!(ProfileKey, ProfileVal, DwarfSample);

/// `profile --off-cpu` (object `offcpu`): switch-outs not recorded as waits because the task
/// was still runnable (a preemption, a yield): not off-CPU waits. Same slot as
/// [`STAT_IDLE`], which the off-CPU object does not use.
pub const STAT_RUNNABLE: u32 = 7;

/// `profile --off-cpu`: one blocked task, from its switch-out until its switch-in, by tid.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuStart {
    /// `bpf_ktime_get_ns()` at the switch-out.
    pub start_ns: u64,
    /// At the task's wakeup (`sched_waking`); 0 until then.
    pub wake_ns: u64,
    pub tgid: u32,
    /// Ids in the stack-trace map, or [`NO_STACK`].
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// Id in `PY_STACKS` of the Python stack, or 0.
    pub py_stack: u32,
    pub comm: [u8; COMM_LEN],
}

/// `profile --off-cpu`: blocked time per (process, thread, user stack, kernel stack)
/// ([`ProfileKey`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuVal {
    pub comm: [u8; COMM_LEN],
    /// Blocked time, ns: switch-out to wakeup (to switch-in when the wakeup was not seen).
    pub ns: u64,
    /// Blocks of at least the minimum duration.
    pub blocks: u64,
}

crate::impl_pod!(OffCpuStart, OffCpuVal);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<ProfileKey>(), 24);
        assert_eq!(size_of::<ProfileVal>(), COMM_LEN + 8);
        assert_eq!(size_of::<DwarfSample>(), 48 + COMM_LEN + DWARF_STACK);
        assert_eq!(size_of::<OffCpuStart>(), 32 + COMM_LEN);
        assert_eq!(size_of::<OffCpuVal>(), COMM_LEN + 16);
    }
}
