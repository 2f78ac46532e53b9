//! Device slots: the index of each block device into the programs' per-device arrays
//! (`IO_LIVE`, `IO_DEPTH`), given out here and written to `IO_SLOTS`.
//!
//! The programs look a request's slot up once, when the request is first seen, and keep it in
//! its entry; every later per-device update is an array access instead of a hash lookup. The
//! disks are the ones `/proc/diskstats` lists (whole disks and partitions: a request names its
//! whole disk, partitions cost a spare slot each), at start and again each window, so a disk
//! attached while tracing gets its slot within a window. Slots are never taken back: a disk
//! detached and attached again keeps its number only if its `dev_t` is the same.

use std::collections::BTreeMap;

use aya::maps::{Array, HashMap, MapData};
use probes_common::io_lat::{DevKey, DevLive, DevVal};

use crate::{
    error::{Context as _, Result},
    host::disks,
};

/// Slots given out at most: `IO_DEPTH` holds two `DevVal`s (about 5 KiB each) per slot.
const MAX_SLOTS: u32 = 512;

/// How many slots to make room for, for `ndisks` disks now: room for as many again attached
/// later, at least 16.
pub fn capacity(ndisks: usize) -> u32 {
    (ndisks.saturating_mul(2) as u32)
        .clamp(16, MAX_SLOTS)
        .next_power_of_two()
        .min(MAX_SLOTS)
}

pub struct Slots {
    /// `IO_SLOTS`: `dev_t` → slot.
    map: HashMap<MapData, u32, u32>,
    live: Array<MapData, DevLive>,
    depth: Array<MapData, DevVal>,
    by_dev: BTreeMap<u32, u32>,
    cap: u32,
    /// Disks found with every slot taken (said once per window).
    pub unslotted: usize,
}

impl Slots {
    pub fn new(
        map: HashMap<MapData, u32, u32>,
        live: Array<MapData, DevLive>,
        depth: Array<MapData, DevVal>,
        cap: u32,
    ) -> Slots {
        Slots {
            map,
            live,
            depth,
            by_dev: BTreeMap::new(),
            cap,
            unslotted: 0,
        }
    }

    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Gives a slot to each disk of `disks` that has none yet.
    pub fn refresh(&mut self, disks: &disks::DiskStats) -> Result<()> {
        self.unslotted = 0;
        for &(major, minor) in disks.keys() {
            let dev = disks::kdev(major, minor);
            if self.by_dev.contains_key(&dev) {
                continue;
            }
            let slot = self.by_dev.len() as u32;
            if slot >= self.cap {
                self.unslotted += 1;
                continue;
            }
            self.map.insert(dev, slot, 0).context("writing IO_SLOTS")?;
            self.by_dev.insert(dev, slot);
        }
        Ok(())
    }

    /// The live counters of every device that has seen a request since attach.
    pub fn live(&self) -> Vec<(u32, DevLive)> {
        self.by_dev
            .iter()
            .filter_map(|(&dev, &slot)| {
                let l = self.live.get(&slot, 0).ok()?;
                (l.touched != 0).then_some((dev, l))
            })
            .collect()
    }

    /// Adds generation `gen`'s depth histograms to `rows` (per device, as `IO_DEV_VALS` keeps
    /// them) and resets them. The programs no longer write `gen` (it was flipped away from).
    pub fn drain_depth(&mut self, gen: u32, rows: &mut Vec<(DevKey, DevVal)>) -> Result<()> {
        for (&dev, &slot) in &self.by_dev {
            let i = slot * 2 + (gen & 1);
            let v = self.depth.get(&i, 0).context("reading IO_DEPTH")?;
            if v.inflight.count == 0 && v.queued.count == 0 {
                continue;
            }
            self.depth
                .set(i, DevVal::ZERO, 0)
                .context("resetting IO_DEPTH")?;
            let key = DevKey { dev, gen };
            match rows.iter_mut().find(|(k, _)| k.dev == dev) {
                Some((_, r)) => {
                    r.inflight.merge(&v.inflight);
                    r.queued.merge(&v.queued);
                }
                None => rows.push((
                    key,
                    DevVal {
                        inflight: v.inflight,
                        queued: v.queued,
                        untracked: Default::default(),
                    },
                )),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::capacity;

    #[test]
    fn room_for_as_many_disks_again() {
        assert_eq!(capacity(0), 16);
        assert_eq!(capacity(5), 16);
        assert_eq!(capacity(9), 32);
        assert_eq!(capacity(100), 256);
        assert_eq!(capacity(10_000), 512);
    }
}
