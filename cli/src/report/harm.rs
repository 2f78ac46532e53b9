//! The harm model: how a finding measures what its victim felt, and every threshold that decides
//! who is a victim, each beside the measurement behind it. Tools compute their findings with
//! these; `triage` ranks them by the score they give (README, "How triage judges harm").
//!
//! A process that mostly sleeps and is woken often (a server, an event loop, a timer loop) is
//! latency-sensitive: each wakeup is work someone waits for, and what its clients feel is the
//! tail of its waits, not their total. Such a process is judged by its **late waits**: wakeups
//! that waited for a CPU more than [`LATE_FACTOR`] times its own median wait (what a wakeup
//! costs it when the CPU is not contended) and at least [`LATE_FLOOR_NS`]. Its score is the
//! **excess wait per second of wall time**: the sum, over its late waits, of how much longer
//! each waited than its median, divided by the window. The unit is the one every stall finding
//! uses (ns of the victim's time per second), so a sleeper that loses 3 % of its time in 30 ms
//! stalls scores about 30 ms/s and ranks above a process that lost 2 % to a spread of short waits
//! (which has no late waits at all).
//!
//! CPU-bound processes preempted by each other are not victims: they slow each other, which is
//! what sharing a CPU means. Where they wait long after their preemptions
//! ([`MIN_PREEMPT_NS_PER_S`]) the node (or their CPUs) is saturated: one finding, the hogs as its
//! culprits, ranked below any victim they hurt. A process that asked to wait (nice
//! [`LOW_PRIORITY_NICE`] or more, `SCHED_BATCH`, `SCHED_IDLE`) is never a victim of run-queue
//! delay nor a hog of the saturation (it yields to the others), and a kernel thread is never the culprit to renice. Nor is a kernel thread judged by
//! its tail: per-CPU workers woken beside a hog always have one, and what their delay costs is
//! felt in the work they serve, which its own tool measures (net-rx drops, io-lat): a starved
//! kernel thread's finding ranks as a rate, after any time a process lost.
//!
//! A stall (fsync, compaction, reclaim) is scored per second of the time its victim was alive
//! in the window ([`per_second_alive`]).
//!
//! A receiver whose packets are dropped loses that share of its work: a datagram dropped at a
//! full socket buffer is a request never served, a dropped TCP segment one that waits for its
//! retransmission. A drop finding is scored as that share of its time ([`lost_share_ns_per_s`]:
//! losing 6 % of its datagrams scores 60 ms/s), on the scale every stall uses; a drop rate
//! alone (packets/s) said nothing about the receiver and always ranked below any time lost.

use probes_common::hist::{bucket_mid, LatHist};

use crate::report::hist::stats;

/// Below this a stall is not worth a finding: 5 ms per second (0.5 % of the time).
pub const MIN_NS_PER_S: u64 = 5_000_000;

/// A wake wait is late above this many times the process's median wake wait. Measured with
/// `runq-lat` over 10 s on two CPUs beside the root tests' first innocents (a 3 ms-on/7 ms-off
/// burster and a page-cache writer, each woken about 100 times a second): their p99 wake waits
/// were 4.0× and 4.8× their medians; a 1 ms sleeper pinned to the burster's CPU had p99 10.8×
/// (median 17 µs, p99 189 µs); beside two CPU hogs at nice 0 its p99.9 was 690× its median
/// (8.7 µs, 6.0 ms). Beside today's burster (0.5 ms on, 1 ms off) the writer's p99 is 18.8× its
/// median (30 µs, 0.56 ms: it waits out a run), which [`LATE_FLOOR_NS`] keeps from being late.
pub const LATE_FACTOR: u64 = 8;

