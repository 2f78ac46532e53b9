//! io-lat's `dirtied` rows: pages made dirty per disk and process in the window (the kernel's
//! `io_lat/dirty.rs`). Writeback is issued by the flusher, so the summary rows show only the
//! kworker; these rows say whose pages it had to write, which is what `triage` names when
//! writeback slows a process's sync calls.

use std::collections::BTreeMap;

use probes_common::io_lat::{bdi_disk, DirtyKey, DirtyVal, BDI_NAME_LEN};
use serde::Serialize;

use crate::report::units::per_s;
use crate::{
    host::{disks, facts::FactsCache},
    report::{
        links::{DiskDirtier, Link},
        render::fmt_bytes,
        rows::Column,
        sanitize,
        schema::{Direction::*, Field, Rows},
        who::{Folding, Id, Title, ID_FIELDS},
    },
};

/// One (disk, dirtying process) in one window.
#[derive(Serialize)]
pub struct DirtyRow {
    /// The disk, or the backing device's own name when it is not a block device.
    pub dev: String,
    pub major: u32,
    pub minor: u32,
    #[serde(flatten)]
    pub who: Id,
    /// A kernel thread (jbd2 dirties its journal's pages); `null` when it exited unseen.
    pub kthread: Option<bool>,
    /// Dirtying events: one per folio, whatever its size.
    pub folios: u64,
    /// Bytes dirtied (`null` where the kernel does not account task I/O).
    pub dirtied_bytes: Option<u64>,
    pub dirtied_bytes_per_s: Option<f64>,
    #[serde(skip)]
    pub kdev: u32,
    #[serde(skip)]
    pub other: bool,
}

impl crate::report::rows::Row for DirtyRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

const DIRTY_FIELDS: &[Field] = &[
    Field::id("major"),
    Field::id("minor"),
    Field::count("folios", Neutral),
    Field::count("dirtied_bytes", Neutral).export(
        "tracekit_io_dirtied_bytes",
        "Bytes of page cache dirtied, by disk and process (what writeback will write).",
    ),
    Field::stat("dirtied_bytes_per_s"),
];

pub const DIRTY_ROWS: Rows = Rows {
    kind: "dirtied",
    labels: &["dev"],
    fields: &[ID_FIELDS, DIRTY_FIELDS],
    dists: &[],
};

pub const DIRTY: &[Column<DirtyRow>] = &[
    Column::left("DEV", |r, _| r.dev.clone()),
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::right("FOLIOS", |r, _| r.folios.to_string()),
    Column::right("DIRTIED", |r, _| {
        r.dirtied_bytes.map(fmt_bytes).unwrap_or_else(|| "-".into())
    }),
    Column::right("MB/s", |r, _| {
        r.dirtied_bytes_per_s
            .map(|b| format!("{:.2}", b / 1e6))
            .unwrap_or_else(|| "-".into())
    }),
];

/// The disk a bdi name stands for: (name, major, minor, kdev), kdev 0 when it is no block
/// device this host has (a network file system's anonymous `0:N`, `(unknown)`).
fn disk_of(bdi: &[u8; BDI_NAME_LEN]) -> (String, u32, u32, u32) {
    match bdi_disk(bdi) {
        Some((ma, mi)) if disks::exists(ma, mi) => {
            (disks::name(ma, mi), ma, mi, disks::kdev(ma, mi))
        }
        Some((ma, mi)) => (format!("{ma}:{mi}"), ma, mi, 0),
        None => (sanitize::text(sanitize::comm_bytes(bdi)), 0, 0, 0),
    }
}

