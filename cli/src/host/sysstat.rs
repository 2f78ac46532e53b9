//! System-wide scheduler figures from `/proc/stat` (through the procfs crate): context switches
//! (`ctxt`), runnable tasks (`procs_running`) and, per CPU, the time stolen by the hypervisor
//! (`steal`, the 8th value of each `cpuN` line) and the time spent in softirqs (`softirq`, the
//! 7th).

use std::io::Read;

use procfs::{ExplicitSystemInfo, FromReadSI, KernelStats};

/// One reading of /proc/stat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysStat {
    /// Context switches since boot (all CPUs).
    pub ctxt: u64,
    /// Tasks runnable right now (running or waiting on a run queue).
    pub procs_running: Option<u32>,
    /// Per CPU, in /proc/stat order.
    pub cpus: Vec<CpuTime>,
    /// The `cpu` line (all CPUs), split as `sar -u` splits it.
    pub all: CpuTicks,
}

/// One `cpuN` line: all its ticks, and those of the kinds read per CPU (None when the kernel
/// has no such column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub total: u64,
    pub steal: Option<u64>,
    pub softirq: Option<u64>,
}

/// Ticks of the `cpu` line by kind (guest time is inside user, guest_nice inside nice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

/// CPU time between two readings, in percent of all CPUs' time, as `sar -u` shows it (`user`
/// includes nice, `system` includes irq and softirq).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSplit {
    pub user: f64,
    pub system: f64,
    pub iowait: f64,
    pub steal: f64,
    pub idle: f64,
}

impl CpuTicks {
    fn total(&self) -> u64 {
        self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
    }
}

#[derive(Debug, thiserror::Error)]
#[error("reading /proc/stat: {0}")]
pub struct SysStatError(String);

impl SysStat {
    pub fn read() -> Result<SysStat, SysStatError> {
        let text =
            crate::host::read_capped(&crate::host::proc_path("stat"), crate::host::LARGE_FILE)
                .map_err(|e| SysStatError(e.to_string()))?;
        SysStat::parse(text.as_slice())
    }