/// A wake wait shorter than this is never late, however small the median: in the same runs the
/// innocents' longest waits were 0.25 ms and 2.5 ms (one wait in 980); a request that waits 1 ms
/// for a CPU is felt by its client. With it, the sleeper beside the burster alone scored
/// 13 ms/s (63 of 8,934 wakeups late, max 3.4 ms: it does wait behind the burster's 3 ms runs),
/// and beside the two hogs 27 ms/s (1 in 121 late, max 6.2 ms; its own clock's longest sleep
/// overshoot 6.3 ms).
pub const LATE_FLOOR_NS: u64 = 1_000_000;

/// Latency-sensitive means woken at least this often (a timer loop at 50 Hz, a server with a
/// few requests a second is not judged by its tail: too few waits for a p99.9).
pub const MIN_WAKEUPS_PER_S: f64 = 20.0;

/// At least this share of the wakeups late (parts per million: 1 in 1000) and at least
/// [`MIN_LATE_WAITS`] of them, so that one unlucky wait in a window is not a victim.
pub const MIN_LATE_PPM: u64 = 1_000;
pub const MIN_LATE_WAITS: u64 = 5;

/// A latency victim judged by its tail is named only when processes someone could change (not
/// the idle CPU, kernel threads, tasks that are gone) held its CPU for at least this share of
/// its long waits (those of [`LATE_FLOOR_NS`] or more, runq-lat's `late_waits_behind`), in parts
/// per million: the culprit is measured as the cause of the waits it felt. Beside the two hogs
/// at nice 0, the hogs held 208 ms of the sleeper's 6 s window of long waits (its excess: 208 ms);
/// beside the fsync incident, the page-cache writer's long waits were spent behind the 3 ms
/// burster (58.8 ms of them) though most of the burster's 52 ms of its waits overall were short:
/// the long waits decide. An earlier rule over all waits named a victim for holders of its short
/// waits; in the THP incident an innocent's excess (45 ms) was spent behind kswapd, kcompactd and
/// an idle CPU: memory pressure, which memstall names.
pub const MIN_CULPRIT_SHARE_PPM: u64 = 500_000;

/// A latency victim's long waits are the kernel's deferred interrupt work when its CPU's
/// `ksoftirqd/N` held the CPU for at least [`MIN_CULPRIT_SHARE_PPM`] of them and that CPU spent
/// at least this share of the window in softirqs (`/proc/stat`, parts per million): 10 %,
/// irq-lat's storm line. ksoftirqd runs softirq work that overflowed what an interrupt's exit
/// may do (2 ms or 10 rounds), so on a CPU this busy with softirqs its runs are that work, and
/// what to change is where the work runs (RPS, IRQ affinity) or where the victim runs. Staged:
/// lo's receive work steered to CPU 1 with RPS under a UDP flood sent from CPU 0, a sleeper
/// woken every 250 µs (or 1 ms) pinned to CPU 1. With iperf3 as the sender CPU 1 spent 20-26 %
/// of its time in softirqs (irq-lat: 21.9 %, NET_RX) and ksoftirqd/1 held 28-85 % of the
/// sleeper's long waits in six runs, over half in four (kdamond and the idle CPU most of the
/// rest), 10-28 of its 4,200-12,500 waits over 1 ms: a mild tail, at most 13 ms/s. With the
/// root test's sender (a send loop at SCHED_IDLE) CPU 1 spent 78-89 % of the sleeper's run in
/// softirqs and ksoftirqd/1 held 92-94 % of its waits: 1 in 3-5 wakeups late, or (its median
/// wait 1.0-1.1 ms) half its time waiting.
pub const MIN_SOFTIRQ_CPU_PPM: u64 = 100_000;

/// A process slowed in its sync calls is linked to another issuer of the disk under its file
/// when that issuer took at least this share of the disk's request time charged to someone in
/// the window (parts per million: half), and more than the victim's own requests: then most of
/// what the victim waited behind was the other's. Kernel threads' own requests (jbd2's journal
/// commits, which every fsync waits for, and cache flushes) are charged to no one. On a fresh
/// machine, counted in, the journal (1.4 s of loop0's request time in 8 s beside a WAL loop)
/// held a bulk rewriter's writeback at 50–52 % of the disk, on the line, and the same writer
/// held at its memory cgroup's limit under it; of the charged time the rewriter's share was
/// 75–79 % and the limited writer's 61–62 % in four runs each, the loop's own 21–39 %.
pub const MIN_DISK_SHARE_PPM: u64 = 500_000;

