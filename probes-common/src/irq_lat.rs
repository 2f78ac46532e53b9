//! `irq-lat`: shared types for hard-IRQ (`irq:irq_handler_entry/exit`) and softirq
//! (`irq:softirq_entry/exit`) time per CPU and IRQ or vector.

use crate::hist::LatHist;

/// [`IrqKey::kind`] of a hard-IRQ handler run (`num` is the IRQ number).
pub const KIND_HARD: u32 = 0;
/// [`IrqKey::kind`] of a softirq run (`num` is the vector, `NET_RX` = 3).
pub const KIND_SOFT: u32 = 1;

/// An entry found its CPU's slot still holding an entry of the same kind whose exit was never
/// seen (a missed exit): the older entry is dropped. Index into the per-CPU stats.
pub const STAT_UNFINISHED: u32 = 5;
/// An exit for another IRQ or vector than the entry held for its CPU: not recorded.
pub const STAT_MISMATCH: u32 = 6;

/// Aggregation key: one CPU, kind, IRQ or vector, generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IrqKey {
    pub cpu: u32,
    /// [`KIND_HARD`] or [`KIND_SOFT`].
    pub kind: u32,
    /// IRQ number or softirq vector.
    pub num: u32,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
}

/// What one key accumulated: each run's duration (entry to exit) and, for hard IRQs, the runs
/// whose handler returned `IRQ_NONE` (not its device's interrupt).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrqVal {
    pub unhandled: u64,
    pub hist: LatHist,
}

impl IrqVal {
    pub const ZERO: IrqVal = IrqVal {
        unhandled: 0,
        hist: LatHist::ZERO,
    };

    /// Adds another key's value (`[other]`, folding CPUs together).
    pub fn merge(&mut self, o: &IrqVal) {
        crate::add_counters!(self, o; unhandled);
        self.hist.merge(&o.hist);
    }
}

/// The run in flight on one CPU, per kind. Hard IRQs do not nest (handlers run with interrupts
/// off) and softirqs do not nest on a CPU, but a hard IRQ interrupts a softirq: one slot each.
/// `*_ns` is 0 when nothing is in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrqStart {
    pub hard_ns: u64,
    pub soft_ns: u64,
    pub hard_num: u32,
    pub soft_num: u32,
    /// Bit `1 << kind` once this CPU saw an entry of that kind: an exit without a start is a
    /// loss only after that (the first may end a run begun before the attach).
    pub armed: u32,
    pub _pad: u32,
}

crate::gen_keys!(IrqKey);
crate::impl_pod!(IrqKey, IrqVal, IrqStart);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<IrqKey>(), 16);
        assert_eq!(size_of::<IrqVal>(), 8 + size_of::<LatHist>());
        assert_eq!(size_of::<IrqStart>(), 32);
    }

    #[test]
    fn merge_adds_counts_and_histograms() {
        let mut a = IrqVal::ZERO;
        let mut b = IrqVal::ZERO;
        a.hist.record(10);
        b.hist.record(1000);
        b.unhandled = 2;
        a.merge(&b);
        assert_eq!(
            (a.hist.count, a.hist.sum, a.hist.max, a.unhandled),
            (2, 1010, 1000, 2)
        );
    }
}