    pub fn parse(r: impl Read) -> Result<SysStat, SysStatError> {
        // Tick length does not matter for ratios; procfs wants one anyway.
        let si = ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: cfg!(target_endian = "little"),
        };
        let ks = KernelStats::from_read(r, &si).map_err(|e| SysStatError(e.to_string()))?;
        let cpus = ks
            .cpu_time
            .iter()
            .map(|c| {
                // guest time is already inside user (and guest_nice inside nice).
                let total = c.user
                    + c.nice
                    + c.system
                    + c.idle
                    + c.iowait.unwrap_or(0)
                    + c.irq.unwrap_or(0)
                    + c.softirq.unwrap_or(0)
                    + c.steal.unwrap_or(0);
                CpuTime {
                    total,
                    steal: c.steal,
                    softirq: c.softirq,
                }
            })
            .collect();
        let t = &ks.total;
        let all = CpuTicks {
            user: t.user,
            nice: t.nice,
            system: t.system,
            idle: t.idle,
            iowait: t.iowait.unwrap_or(0),
            irq: t.irq.unwrap_or(0),
            softirq: t.softirq.unwrap_or(0),
            steal: t.steal.unwrap_or(0),
        };
        Ok(SysStat {
            all,
            ctxt: ks.ctxt,
            procs_running: ks.procs_running,
            cpus,
        })
    }

    /// The node's CPU time split between `earlier` and `self` (None when no tick passed or the
    /// counters went backwards).
    pub fn split_since(&self, earlier: &SysStat) -> Option<CpuSplit> {
        let (a, b) = (&self.all, &earlier.all);
        let dt = a.total().checked_sub(b.total()).filter(|d| *d > 0)? as f64;
        let d = |x: u64, y: u64| x.saturating_sub(y) as f64 * 100.0 / dt;
        Some(CpuSplit {
            user: d(a.user + a.nice, b.user + b.nice),
            system: d(a.system + a.irq + a.softirq, b.system + b.irq + b.softirq),
            iowait: d(a.iowait, b.iowait),
            steal: d(a.steal, b.steal),
            idle: d(a.idle, b.idle),
        })
    }

    /// Steal per CPU between `earlier` and `self`, in percent of that CPU's time (None when the
    /// kernel reports no steal or no time passed).
    pub fn steal_pct(&self, earlier: &SysStat) -> Vec<Option<f64>> {
        self.per_cpu(earlier, |c| c.steal)
            .into_iter()
            .map(|s| s.map(|ppm| ppm as f64 / 1e4))
            .collect()
    }

    /// Softirq time per CPU between `earlier` and `self`, in parts per million of that CPU's
    /// time (None when the kernel has no softirq column or no time passed). With
    /// CONFIG_IRQ_TIME_ACCOUNTING the kernel measures it at each softirq's exit, else it
    /// samples it at ticks: on this 6.18 guest it read 20-26 % for a CPU that irq-lat measured
    /// at 21.9 % in NET_RX over the same kind of flood.
    pub fn softirq_ppm(&self, earlier: &SysStat) -> Vec<Option<u64>> {
        self.per_cpu(earlier, |c| c.softirq)
    }

    /// `kind`'s share of each CPU's ticks between `earlier` and `self`, in ppm.
    fn per_cpu(
        &self,
        earlier: &SysStat,
        kind: impl Fn(&CpuTime) -> Option<u64>,
    ) -> Vec<Option<u64>> {
        self.cpus
            .iter()
            .enumerate()
            .map(|(i, now)| {
                let then = earlier.cpus.get(i)?;
                let dt = now.total.checked_sub(then.total)?;
                let dk = kind(now)?.checked_sub(kind(then)?)?;
                (dt > 0).then(|| (dk as u128 * 1_000_000 / dt as u128) as u64)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(n: u32) -> SysStat {
        let p = format!(
            "{}/tests/fixtures/proc/stat.{n}",
            env!("CARGO_MANIFEST_DIR")
        );
        SysStat::parse(std::fs::File::open(p).unwrap()).unwrap()
    }

    #[test]
    fn parses_ctxt_running_and_steal() {
        let a = fixture(1);
        assert_eq!(a.ctxt, 1_000_000);
        assert_eq!(a.procs_running, Some(3));
        let steal: Vec<(u64, Option<u64>)> = a.cpus.iter().map(|c| (c.total, c.steal)).collect();
        assert_eq!(steal, vec![(46775, Some(100)), (47175, Some(500))]);
        assert_eq!(a.cpus[1].softirq, Some(50));
    }

    #[test]
    fn steal_percent_per_cpu() {
        let (a, b) = (fixture(1), fixture(2));
        let s = b.steal_pct(&a);
        // cpu0: 25 of 475 ticks; cpu1: 75 of 525 (to the ppm).
        assert!((s[0].unwrap() - 2500.0 / 475.0).abs() < 1e-4, "{s:?}");
        assert!((s[1].unwrap() - 7500.0 / 525.0).abs() < 1e-4, "{s:?}");
        assert_eq!(b.ctxt - a.ctxt, 85_000);
        // No time passed: no figure rather than a division by zero.
        assert_eq!(a.steal_pct(&a), vec![None, None]);
    }

    #[test]
    fn softirq_share_per_cpu() {
        let (b, c) = (fixture(2), fixture(3));
        // cpu0: 10 of 500 ticks; cpu1: 250 of 1000 (a CPU that runs a NIC's receive work).
        assert_eq!(c.softirq_ppm(&b), vec![Some(20_000), Some(250_000)]);
        assert_eq!(b.softirq_ppm(&b), vec![None, None], "no time passed");
        assert_eq!(
            b.softirq_ppm(&c),
            vec![None, None],
            "counters went backwards"
        );
    }

    #[test]
    fn node_split_as_sar_shows_it() {
        let (a, b) = (fixture(1), fixture(2));
        assert_eq!(a.all.steal, 600);
        // 1000 ticks passed: user 400, system 100, idle 400, steal 100.
        let s = b.split_since(&a).unwrap();
        assert_eq!(
            (s.user, s.system, s.iowait, s.steal, s.idle),
            (40.0, 10.0, 0.0, 10.0, 40.0)
        );
        assert_eq!(a.split_since(&a), None);
        assert_eq!(a.split_since(&b), None);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(SysStat::parse(&b"cpu0 x y\n"[..]).is_err());
    }

    #[test]
    fn reads_this_machine() {
        let s = SysStat::read().unwrap();
        assert!(s.ctxt > 0 && !s.cpus.is_empty());
    }
}
