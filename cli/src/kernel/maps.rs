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
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues},
    Pod,
};

use probes_common::GenKey;

use crate::kernel::loader::{map_err, LoadError, Session};

/// Values that can be summed across keys (per-CPU copies, threads of a process, fds of a file).
pub trait Merge {
    fn merge(&mut self, other: &Self);
}

impl Merge for probes_common::hist::LatHist {
    fn merge(&mut self, other: &Self) {
        probes_common::hist::LatHist::merge(self, other)
    }
}

/// A kernel aggregation hash keyed by `K` (a [`GenKey`]) and its two-slot `[other]` array.
pub struct GenMap<K: Pod, V: Pod>(Gen<K, V, HashMap<MapData, K, V>, Array<MapData, V>>);

/// What one generation held.
pub struct Drained<K, V> {
    pub rows: Vec<(K, V)>,
    /// The `[other]` row: values for keys that did not fit the map.
    pub other: V,
}

/// A per-CPU aggregation hash keyed by `K` (the kernel updates this CPU's copy without
/// atomics, and the CPU of every event comes for free) and its two-slot per-CPU `[other]` array.
pub struct PerCpuGenMap<K: Pod, V: Pod>(
    Gen<K, V, PerCpuHashMap<MapData, K, V>, PerCpuArray<MapData, V>>,
);

/// What one generation of a per-CPU map held: one value per possible CPU, by CPU number.
pub struct DrainedPerCpu<K, V> {
    pub rows: Vec<(K, Vec<V>)>,
    pub other: Vec<V>,
}

/// `take` and `drain` of [`GenMap`] and [`PerCpuGenMap`] (the work is in [`Gen`]).
macro_rules! gen_map_api {
    ($map:ident, $drained:ident, $values:literal) => {
        impl<K: Pod + GenKey, V: Pod> $map<K, V> {
            /// Takes `map` (and `other`, if the tool has an overflow row, reset to `zero` as it
            /// is drained) out of the session.
            pub fn take(
                session: &mut Session,
                map: &'static str,
                other: Option<&'static str>,
                zero: V,
            ) -> Result<$map<K, V>, LoadError> {
                Gen::take(session, map, other, K::gen, zero).map($map)
            }

            #[doc = concat!("Every key of generation `gen`", $values, ", deleted from the map, ")]
            /// and the `[other]` row of that generation, reset to zero.
            pub fn drain(&mut self, gen: u32) -> Result<$drained<K, V>, LoadError> {
                let (rows, other) = self.0.drain(gen)?;
                Ok($drained { rows, other })
            }
        }
    };
}

gen_map_api!(GenMap, Drained, "");

impl<K: Pod, V: Pod> GenMap<K, V> {
    /// Every key in the map now, of either generation, left in place (a tool that must act on
    /// new keys while the window runs: resolving a process's stacks before it exits).
    pub fn keys(&self) -> Vec<K> {
        self.0.map.all_keys()
    }
}
gen_map_api!(PerCpuGenMap, DrainedPerCpu, " with its per-CPU values");

impl<K: Pod, V: Pod> PerCpuGenMap<K, V> {
    /// Every key in the map now, of either generation, left in place (net-rx learning the
    /// owners of dropping sockets while they live).
    pub fn keys(&self) -> Vec<K> {
        self.0.map.all_keys()
    }
}

/// What one generation held: its rows and its `[other]` row.
type Generation<K, R, O> = (Vec<(K, R)>, O);

/// What both generation maps share: the hash `H` (plain or per-CPU), its optional `[other]`
/// array `A`, how to read a key's generation, and the zero value the `[other]` row is reset to.
struct Gen<K, V, H, A> {
    name: &'static str,
    map: H,
    other: Option<A>,
    key_gen: fn(&K) -> u32,
    zero: V,
}

/// A generation hash: its keys, and one key's value read and then deleted.
trait GenHash<K> {
    type Row;
    fn all_keys(&self) -> Vec<K>;
    fn take_row(&mut self, k: &K) -> Option<Self::Row>;
}

/// An `[other]` array: one generation's row read, then reset to zero.
trait OtherRow<V> {
    type Row;
    fn take_reset(&mut self, gen: u32, zero: V) -> Result<Self::Row, MapError>;
    /// The row when the tool has no `[other]` array.
    fn empty(zero: V) -> Self::Row;
}

impl<K: Pod, V: Pod> GenHash<K> for HashMap<MapData, K, V> {
    type Row = V;
    fn all_keys(&self) -> Vec<K> {
        self.keys().filter_map(Result::ok).collect()
    }
    fn take_row(&mut self, k: &K) -> Option<V> {
        let v = self.get(k, 0).ok();
        let _ = self.remove(k);
        v
    }
}

impl<K: Pod, V: Pod> GenHash<K> for PerCpuHashMap<MapData, K, V> {
    type Row = Vec<V>;
    fn all_keys(&self) -> Vec<K> {
        self.keys().filter_map(Result::ok).collect()
    }
    fn take_row(&mut self, k: &K) -> Option<Vec<V>> {
        let v = self.get(k, 0).ok().map(|v| v.iter().copied().collect());
        let _ = self.remove(k);
        v
    }
}

impl<V: Pod> OtherRow<V> for Array<MapData, V> {
    type Row = V;
    fn take_reset(&mut self, gen: u32, zero: V) -> Result<V, MapError> {
        let v = self.get(&gen, 0)?;
        self.set(gen, zero, 0)?;
        Ok(v)
    }
    fn empty(zero: V) -> V {
        zero
    }
}

impl<V: Pod> OtherRow<V> for PerCpuArray<MapData, V> {
    type Row = Vec<V>;
    fn take_reset(&mut self, gen: u32, zero: V) -> Result<Vec<V>, MapError> {
        let v: Vec<V> = self.get(&gen, 0)?.to_vec();
        let zeros =
            PerCpuValues::try_from(vec![zero; v.len().max(1)]).map_err(MapError::IoError)?;
        self.set(gen, zeros, 0)?;
        Ok(v)
    }
    fn empty(_: V) -> Vec<V> {
        Vec::new()
    }
}

impl<K, V: Copy, H, A> Gen<K, V, H, A>
where
    H: GenHash<K> + TryFrom<Map, Error = MapError>,
    A: OtherRow<V> + TryFrom<Map, Error = MapError>,
{
    fn take(
        session: &mut Session,
        map: &'static str,
        other: Option<&'static str>,
        key_gen: fn(&K) -> u32,
        zero: V,
    ) -> Result<Self, LoadError> {
        let hash = H::try_from(session.take_map(map)?).map_err(map_err(map))?;
        let other = match other {
            Some(o) => Some(A::try_from(session.take_map(o)?).map_err(map_err(o))?),
            None => None,
        };
        Ok(Gen {
            name: map,
            map: hash,
            other,
            key_gen,
            zero,
        })
    }

    /// Every key of generation `gen` with its value, deleted from the map (a key that vanished
    /// meanwhile is left out), and the `[other]` row of that generation, reset to zero.
    fn drain(&mut self, gen: u32) -> Result<Generation<K, H::Row, A::Row>, LoadError> {
        let kg = self.key_gen;
        let keys = self.map.all_keys();
        let rows = keys
            .into_iter()
            .filter(|k| kg(k) == gen)
            .filter_map(|k| self.map.take_row(&k).map(|v| (k, v)))
            .collect();
        let other = match self.other.as_mut() {
            // The kernel writes the other generation now, so the reset races with nothing.
            Some(o) => o.take_reset(gen, self.zero).map_err(map_err(self.name))?,
            None => A::empty(self.zero),
        };
        Ok((rows, other))
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