/// The rows, most bytes (or folios, without bytes) first, `[other]` last.
pub fn build(
    drained: &[(DirtyKey, DirtyVal)],
    other: &DirtyVal,
    bytes_measured: bool,
    only: Option<(u32, u32)>,
    fold: &mut Folding,
    facts: &mut FactsCache,
    secs: f64,
) -> Vec<DirtyRow> {
    let mut merged: BTreeMap<([u8; BDI_NAME_LEN], u32), DirtyVal> = BTreeMap::new();
    for (k, v) in drained {
        let tgid = if fold.on() { fold.rep(k.tgid) } else { k.tgid };
        merged
            .entry((k.bdi, tgid))
            .and_modify(|x| x.merge(v))
            .or_insert(*v);
    }
    let bytes = |b: u64| bytes_measured.then_some(b);
    let mut rows: Vec<DirtyRow> = merged
        .into_iter()
        .map(|((bdi, tgid), v)| {
            let (dev, major, minor, kdev) = disk_of(&bdi);
            let pf = facts.get(tgid).cloned();
            let kcomm = sanitize::comm_bytes(&v.comm).to_vec();
            let (comm, title) = match &pf {
                Some(p) if !p.kthread => (p.comm.clone(), Title::of_or(tgid, &p.cmdline)),
                _ => (kcomm, Title::default()),
            };
            let mut who = Id::new(tgid, tgid, false, comm, title);
            fold.relabel(&mut who);
            DirtyRow {
                dev,
                major,
                minor,
                who,
                kthread: pf.map(|p| p.kthread),
                folios: v.folios,
                dirtied_bytes: bytes(v.bytes),
                dirtied_bytes_per_s: bytes(v.bytes).map(|b| per_s(b, secs)),
                kdev,
                other: false,
            }
        })
        .filter(|r| only.is_none_or(|d| d == (r.major, r.minor)))
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse((r.dirtied_bytes.unwrap_or(0), r.folios)));
    if other.folios > 0 {
        rows.push(DirtyRow {
            dev: "[other]".into(),
            major: 0,
            minor: 0,
            who: Id::named(b"[other]"),
            kthread: None,
            folios: other.folios,
            dirtied_bytes: bytes(other.bytes),
            dirtied_bytes_per_s: bytes(other.bytes).map(|b| per_s(b, secs)),
            kdev: 0,
            other: true,
        });
    }
    rows
}

/// What triage links writeback to: each process's dirtying of each disk.
pub fn links(rows: &[DirtyRow]) -> impl Iterator<Item = Link> + '_ {
    rows.iter().filter(|r| !r.other && r.kdev != 0).map(|r| {
        Link::Dirtied(DiskDirtier {
            kdev: r.kdev,
            disk: r.dev.clone(),
            who: r.who.subject(),
            kthread: r.kthread.unwrap_or(false),
            folios: r.folios,
            bytes: r.dirtied_bytes,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bdi(s: &str) -> [u8; BDI_NAME_LEN] {
        let mut n = [0u8; BDI_NAME_LEN];
        n[..s.len()].copy_from_slice(s.as_bytes());
        n
    }

    fn val(folios: u64, bytes: u64) -> DirtyVal {
        DirtyVal {
            folios,
            bytes,
            ..DirtyVal::ZERO
        }
    }

    /// Rows go by bytes, not by folios (one 1 MiB folio outweighs a hundred 4 KiB pages), the
    /// two generations' halves of one key are one row, and a name that is no disk of this host
    /// is kept as the kernel gave it, out of the links.
    #[test]
    fn rows_rank_by_bytes_and_only_disks_link() {
        let key = |b: &str, tgid, gen| DirtyKey {
            bdi: bdi(b),
            tgid,
            gen,
        };
        let drained = [
            (key("(unknown)", 1, 0), val(100, 409_600)),
            (key("0:4000", 2, 0), val(1, 1 << 20)),
            (key("0:4000", 2, 1), val(1, 1 << 20)),
        ];
        let rows = build(
            &drained,
            &val(3, 12_288),
            true,
            None,
            &mut Folding::new(false),
            &mut FactsCache::new(),
            2.0,
        );
        let got: Vec<(&str, u32, u64, Option<u64>)> = rows
            .iter()
            .map(|r| (r.dev.as_str(), r.who.pid, r.folios, r.dirtied_bytes))
            .collect();
        assert_eq!(
            got,
            [
                ("0:4000", 2, 2, Some(2 << 20)),
                ("(unknown)", 1, 100, Some(409_600)),
                ("[other]", 0, 3, Some(12_288)),
            ]
        );
        assert_eq!(rows[0].dirtied_bytes_per_s, Some(1_048_576.0));
        assert_eq!(links(&rows).count(), 0, "no disk of this host");
        let unmeasured = build(
            &drained,
            &DirtyVal::ZERO,
            false,
            None,
            &mut Folding::new(false),
            &mut FactsCache::new(),
            2.0,
        );
        assert_eq!(unmeasured[0].dirtied_bytes, None);
        assert_eq!(unmeasured[0].dev, "(unknown)", "by folios without bytes");
    }
}