/// Writeback that took the disk from a process's sync calls is charged to the process that
/// dirtied at least this share of the disk's dirtied bytes in the window (half). Measured: a
/// bulk rewriter dirtied 880 MB of loop0's 896 MB beside a WAL-like fsync loop's 13 MB and
/// jbd2's 3 MB, so one dirtier behind most writeback stands far above the line.
pub const MIN_DIRTIED_SHARE_PPM: u64 = 500_000;

/// A process stalled at its memory cgroup's limit is linked to another process of the cgroup
/// whose allocations made it reclaim at least this share of the pages it reclaimed in the
/// window (half), and more than its own. Measured on a 32 MiB cgroup (v1): `dd` writing the
/// page cache at about 1 GB/s beside a service allocating 4 MiB every 20 ms made 87 % of the
/// 1.8 M pages reclaimed (the service 13 %); the service, which alone never reclaims, stalled
/// 885 times, 9 % of its time, max 33 ms, and its own clock saw every allocation over 1 ms
/// (p99 17.7 ms, max 36 ms).
pub const MIN_FILLER_SHARE_PPM: u64 = 500_000;

/// A process that spends 5 % of the window waiting for a CPU after its wakeups is starved
/// where it matters whatever its tail (a latency-sensitive one scores the larger of its excess
/// and its whole wait) (each wakeup is work someone waits for). Below that, waits
/// are what any busy node shows: on two loaded CPUs every process waits 0.5–2 % of its time
/// (measured with the root tests' innocent workloads beside a compiler), and naming them all
/// buries the victim.
pub const MIN_WAKE_NS_PER_S: u64 = 50_000_000;

/// A CPU-bound process waiting this long after its preemptions is starved of CPU time (10 %
/// of the window runnable but not running): below that its CPUs are shared, not saturated.
pub const MIN_PREEMPT_NS_PER_S: u64 = 100_000_000;

/// Below this a process's sync time (fsync and its family) is not worth a finding: 2 % of the
/// window. A WAL or ledger that syncs on every commit loses far more (the append-and-fsync loop
/// of the triage tests: 9.99 s of 10 s).
pub const MIN_FSYNC_NS_PER_S: u64 = 20_000_000;

/// A memory stall (direct reclaim) worth a finding is one its process felt: a single stall of
/// this long or more (the pause a request notices)...
pub const FELT_STALL_NS: u64 = 1_000_000;
/// ... or stalls adding up to this share of the time it was alive (0.5 %, in parts per
/// million). A process whose THP fault reclaimed once for 53 µs in an 8 s window was named
/// beside the real victim before.
pub const FELT_SHARE_PPM: u64 = 5_000;

/// A process switching this often is in a storm: a switch costs 1.5-5 µs of CPU directly
/// (`perf bench sched pipe` here: ~3 µs per round trip of two switches) plus cold caches after
/// it, so 10,000/s is 2-5 % of a CPU spent switching, and it marks work handed over one item at
/// a time (a lock or queue handoff) or too many runnable threads per CPU.
pub const STORM_PER_S: f64 = 10_000.0;

/// A process at this nice level or above asked to give way: its waits are not harm.
pub const LOW_PRIORITY_NICE: i64 = 10;

/// A stall's score is the time lost per second of the time the victim was alive in the
/// window, with at least this much life counted: a `dd` alive for 0.3 s that spent 72 % of it
/// in direct compaction felt more than a long-running process that lost 3 % of its 8 s, though
/// both lost about 0.23 s (seen in the THP incident of the triage tests); the floor keeps a
/// process that lived for a millisecond from outranking everyone with a millisecond's stall.
pub const MIN_LIFE_NS: u64 = 1_000_000_000;

