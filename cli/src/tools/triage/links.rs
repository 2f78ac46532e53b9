//! Causes linked across collectors in one window, each link measured: a process slowed in its
//! sync calls is linked to the other issuers of the disk it writes to (io-lat's rows: the disk
//! with most of its own request time, its sync writes being issued in its own context), and the
//! biggest of them becomes its culprit when it took most of that disk's request time.

use std::collections::BTreeMap;

use crate::{
    report::{
        findings::{Finding, Num, Score, Subject},
        harm::MIN_DISK_SHARE_PPM,
        links::{DiskIssuer, Link},
        render::fmt_ns,
    },
    tools::{fsync_lat::FSYNC, io_lat, memstall::MEMCG_LIMIT},
};

/// Who else used a disk: a process, or writeback charged to a cgroup (the flusher issues it,
/// the cgroup dirtied the pages).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Other {
    Process(u32),
    Writeback(String),
}

/// Links each sync finding to its disk's other issuers (see the module): the culprit, its
/// share, and a sentence on both sides (the culprit's own finding, io-lat's about the process
/// or memstall's about the cgroup, says whom it slows).
pub(super) fn link_sync_waits(f: &mut [Finding], links: &[Link]) {
    let issuers: Vec<&DiskIssuer> = links
        .iter()
        .map(|l| match l {
            Link::Disk(d) => d,
        })
        .collect();
    let mut notes: Vec<(Other, String, Score)> = Vec::new();
    for x in f.iter_mut().filter(|x| x.cause == FSYNC) {
        let Some(pid) = x.subject.pid else { continue };
        // Its disk: where its own requests spent the most time.
        let mut mine: BTreeMap<u32, (u64, &str)> = BTreeMap::new();
        for d in issuers.iter().filter(|d| d.who.pid == Some(pid)) {
            let e = mine.entry(d.kdev).or_insert((0, d.disk.as_str()));
            e.0 += d.time_ns;
        }
        let Some((kdev, (_, disk))) = mine.into_iter().max_by_key(|(k, v)| (v.0, *k)) else {
            continue;
        };
        let on: Vec<&&DiskIssuer> = issuers.iter().filter(|d| d.kdev == kdev).collect();
        let total: u64 = on.iter().map(|d| d.time_ns).sum();
        if total == 0 {
            continue;
        }
        let own: u64 = on
            .iter()
            .filter(|d| d.who.pid == Some(pid))
            .map(|d| d.time_ns)
            .sum();
        let mut by: BTreeMap<Other, (u64, u64, Subject)> = BTreeMap::new();
        for d in &on {
            let key = match (d.who.pid, d.kthread, d.cgroup.as_deref()) {
                (Some(p), false, _) if p != pid => Other::Process(p),
                // Writeback of a cgroup of its own (not the root, not the victim's): the cgroup
                // that dirtied the pages is the one to change.
                (_, true, Some(c)) if c != "/" && Some(c) != x.subject.cgroup.as_deref() => {
                    Other::Writeback(c.to_string())
                }
                _ => continue,
            };
            let subject = match &key {
                Other::Process(_) => d.who.clone(),
                Other::Writeback(c) => Subject::named("cgroup", c.clone()),
            };
            let e = by.entry(key).or_insert((0, 0, subject));
            e.0 += d.time_ns;
            e.1 += d.requests;
        }
        let Some((key, (ns, n, who))) = by.into_iter().max_by_key(|(k, v)| (v.0, k.clone())) else {
            continue;
        };
        let ppm = ns as u128 * 1_000_000 / total as u128;
        if ppm < MIN_DISK_SHARE_PPM as u128 || ns <= own {
            continue;
        }
        let what = match &key {
            Other::Process(_) => who.text(),
            Other::Writeback(c) => format!("writeback of cgroup {c}"),
        };
        x.summary.push_str(&format!(
            " The disk it writes to, {disk}, was busy with {what}: {:.0} % of the disk's request time in the window ({n} requests, {}), its own requests {:.0} %.",
            ppm as f64 / 1e4,
            fmt_ns(ns),
            own as f64 * 100.0 / total as f64,
        ));
        x.advice = format!(
            "{} is slowed by the other work on {disk}: move it to a disk of its own, or limit the other's I/O (io.max or io.weight in its cgroup, ionice, fewer parallel requests); then {}",
            x.subject.text(),
            x.advice
        );
        x.culprit = Some(who);
        x.evidence.extend([
            ("culprit_disk_share_ppm", Num::U(ppm as u64)),
            ("culprit_disk_requests", Num::U(n)),
            ("culprit_disk_time_ns", Num::U(ns)),
        ]);
        notes.push((
            key,
            format!(
                " It slows {}'s sync calls on {disk} (p99 {}).",
                x.subject.text(),
                fmt_ns(x.ev("p99_ns").unwrap_or(0.0) as u64)
            ),
            x.score,
        ));
    }
    for (key, note, victim) in notes {
        for y in f.iter_mut() {
            let theirs = match &key {
                Other::Process(p) => {
                    (y.cause == io_lat::IO_LATENCY || y.cause == io_lat::IO_QUEUE)
                        && (y.subject.pid == Some(*p)
                            || y.culprit.as_ref().and_then(|c| c.pid) == Some(*p))
                }
                Other::Writeback(c) => {
                    y.cause == MEMCG_LIMIT && y.subject.cgroup.as_deref() == Some(c.as_str())
                }
            };
            if theirs {
                y.summary.push_str(&note);
                // The culprit's own finding is the victim's harm seen from the other side
                // (its request time counts requests in flight at once): it ranks after it.
                if let (Score::NsPerS(v), Score::NsPerS(c)) = (victim, y.score) {
                    if c >= v {
                        y.score = Score::NsPerS(v.saturating_sub(1));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(pid: u32, comm: &str, kthread: bool, cgroup: &str, n: u64, ns: u64) -> Link {
        Link::Disk(DiskIssuer {
            kdev: 7 << 20,
            disk: "loop0".into(),
            who: Subject::process(pid, comm),
            kthread,
            cgroup: Some(cgroup.into()),
            requests: n,
            time_ns: ns,
        })
    }

    fn wal(pid: u32) -> Finding {
        Finding::new(
            "fsync-lat",
            FSYNC,
            Subject::process(pid, "wal"),
            Score::NsPerS(900_000_000),
            "wal spent 9 s in fsync.".into(),
        )
        .evidence("p99_ns", 142_000_000u64)
    }

    /// An O_DIRECT flood on the WAL's disk takes 90 % of its request time: the flood is the
    /// culprit, and its own io-lat finding says whom it slows.
    #[test]
    fn the_other_issuer_of_the_disk_is_the_culprit() {
        let flood = Finding::new(
            "io-lat",
            io_lat::IO_LATENCY,
            Subject::named("device", "loop0"),
            Score::NsPerS(2_300_000_000),
            "loop0 is saturated.".into(),
        );
        let mut flood = flood;
        flood.culprit = Some(Subject::process(9, "fio"));
        let mut f = vec![wal(5), flood];
        let links = [
            issuer(5, "wal", false, "/", 100, 100_000_000),
            issuer(9, "fio", false, "/", 9_000, 900_000_000),
        ];
        link_sync_waits(&mut f, &links);
        assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(9));
        assert_eq!(f[0].ev("culprit_disk_share_ppm"), Some(900_000.0));
        assert!(
            f[0].summary.contains("busy with fio (pid 9): 90 %"),
            "{}",
            f[0].summary
        );
        assert!(
            f[1].summary.contains("It slows wal (pid 5)'s sync calls"),
            "{}",
            f[1].summary
        );
        // Its request time (32 in flight: 2.3 s/s in a CI run) no longer outranks the WAL.
        assert_eq!(f[1].score, Score::NsPerS(899_999_999));
    }

    /// Writeback charged to another cgroup is named as that cgroup; the root cgroup's and the
    /// victim's own are nobody's to change; a disk the victim mostly uses itself has no culprit.
    #[test]
    fn writeback_names_its_cgroup_and_own_io_is_no_culprit() {
        let mut f = vec![wal(5)];
        let links = [
            issuer(5, "wal", false, "/", 100, 100_000_000),
            issuer(40, "kworker/u8:1", true, "/bulk", 800, 700_000_000),
        ];
        link_sync_waits(&mut f, &links);
        let c = f[0].culprit.as_ref().unwrap();
        assert_eq!((c.kind, c.name.as_deref()), ("cgroup", Some("/bulk")));
        let mut f = vec![wal(5)];
        let links = [
            issuer(5, "wal", false, "/", 100, 800_000_000),
            issuer(40, "kworker/u8:1", true, "/", 800, 700_000_000),
            issuer(9, "fio", false, "/", 10, 100_000_000),
        ];
        link_sync_waits(&mut f, &links);
        assert_eq!(f[0].culprit, None, "{:?}", f[0]);
    }
}
