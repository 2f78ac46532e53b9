//! The time-weighted queue depth: the live counters the programs keep per device (`IO_LIVE`),
//! sampled on a 10 ms timer, against the request limit and the device's own queue depth.

use std::collections::{BTreeMap, HashMap as StdHashMap};

use probes_common::{
    hist::LatHist,
    io_lat::{DevLive, DevVal},
};
use serde::Serialize;

use crate::host::disks::{self, QueueFacts};

/// Time-weighted depth of one device over a window, from the sampler.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DepthAcc {
    pub samples: u64,
    pub inflight_sum: u64,
    pub queued_sum: u64,
    pub inflight_max: u64,
    pub queued_max: u64,
    /// Samples with queued + in flight at the request limit (`nr_requests` per hardware queue).
    pub limit_full: u64,
    /// Samples with in flight at the device's own queue depth (driver tags).
    pub hw_full: u64,
}

/// A device line's depth columns. Time-sampled (every 10 ms; `None` for a device the sampler
/// never saw): mean and max in flight and queued, share of the window at the request limit and
/// at the device's queue depth. Event-weighted: what each issued (inserted) request found,
/// itself included.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DepthRow {
    pub depth_samples: u64,
    pub inflight_mean: Option<f64>,
    pub inflight_max: Option<u64>,
    pub queued_mean: Option<f64>,
    pub queued_max: Option<u64>,
    pub full_pct: Option<f64>,
    pub hw_full_pct: Option<f64>,
    pub inflight_at_issue_mean: f64,
    pub inflight_at_issue_max: u64,
    pub queued_at_insert_mean: f64,
    pub queued_at_insert_max: u64,
}

/// `x` to two decimals.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl DepthRow {
    /// From the window's samples of the device (`d`, over `ticks` timer ticks) and its
    /// per-request depth histograms (`dv`).
    pub fn of(d: Option<&DepthAcc>, ticks: u64, dv: &DevVal) -> DepthRow {
        let ticks = ticks.max(1) as f64;
        let per_tick = |n: u64| round2(n as f64 / ticks);
        let mean = |h: &LatHist| round2(h.sum as f64 / h.count.max(1) as f64);
        DepthRow {
            depth_samples: d.map_or(0, |d| d.samples),
            inflight_mean: d.map(|d| per_tick(d.inflight_sum)),
            inflight_max: d.map(|d| d.inflight_max),
            queued_mean: d.map(|d| per_tick(d.queued_sum)),
            queued_max: d.map(|d| d.queued_max),
            full_pct: d.map(|d| per_tick(d.limit_full * 100)),
            hw_full_pct: d.map(|d| per_tick(d.hw_full * 100)),
            inflight_at_issue_mean: mean(&dv.inflight),
            inflight_at_issue_max: dv.inflight.max,
            queued_at_insert_mean: mean(&dv.queued),
            queued_at_insert_max: dv.queued.max,
        }
    }
}

/// What the sampler saw in a window: ticks, and per device (kernel `dev_t`) its depth.
#[derive(Clone, Debug, Default)]
pub struct Depth {
    pub ticks: u64,
    pub per_dev: BTreeMap<u32, DepthAcc>,
}

/// Samples the live counters (`IO_LIVE`) on each timer tick.
#[derive(Default)]
pub struct Sampler {
    depth: Depth,
    /// (request limit, hardware queue depth) per device, read once per window.
    limits: StdHashMap<u32, (Option<u64>, Option<u64>)>,
}

/// The request limit (`nr_requests` per hardware queue) and the driver-tag depth of `dev`.
pub fn limits_of(q: &QueueFacts) -> (Option<u64>, Option<u64>) {
    let hwq = q.nr_hw_queues.unwrap_or(1).max(1);
    (q.nr_requests.map(|n| n * hwq), q.hw_queue_depth)
}

impl Sampler {
    pub fn sample(&mut self, live: &[(u32, DevLive)]) {
        self.depth.ticks += 1;
        for (dev, l) in live {
            let (limit, hw) = *self.limits.entry(*dev).or_insert_with(|| {
                let (maj, min) = disks::split_kdev(*dev);
                limits_of(&QueueFacts::read(maj, min))
            });
            // A counter below zero (requests in flight at attach ended) reads as 0.
            let v = |x: u64| if x > 1 << 32 { 0 } else { x };
            let (i, q) = (v(l.inflight), v(l.queued));
            let a = self.depth.per_dev.entry(*dev).or_default();
            a.samples += 1;
            a.inflight_sum += i;
            a.queued_sum += q;
            a.inflight_max = a.inflight_max.max(i);
            a.queued_max = a.queued_max.max(q);
            a.limit_full += u64::from(limit.is_some_and(|n| n > 0 && i + q >= n));
            a.hw_full += u64::from(hw.is_some_and(|n| n > 0 && i >= n));
        }
    }

    /// The window's samples; limits are read afresh next window (a scheduler or nr_requests
    /// change shows from then on).
    pub fn take(&mut self) -> Depth {
        self.limits.clear();
        std::mem::take(&mut self.depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_weights_by_time_and_counts_full_queues() {
        let mut s = Sampler::default();
        let dev = disks::kdev(4095, 7);
        // A device sysfs does not know: limits from a fixed QueueFacts instead.
        s.limits.insert(dev, (Some(4), Some(2)));
        let at = |inflight, queued| {
            [(
                dev,
                DevLive {
                    queued,
                    inflight,
                    touched: 1,
                },
            )]
        };
        s.sample(&at(2, 2));
        s.sample(&at(1, 0));
        s.sample(&at(u64::MAX, 1)); // below zero around attach: 0
        s.sample(&at(2, 3));
        let d = s.take();
        assert_eq!(d.ticks, 4);
        let a = &d.per_dev[&dev];
        assert_eq!((a.samples, a.inflight_sum, a.queued_sum), (4, 5, 6));
        assert_eq!((a.inflight_max, a.queued_max), (2, 3));
        assert_eq!((a.limit_full, a.hw_full), (2, 2));
        assert_eq!(s.take().ticks, 0);
    }
}