/// The score of a stall: `lost_ns` per second of `alive_ns` (0: the whole window) within a
/// window of `window_ns`, counting at least [`MIN_LIFE_NS`] (or the window, if shorter).
pub fn per_second_alive(lost_ns: u64, alive_ns: u64, window_ns: u64) -> u64 {
    let life = if alive_ns == 0 {
        window_ns
    } else {
        alive_ns.min(window_ns)
    };
    let life = life.max(MIN_LIFE_NS.min(window_ns)).max(1);
    (lost_ns as u128 * 1_000_000_000 / life as u128).min(u64::MAX as u128) as u64
}

/// The score of lost traffic: `lost` of `lost + delivered` packets, as that share of a second
/// (ns/s; everything lost is 10^9). `delivered` may be a bound from above (the node's count
/// where the receiver's own is not kept), which makes the score a bound from below.
pub fn lost_share_ns_per_s(lost: u64, delivered: u64) -> u64 {
    let all = (lost as u128 + delivered as u128).max(1);
    (lost as u128 * 1_000_000_000 / all) as u64
}

/// The tail of one process's waits after wakeups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tail {
    pub waits: u64,
    /// Its median wait: what a wakeup usually costs it in this window.
    pub typical_ns: u64,
    /// Waits longer than this are late (see [`LATE_FACTOR`], [`LATE_FLOOR_NS`]).
    pub late_ns: u64,
    pub late: u64,
    /// Σ (wait − typical) over the late waits.
    pub excess_ns: u64,
    /// Σ of the waits of [`LATE_FLOOR_NS`] or more: the time the holders of the long waits
    /// (runq-lat's `late_waits_behind`) share.
    pub long_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Tail {
    /// The tail of `h` (bucket midpoints, clamped to the exact min and max: each within 6.25 %).
    pub fn of(h: &LatHist) -> Tail {
        let s = stats(h);
        let typical = s.p50_ns;
        let late_ns = typical.saturating_mul(LATE_FACTOR).max(LATE_FLOOR_NS);
        let lo = h.min().unwrap_or(0);
        let (mut late, mut excess, mut long) = (0u64, 0u64, 0u64);
        for (i, &c) in h.buckets.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let v = bucket_mid(i).min(h.max).max(lo);
            if v >= LATE_FLOOR_NS {
                long = long.saturating_add(c.saturating_mul(v));
            }
            if v > late_ns {
                late += c;
                excess = excess.saturating_add(c.saturating_mul(v - typical));
            }
        }
        Tail {
            waits: h.count,
            typical_ns: typical,
            late_ns,
            late,
            excess_ns: excess,
            long_ns: long,
            p99_ns: s.p99_ns,
            p999_ns: s.p999_ns,
            max_ns: s.max_ns,
        }
    }

    /// One wakeup in how many was late (rounded), for the finding's words.
    pub fn one_in(&self) -> u64 {
        if self.late == 0 {
            return 0;
        }
        (self.waits as f64 / self.late as f64).round().max(1.0) as u64
    }

    /// Excess wait per second of a `secs` window: the score of a latency victim.
    pub fn excess_ns_per_s(&self, secs: f64) -> u64 {
        (self.excess_ns as f64 / secs.max(1e-9)) as u64
    }
}

/// Whether a process that was woken `wakeups` times and preempted `preemptions` times in a
/// `secs` window is latency-sensitive: woken often, and mostly asleep rather than CPU-bound.
pub fn latency_sensitive(wakeups: u64, preemptions: u64, secs: f64) -> bool {
    wakeups as f64 / secs.max(1e-9) >= MIN_WAKEUPS_PER_S && wakeups >= preemptions
}

