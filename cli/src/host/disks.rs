//! Block devices: names from device numbers, queue settings from sysfs, and `/proc/diskstats`.
//!
//! Block tracepoints carry the kernel's internal `dev_t` (`MAJOR = dev >> 20`,
//! `MINOR = dev & 0xfffff`, include/linux/kdev_t.h), which differs from the userspace encoding.
//! Names come from `/sys/dev/block/<major>:<minor>/uevent` (`DEVNAME=`), so `vda`, `nvme0n1`,
//! `loop3` are shown, never `254:0`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{proc_path, read_text, read_trim, read_u64, selected, sys_path, HostError};

/// Splits a kernel-internal `dev_t` (as block tracepoints report it).
pub fn split_kdev(dev: u32) -> (u32, u32) {
    (dev >> 20, dev & 0xf_ffff)
}

/// The kernel-internal `dev_t` of `major:minor`.
pub fn kdev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xf_ffff)
}

/// Whether this host has a block device `major:minor`.
pub fn exists(major: u32, minor: u32) -> bool {
    sys_path(&format!("dev/block/{major}:{minor}")).exists()
}

/// `DEVNAME` of a block device, or `major:minor` when sysfs does not know it.
pub fn name(major: u32, minor: u32) -> String {
    read_text(&sys_path(&format!("dev/block/{major}:{minor}/uevent")))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
        })
        .unwrap_or_else(|| format!("{major}:{minor}"))
}

/// Whole disks (`/sys/block/*`: partitions are not listed there) as (name, major, minor),
/// by name.
pub fn whole_disks() -> Vec<(String, u32, u32)> {
    whole_disks_in(&sys_path("block"))
}

/// [`whole_disks`] under a `/sys/block`-like directory (entries with a `dev` file `MAJ:MIN`).
pub fn whole_disks_in(dir: &std::path::Path) -> Vec<(String, u32, u32)> {
    let mut v: Vec<(String, u32, u32)> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().to_str()?.to_string();
                    let dev = read_trim(&e.path().join("dev"))?;
                    let (maj, min) = dev.split_once(':')?;
                    Some((name, maj.parse().ok()?, min.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The whole disk a block device name (`vda`, `nvme0n1`, or a partition such as `vda1`) is on:
/// its name and (major, minor). Block tracepoints report whole disks, as `/proc/diskstats`
/// counts requests.
pub fn disk_of(name: &str) -> Option<(String, u32, u32)> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    let dir = sys_path(&format!("class/block/{name}"));
    let dir = if dir.join("partition").exists() {
        std::fs::canonicalize(&dir).ok()?.parent()?.to_path_buf()
    } else {
        dir
    };
    let dev = read_trim(&dir.join("dev"))?;
    let (major, minor) = dev.split_once(':')?;
    let (major, minor) = (major.parse().ok()?, minor.parse().ok()?);
    Some((self::name(major, minor), major, minor))
}

/// Request-queue settings of a disk (a partition reports its disk's queue).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueFacts {
    pub scheduler: Option<String>,
    pub nr_requests: Option<u64>,
    pub rotational: Option<bool>,
    /// Hardware queues (directories under `mq/`), blk-mq devices only.
    pub nr_hw_queues: Option<u64>,
    /// Driver tags over all hardware queues (`mq/*/nr_tags` summed): how many requests the
    /// device itself can hold at once.
    pub hw_queue_depth: Option<u64>,
    pub read_ahead_kb: Option<u64>,
    pub wbt_lat_usec: Option<u64>,
    pub max_sectors_kb: Option<u64>,
}

impl QueueFacts {
    pub fn read(major: u32, minor: u32) -> QueueFacts {
        let dev = sys_path(&format!("dev/block/{major}:{minor}"));
        // A partition has no queue/ of its own: its parent directory is the disk.
        let base = if dev.join("queue").is_dir() {
            dev
        } else {
            match std::fs::canonicalize(&dev)
                .ok()
                .and_then(|p| p.parent().map(|p| p.to_path_buf()))
            {
                Some(p) => p,
                None => return QueueFacts::default(),
            }
        };
        let q = base.join("queue");
        QueueFacts {
            scheduler: read_trim(&q.join("scheduler")).and_then(|s| selected(&s)),
            nr_requests: read_u64(&q.join("nr_requests")),
            rotational: read_u64(&q.join("rotational")).map(|v| v != 0),
            nr_hw_queues: std::fs::read_dir(base.join("mq"))
                .ok()
                .map(|d| d.filter_map(Result::ok).count() as u64),
            hw_queue_depth: std::fs::read_dir(base.join("mq")).ok().and_then(|d| {
                d.filter_map(Result::ok)
                    .map(|e| read_u64(&e.path().join("nr_tags")))
                    .sum()
            }),
            read_ahead_kb: read_u64(&q.join("read_ahead_kb")),
            wbt_lat_usec: read_u64(&q.join("wbt_lat_usec")),
            max_sectors_kb: read_u64(&q.join("max_sectors_kb")),
        }
    }
}

/// Counters of one `/proc/diskstats` line (fields as in Documentation/admin-guide/iostats.rst;
/// discard and flush counters are absent on kernels before 4.18 and 5.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiskCounters {
    pub reads: u64,
    pub read_sectors: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
    pub in_flight: u64,
    pub io_ms: u64,
    pub weighted_ms: u64,
    pub discards: Option<u64>,
    pub flushes: Option<u64>,
}

impl DiskCounters {
    /// The counters of a disk just added (all zero), with the fields this kernel has.
    pub fn zero(&self) -> DiskCounters {
        DiskCounters {
            discards: self.discards.map(|_| 0),
            flushes: self.flushes.map(|_| 0),
            ..DiskCounters::default()
        }
    }

