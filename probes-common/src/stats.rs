//! Per-CPU counters every tool keeps about what it could not record. Userspace sums them over
//! CPUs and prints them in the report header, so "nothing was missed" is a measured statement.

/// Events the programs handled (after filtering).
pub const EVENTS: u32 = 0;
/// A begin event could not be remembered: the in-flight map was full.
pub const START_MAP_FULL: u32 = 1;
/// A new key did not fit the aggregation map; its value went to the `[other]` row.
pub const KEY_MAP_FULL: u32 = 2;
/// A streamed record was dropped because the ring buffer was full.
pub const RINGBUF_FULL: u32 = 3;
/// An end event had no matching begin although the begin should have been seen.
pub const NO_START: u32 = 4;
/// Slots 5..10 are tool-specific (e.g. `sched::STAT_PAIR_MAP_FULL`).
/// Number of slots in the per-CPU stats array.
pub const NSTATS: u32 = 10;

/// Human names, indexed like the constants above.
pub const NAMES: [&str; NSTATS as usize] = [
    "events",
    "start_map_full",
    "key_map_full",
    "ringbuf_full",
    "no_start",
    "reserved5",
    "reserved6",
    "reserved7",
    "reserved8",
    "reserved9",
];

/// Contents of the one-element `CONTROL` array map every tool has: userspace flips `gen` at each
/// interval boundary, the kernel writes new data under the current generation, and userspace then
/// drains the previous one. Per-interval values (max included) are exact and nothing is lost
/// between a read and a reset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    pub gen: u32,
    pub _pad: u32,
    /// When the generation `gen` began (`CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_ns`),
    /// written with it in one map update; 0 for the first (it began at the attach). A program
    /// clips an interval that began before it, so a window's share of time counts only the
    /// part of a call inside the window.
    pub since_ns: u64,
}

crate::impl_pod!(Control);
