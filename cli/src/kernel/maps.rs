//! Userspace side of the aggregation kit: a generation map (a per-key hash written under the
//! current interval generation plus its `[other]` row for what did not fit) that the engine
//! flips, drains, resets and merges by any projection of the key.
//!
//! The kernel writes keys tagged with the current generation; at a window boundary userspace
//! flips `CONTROL.gen` and drains the previous generation, which nothing writes any more once
//! the programs that read the old value have finished. So per-window values (max included) are
//! exact and nothing is lost between a read and a reset.

use std::collections::BTreeMap;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues},
    Pod,
};

use crate::kernel::loader::{LoadError, Session};

/// Values that can be summed across keys (per-CPU copies, threads of a process, fds of a file).
pub trait Merge {
    fn merge(&mut self, other: &Self);
}

impl Merge for probes_common::hist::LatHist {
    fn merge(&mut self, other: &Self) {
        probes_common::hist::LatHist::merge(self, other)
    }
}

/// A kernel aggregation hash keyed by `K` (whose generation `key_gen` extracts) and its
/// two-slot `[other]` array.
pub struct GenMap<K: Pod, V: Pod> {
    name: &'static str,
    map: HashMap<MapData, K, V>,
    other: Option<Array<MapData, V>>,
    key_gen: fn(&K) -> u32,
    zero: V,
}

/// What one generation held.
pub struct Drained<K, V> {
    pub rows: Vec<(K, V)>,
    /// The `[other]` row: values for keys that did not fit the map.
    pub other: V,
}

fn map_err(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> LoadError {
    move |source| LoadError::Map {
        map: map.to_string(),
        source,
    }
}

impl<K: Pod, V: Pod> GenMap<K, V> {
    /// Takes `map` (and `other`, if the tool has an overflow row) out of the session.
    pub fn take(
        session: &mut Session,
        map: &'static str,
        other: Option<&'static str>,
        key_gen: fn(&K) -> u32,
        zero: V,
    ) -> Result<GenMap<K, V>, LoadError> {
        let mut take = |m: &'static str| {
            session.ebpf.take_map(m).ok_or(LoadError::NoMap {
                object: session.object,
                map: m.into(),
            })
        };
        let hash = HashMap::try_from(take(map)?).map_err(map_err(map))?;
        let other = match other {
            Some(o) => Some(Array::try_from(take(o)?).map_err(map_err(o))?),
            None => None,
        };
        Ok(GenMap {
            name: map,
            map: hash,
            other,
            key_gen,
            zero,
        })
    }

    /// Every key of generation `gen`, deleted from the map, and the `[other]` row of that
    /// generation, reset to zero.
    pub fn drain(&mut self, gen: u32) -> Result<Drained<K, V>, LoadError> {
        let kg = self.key_gen;
        let keys: Vec<K> = self
            .map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| kg(k) == gen)
            .collect();
        let mut rows = Vec::with_capacity(keys.len());
        for k in keys {
            if let Ok(v) = self.map.get(&k, 0) {
                rows.push((k, v));
            }
            let _ = self.map.remove(&k);
        }
        let other = match self.other.as_mut() {
            Some(o) => {
                let v = o.get(&gen, 0).map_err(map_err(self.name))?;
                // The kernel writes the other generation now, so the reset races with nothing.
                o.set(gen, self.zero, 0).map_err(map_err(self.name))?;
                v
            }
            None => self.zero,
        };
        Ok(Drained { rows, other })
    }
}

/// A per-CPU aggregation hash keyed by `K` (the kernel updates this CPU's copy without
/// atomics, and the CPU of every event comes for free) and its two-slot per-CPU `[other]` array.
pub struct PerCpuGenMap<K: Pod, V: Pod> {
    name: &'static str,
    map: PerCpuHashMap<MapData, K, V>,
    other: Option<PerCpuArray<MapData, V>>,
    key_gen: fn(&K) -> u32,
    zero: V,
}

/// What one generation of a per-CPU map held: one value per possible CPU, by CPU number.
pub struct DrainedPerCpu<K, V> {
    pub rows: Vec<(K, Vec<V>)>,
    pub other: Vec<V>,
}

impl<K: Pod, V: Pod> PerCpuGenMap<K, V> {
    /// Takes `map` (and `other`, if the tool has an overflow row) out of the session.
    pub fn take(
        session: &mut Session,
        map: &'static str,
        other: Option<&'static str>,
        key_gen: fn(&K) -> u32,
        zero: V,
    ) -> Result<PerCpuGenMap<K, V>, LoadError> {
        let mut take = |m: &'static str| {
            session.ebpf.take_map(m).ok_or(LoadError::NoMap {
                object: session.object,
                map: m.into(),
            })
        };
        let hash = PerCpuHashMap::try_from(take(map)?).map_err(map_err(map))?;
        let other = match other {
            Some(o) => Some(PerCpuArray::try_from(take(o)?).map_err(map_err(o))?),
            None => None,
        };
        Ok(PerCpuGenMap {
            name: map,
            map: hash,
            other,
            key_gen,
            zero,
        })
    }

    /// Every key of generation `gen` with its per-CPU values, deleted from the map, and the
    /// `[other]` row of that generation, reset to zero.
    pub fn drain(&mut self, gen: u32) -> Result<DrainedPerCpu<K, V>, LoadError> {
        let kg = self.key_gen;
        let keys: Vec<K> = self
            .map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| kg(k) == gen)
            .collect();
        let mut rows = Vec::with_capacity(keys.len());
        for k in keys {
            if let Ok(v) = self.map.get(&k, 0) {
                rows.push((k, v.iter().copied().collect()));
            }
            let _ = self.map.remove(&k);
        }
        let other = match self.other.as_mut() {
            Some(o) => {
                let v: Vec<V> = o.get(&gen, 0).map_err(map_err(self.name))?.to_vec();
                let zeros = PerCpuValues::try_from(vec![self.zero; v.len().max(1)])
                    .map_err(|e| map_err(self.name)(aya::maps::MapError::IoError(e)))?;
                // The kernel writes the other generation now, so the reset races with nothing.
                o.set(gen, zeros, 0).map_err(map_err(self.name))?;
                v
            }
            None => Vec::new(),
        };
        Ok(DrainedPerCpu { rows, other })
    }
}

/// Sums drained rows by a projection of their key (e.g. per-fd keys into per-process rows),
/// keeping the projection's order.
pub fn merge_by<K, V: Merge + Clone, P: Ord>(
    rows: &[(K, V)],
    project: impl Fn(&K) -> P,
) -> BTreeMap<P, V> {
    let mut out: BTreeMap<P, V> = BTreeMap::new();
    for (k, v) in rows {
        match out.entry(project(k)) {
            std::collections::btree_map::Entry::Occupied(mut e) => e.get_mut().merge(v),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(v.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes_common::hist::LatHist;

    #[test]
    fn merges_by_projection() {
        let mut a = LatHist::ZERO;
        a.record(100);
        let mut b = LatHist::ZERO;
        b.record(200);
        let rows = vec![((1u32, 3i32), a), ((1, 4), b), ((2, 3), a)];
        let m = merge_by(&rows, |k| k.0);
        assert_eq!(m.len(), 2);
        assert_eq!(m[&1].count, 2);
        assert_eq!(m[&1].sum, 300);
        assert_eq!(m[&2].count, 1);
    }
}