    /// `self - before` (in_flight is a level, kept as the later value).
    pub fn since(&self, b: &DiskCounters) -> DiskCounters {
        let opt = |a: Option<u64>, b: Option<u64>| Some(a?.wrapping_sub(b?));
        DiskCounters {
            reads: self.reads.wrapping_sub(b.reads),
            read_sectors: self.read_sectors.wrapping_sub(b.read_sectors),
            read_ms: self.read_ms.wrapping_sub(b.read_ms),
            writes: self.writes.wrapping_sub(b.writes),
            write_sectors: self.write_sectors.wrapping_sub(b.write_sectors),
            write_ms: self.write_ms.wrapping_sub(b.write_ms),
            in_flight: self.in_flight,
            io_ms: self.io_ms.wrapping_sub(b.io_ms),
            weighted_ms: self.weighted_ms.wrapping_sub(b.weighted_ms),
            discards: opt(self.discards, b.discards),
            flushes: opt(self.flushes, b.flushes),
        }
    }
}

/// `/proc/diskstats` by (major, minor), with the device name. Parsed by `procfs`.
pub fn parse_diskstats(text: &str) -> BTreeMap<(u32, u32), (String, DiskCounters)> {
    text.lines()
        .filter_map(|l| procfs::DiskStat::from_line(l).ok())
        .map(|d| {
            (
                (d.major as u32, d.minor as u32),
                (
                    d.name.clone(),
                    DiskCounters {
                        reads: d.reads,
                        read_sectors: d.sectors_read,
                        read_ms: d.time_reading,
                        writes: d.writes,
                        write_sectors: d.sectors_written,
                        write_ms: d.time_writing,
                        in_flight: d.in_progress,
                        io_ms: d.time_in_progress,
                        weighted_ms: d.weighted_time_in_progress,
                        discards: d.discards,
                        flushes: d.flushes,
                    },
                ),
            )
        })
        .collect()
}

/// `/proc/diskstats` by (major, minor): the device name and its counters.
pub type DiskStats = BTreeMap<(u32, u32), (String, DiskCounters)>;

pub fn diskstats() -> Result<DiskStats, HostError> {
    Ok(parse_diskstats(&read_text(&proc_path("diskstats"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dev_t() {
        assert_eq!(split_kdev(kdev(254, 0)), (254, 0));
        assert_eq!(split_kdev(kdev(7, 3)), (7, 3));
        assert_eq!(split_kdev(0x0fe0_0010), (254, 16));
    }

    #[test]
    fn diskstats_lines_old_and_new() {
        let t = "\
 254       0 vda 100 5 800 40 200 10 1600 90 2 120 130 7 0 56 3 4 5
   7       3 loop3 10 0 80 1 20 0 160 2 0 3 3
 garbage
";
        let m = parse_diskstats(t);
        let (name, vda) = &m[&(254, 0)];
        assert_eq!(name, "vda");
        assert_eq!((vda.reads, vda.writes, vda.in_flight), (100, 200, 2));
        assert_eq!(vda.discards, Some(7));
        assert_eq!(vda.flushes, Some(4));
        let (_, loop3) = &m[&(7, 3)];
        assert_eq!(loop3.discards, None);
        let later = DiskCounters { reads: 150, ..*vda };
        assert_eq!(later.since(vda).reads, 50);
        assert_eq!(later.since(vda).discards, Some(0));
    }

    #[test]
    fn whole_disks_from_a_tree() {
        let d = std::env::temp_dir().join(format!("tk-disks-{}", std::process::id()));
        for (n, dev) in [
            ("vda", "254:0\n"),
            ("loop0", "7:0"),
            ("bad", "x"),
            ("nodev", ""),
        ] {
            std::fs::create_dir_all(d.join(n)).unwrap();
            if !dev.is_empty() {
                std::fs::write(d.join(n).join("dev"), dev).unwrap();
            }
        }
        assert_eq!(
            whole_disks_in(&d),
            [("loop0".to_string(), 7, 0), ("vda".to_string(), 254, 0)]
        );
        let _ = std::fs::remove_dir_all(&d);
        assert!(whole_disks_in(std::path::Path::new("/nonexistent")).is_empty());
        for (name, maj, min) in whole_disks() {
            assert_eq!(super::name(maj, min), name);
        }
    }

    #[test]
    fn whole_disk_of_a_name_and_its_queue_depth() {
        for (n, maj, min) in whole_disks() {
            assert_eq!(disk_of(&n), Some((n.clone(), maj, min)));
            let q = QueueFacts::read(maj, min);
            if q.nr_hw_queues.unwrap_or(0) > 0 {
                assert!(q.hw_queue_depth.unwrap_or(0) > 0, "{n}: {q:?}");
            }
        }
        // A partition means its disk.
        for e in std::fs::read_dir("/sys/class/block").unwrap().flatten() {
            if e.path().join("partition").exists() {
                let part = e.file_name().into_string().unwrap();
                let (disk, ..) = disk_of(&part).unwrap();
                assert!(part.starts_with(&disk), "{part} -> {disk}");
            }
        }
        assert_eq!(disk_of("no-such-disk"), None);
        assert_eq!(disk_of("../block"), None);
    }

    #[test]
    fn names_this_machines_disks() {
        for ((maj, min), (name, _)) in diskstats().unwrap() {
            assert_eq!(super::name(maj, min), name);
        }
        assert_eq!(name(4095, 1), "4095:1");
    }
}