/// Whether a latency-sensitive process's tail is harm worth a finding.
pub fn tail_is_harm(t: &Tail, secs: f64) -> bool {
    t.late >= MIN_LATE_WAITS
        && t.late.saturating_mul(1_000_000) >= t.waits.saturating_mul(MIN_LATE_PPM)
        && t.excess_ns_per_s(secs) >= MIN_NS_PER_S
}

/// Whether a process with this priority asked to give way to others (its waits are no harm).
pub fn asked_to_wait(nice: i64, policy: u32) -> bool {
    // SCHED_BATCH = 3, SCHED_IDLE = 5 (include/uapi/linux/sched.h).
    nice >= LOW_PRIORITY_NICE || policy == 3 || policy == 5
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[(u64, u64)]) -> LatHist {
        let mut h = LatHist::ZERO;
        for &(v, n) in values {
            for _ in 0..n {
                h.record(v);
            }
        }
        h
    }

    #[test]
    fn a_sleeper_behind_hogs_has_a_tail_and_a_shared_cpu_has_none() {
        // 10 s of a 1 ms sleeper: 9,900 wakeups at 10 µs, 100 waits of 30 ms behind a hog.
        let victim = Tail::of(&hist(&[(10_000, 9_900), (30_000_000, 100)]));
        assert_eq!(victim.late, 100);
        assert_eq!(victim.one_in(), 100);
        let per_s = victim.excess_ns_per_s(10.0);
        assert!(
            (280_000_000..=320_000_000).contains(&per_s),
            "≈ 100 × 30 ms / 10 s: {per_s}"
        );
        assert!(tail_is_harm(&victim, 10.0));
        assert!(latency_sensitive(10_000, 50, 10.0));
        // Waits spread to 4× the median, none past 1 ms: no tail, however many.
        let shared = Tail::of(&hist(&[(100_000, 5_000), (400_000, 5_000)]));
        assert_eq!(shared.late, 0);
        assert!(!tail_is_harm(&shared, 10.0));
        // One unlucky wait is not a victim.
        let once = Tail::of(&hist(&[(10_000, 9_999), (50_000_000, 1)]));
        assert_eq!(once.late, 1);
        assert!(!tail_is_harm(&once, 10.0));
    }

    #[test]
    fn lost_traffic_is_scored_as_that_share_of_a_second() {
        assert_eq!(lost_share_ns_per_s(0, 0), 0);
        assert_eq!(
            lost_share_ns_per_s(20_000, 0),
            1_000_000_000,
            "nothing got through"
        );
        assert_eq!(lost_share_ns_per_s(3_331, 50_000), 62_458_982);
        assert_eq!(lost_share_ns_per_s(u64::MAX, u64::MAX), 500_000_000);
    }

    #[test]
    fn a_stall_is_scored_per_second_of_life() {
        // The THP incident: dd 218 ms of 302 ms alive; a long-lived process 239 ms of 8 s.
        let dd = per_second_alive(218_000_000, 302_000_000, 8_000_000_000);
        let long = per_second_alive(239_000_000, 0, 8_000_000_000);
        assert_eq!(dd, 218_000_000, "life floored at 1 s");
        assert_eq!(long, 29_875_000);
        assert!(dd > long);
        assert_eq!(
            per_second_alive(500, 1_000, 2_000),
            250_000_000,
            "the floor is at most the window"
        );
    }

    #[test]
    fn cpu_bound_and_low_priority_processes_are_not_latency_victims() {
        assert!(
            !latency_sensitive(30, 900, 10.0),
            "preempted more than woken"
        );
        assert!(!latency_sensitive(100, 0, 10.0), "10 wakeups/s");
        assert!(asked_to_wait(19, 0));
        assert!(asked_to_wait(0, 5));
        assert!(asked_to_wait(0, 3));
        assert!(!asked_to_wait(0, 0));
        assert!(!asked_to_wait(-5, 0));
    }
}
