//! Causes linked across collectors in one window, each link measured: a process slowed in its
//! sync calls is linked to the other issuers of the disk it writes to (io-lat's rows: the disk
//! with most of its own request time, its sync writes being issued in its own context), and the
//! biggest of them becomes its culprit when it took most of that disk's request time. Writeback
//! is the flusher's I/O: it is charged to the cgroup the kernel charged it to, or else to the
//! process that dirtied most of that disk's pages in the window (io-lat's `dirtied` rows).

use std::collections::BTreeMap;

use crate::{
    report::{
        findings::{Finding, Num, Score, Subject},
        harm::{MIN_DIRTIED_SHARE_PPM, MIN_DISK_SHARE_PPM},
        links::{DiskDirtier, DiskIssuer, Link},
        render::{fmt_bytes, fmt_ns},
    },
    tools::{
        fsync_lat::{self, FSYNC},
        io_lat,
        memstall::MEMCG_LIMIT,
        net_rx, runq_lat,
    },
};

/// Who else used a disk: a process, writeback charged to a cgroup (the flusher issues it, the
/// cgroup dirtied the pages), or writeback charged to no cgroup of its own, whose pages the
/// top dirtier of the disk made dirty.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Other {
    Process(u32),
    Writeback(String),
    Flusher,
    Dirtier(u32),
}

/// The process that dirtied most of `kdev`'s pages in the window, if it dirtied at least
/// [`MIN_DIRTIED_SHARE_PPM`] of them and is neither `victim` nor a kernel thread (jbd2's
/// journal pages are the victim's own syncs): it, its bytes (folios where bytes are not
/// measured), the disk's total and its share in ppm.
fn top_dirtier<'a>(
    dirtiers: &[&'a DiskDirtier],
    kdev: u32,
    victim: u32,
) -> Option<(&'a DiskDirtier, u64, u64, u64)> {
    let on: Vec<&&DiskDirtier> = dirtiers.iter().filter(|d| d.kdev == kdev).collect();
    let amount = |d: &DiskDirtier| d.bytes.unwrap_or(d.folios);
    let total: u64 = on.iter().map(|d| amount(d)).sum();
    let top = on
        .iter()
        .filter(|d| !d.kthread && d.who.pid != Some(victim))
        .max_by_key(|d| (amount(d), std::cmp::Reverse(d.who.pid)))?;
    let ppm = (amount(top) as u128 * 1_000_000 / total.max(1) as u128) as u64;
    (ppm >= MIN_DIRTIED_SHARE_PPM).then_some((**top, amount(top), total, ppm))
}

/// Links each sync finding to its disk's other issuers (see the module): the culprit, its
/// share, and a sentence on both sides (the culprit's own finding, io-lat's about the process
/// or the disk, or memstall's about the cgroup, says whom it slows).
pub(super) fn link_sync_waits(f: &mut [Finding], links: &[Link]) {
    let mut issuers: Vec<&DiskIssuer> = Vec::new();
    let mut dirtiers: Vec<&DiskDirtier> = Vec::new();
    for l in links {
        match l {
            Link::Disk(d) => issuers.push(d),
            Link::Dirtied(d) => dirtiers.push(d),
        }
    }
    let mut notes: Vec<(Other, String, String, Score)> = Vec::new();
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
        // Cache flushes are the sync calls' own cost (kblockd issues their pre-flushes).
        let on: Vec<&&DiskIssuer> = issuers
            .iter()
            .filter(|d| d.kdev == kdev && !d.flush)
            .collect();
        let own: u64 = on
            .iter()
            .filter(|d| d.who.pid == Some(pid))
            .map(|d| d.time_ns)
            .sum();
        let mut by: BTreeMap<Other, (u64, u64, Subject)> = BTreeMap::new();
        let mut unshared = 0u64;
        for d in &on {
            let key = match (d.who.pid, d.kthread, d.cgroup.as_deref()) {
                (Some(p), false, _) if p != pid => Other::Process(p),
                // Writeback of a cgroup of its own (not the root, not the victim's): the cgroup
                // that dirtied the pages is the one to change.
                (_, true, Some(c)) if c != "/" && Some(c) != x.subject.cgroup.as_deref() => {
                    Other::Writeback(c.to_string())
                }
                _ if d.writeback => Other::Flusher,
                // A kernel thread's own requests (jbd2's journal commits, which every fsync on
                // the file system waits for, a loop device's worker) serve the disk's users and
                // are charged to none of them: left out of the shares, as cache flushes are.
                _ => {
                    if d.who.pid != Some(pid) {
                        unshared += d.time_ns;
                    }
                    continue;
                }
            };
            let subject = match &key {
                Other::Writeback(c) => Subject::named("cgroup", c.clone()),
                _ => d.who.clone(),
            };
            let e = by.entry(key).or_insert((0, 0, subject));
            e.0 += d.time_ns;
            e.1 += d.requests;
        }
        // The request time charged to someone: the victim's own and the other issuers'.
        let total = own + by.values().map(|v| v.0).sum::<u64>();
        if total == 0 {
            continue;
        }
        let Some((mut key, (ns, n, mut who))) =
            by.into_iter().max_by_key(|(k, v)| (v.0, k.clone()))
        else {
            continue;
        };
        let ppm = ns as u128 * 1_000_000 / total as u128;
        if ppm < MIN_DISK_SHARE_PPM as u128 || ns <= own {
            continue;
        }
        let mut dirtied = String::new();
        if key == Other::Flusher {
            let Some((d, amount, all, share)) = top_dirtier(&dirtiers, kdev, pid) else {
                continue;
            };
            let amount_text = |v: u64| match d.bytes {
                Some(_) => fmt_bytes(v),
                None => format!("{v} folios"),
            };
            dirtied = format!(
                " {} dirtied {} of the {} dirtied on {disk} in the window ({:.0} %).",
                d.who.text(),
                amount_text(amount),
                amount_text(all),
                share as f64 / 1e4,
            );
            x.evidence.extend([
                ("culprit_dirtied_share_ppm", Num::U(share)),
                (
                    if d.bytes.is_some() {
                        "culprit_dirtied_bytes"
                    } else {
                        "culprit_dirtied_folios"
                    },
                    Num::U(amount),
                ),
            ]);
            key = Other::Dirtier(d.who.pid.unwrap_or(0));
            who = d.who.clone();
        }
        let what = match &key {
            Other::Writeback(c) => format!("writeback of cgroup {c}"),
            Other::Dirtier(_) => format!("writeback of pages {} dirtied", who.text()),
            _ => who.text(),
        };
        x.summary.push_str(&format!(
            " The disk it writes to, {disk}, was busy with {what}: {:.0} % of the disk's request time in the window ({n} requests, {}), its own requests {:.0} %{}.{dirtied}",
            ppm as f64 / 1e4,
            fmt_ns(ns),
            own as f64 * 100.0 / total as f64,
            if unshared > 0 {
                format!(" (kernel threads' own requests, the journal's, {} more, left out)", fmt_ns(unshared))
            } else {
                String::new()
            },
        ));
        let limit = match key {
            Other::Dirtier(_) => "limit the other's dirtying (its cgroup's memory.max or io.max, a lower vm.dirty_background_bytes so writeback starts sooner and in smaller batches, or sync_file_range in the writer)",
            _ => "limit the other's I/O (io.max or io.weight in its cgroup, ionice, fewer parallel requests)",
        };
        x.advice = format!(
            "{} is slowed by the other work on {disk}: move it to a disk of its own, or {limit}; then {}",
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
            disk.to_string(),
            format!(
                " It slows {}'s sync calls on {disk} (p99 {}).",
                x.subject.text(),
                fmt_ns(x.ev(fsync_lat::ev::P99_NS).unwrap_or(0.0) as u64)
            ),
            x.score,
        ));
    }
    for (key, disk, note, victim) in notes {
        for y in f.iter_mut().filter(|y| y.cause != FSYNC) {
            let io = y.cause == io_lat::IO_LATENCY || y.cause == io_lat::IO_QUEUE;
            let by_pid = |p: u32| {
                y.subject.pid == Some(p) || y.culprit.as_ref().and_then(|c| c.pid) == Some(p)
            };
            let theirs = match &key {
                Other::Process(p) => io && by_pid(*p),
                Other::Writeback(c) => {
                    y.cause == MEMCG_LIMIT && y.subject.cgroup.as_deref() == Some(c.as_str())
                }
                // The dirtier's own findings (its memory cgroup at its limit, say), not
                // others' that name it as their culprit, and the disk's, whose top issuer is
                // the flusher writing its pages.
                Other::Dirtier(p) => {
                    y.subject.pid == Some(*p)
                        || (io
                            && y.subject.kind == "device"
                            && y.subject.name.as_deref() == Some(disk.as_str()))
                }
                Other::Flusher => false,
            };
            if theirs {
                y.summary.push_str(&note);
                // The culprit's own finding is the victim's harm seen from the other side
                // (its request time counts requests in flight at once): it ranks after it.
                y.rank_below(victim);
            }
        }
    }
}

/// Links a receiver's socket drops to its own waits for a CPU in the same window (runq-lat's
/// finding about the same process, with the holder of its CPU as culprit): a reader that is
/// not running does not drain its buffer, so the task that held its CPU through its long waits
/// is the drops' culprit too, and the CPU saturation that task is part of ranks below the
/// drops. Measured with iperf3's UDP server pinned beside two CPU hogs: alone it lost 0.3 % of
/// 178,543 datagrams; beside them it waited 21 % of its time for its CPU (1 in 56 wakeups over
/// 1 ms, max 9.2 ms) and lost 17.4 %, all at a full 128 KiB buffer.
pub(super) fn link_drops_to_cpu_waits(f: &mut [Finding]) {
    let mut linked: Vec<Score> = Vec::new();
    for i in 0..f.len() {
        let x = &f[i];
        let Some(pid) = x.subject.pid else { continue };
        if x.cause != net_rx::NET_DROPS || x.culprit.is_some() {
            continue;
        }
        let Some(w) = f.iter().find(|y| {
            y.cause == runq_lat::RUNQ_DELAY && y.subject.pid == Some(pid) && y.culprit.is_some()
        }) else {
            continue;
        };
        let culprit = w.culprit.clone().expect("found with a culprit");
        let ev = |n| w.ev(n).unwrap_or(0.0) as u64;
        let (waits, wait_ns, window_ns) = (
            ev(runq_lat::ev::WAKE_WAITS),
            ev(runq_lat::ev::WAKE_WAIT_TOTAL_NS),
            ev(crate::report::findings::WINDOW_NS),
        );
        let (late, max_ns) = (ev(runq_lat::ev::WAKE_LATE), ev(runq_lat::ev::WAKE_MAX_NS));
        let floor = fmt_ns(crate::report::harm::LATE_FLOOR_NS);
        let (held_ns, of) = match w.ev(runq_lat::ev::CULPRIT_LATE_DELAY_NS) {
            Some(v) => (v as u64, format!("its waits over {floor}")),
            None => (ev(runq_lat::ev::CULPRIT_DELAY_NS), "its waits".into()),
        };
        // The holder is a process, or a CPU's softirq work (runq-lat names the CPU whose
        // ksoftirqd held the waits: the receive work of the very packets, often).
        let softirq = culprit.kind == "cpu";
        let holder = if softirq {
            format!("{}'s softirq work (ksoftirqd)", culprit.text())
        } else {
            culprit.text()
        };
        let sentence = format!(
            " Meanwhile it waited for a CPU {:.1} % of the time ({waits} waits, {late} of them over {floor}, max {}); {holder} held its CPU for {} of {of}: a reader that is not running does not drain its buffer.",
            wait_ns as f64 * 100.0 / window_ns.max(1) as f64,
            fmt_ns(max_ns),
            fmt_ns(held_ns),
        );
        let x = &mut f[i];
        x.summary.push_str(&sentence);
        x.advice = if softirq {
            format!(
                "keep the reader off {} (taskset, cpusets), or move the softirq work there to other CPUs (RPS in /sys/class/net/<dev>/queues/rx-*/rps_cpus, the NIC's IRQ affinity), then size the buffer: {}",
                culprit.text(),
                x.advice
            )
        } else {
            format!(
                "give the reader its CPU first (keep {} off its CPU with cpusets or taskset, or lower its weight: nice 19, a smaller cpu.weight), then size the buffer: {}",
                culprit.text(),
                x.advice
            )
        };
        x.evidence.extend([
            ("culprit_delay_ns", Num::U(held_ns)),
            ("receiver_wait_ns", Num::U(wait_ns)),
            ("receiver_late_waits", Num::U(late)),
            ("receiver_max_wait_ns", Num::U(max_ns)),
        ]);
        x.culprit = Some(culprit);
        linked.push(x.score);
    }
    // The saturation the holders are part of is the drops' cause seen from the other side.
    for v in linked {
        for y in f.iter_mut().filter(|y| y.cause == runq_lat::CPU_SATURATED) {
            y.rank_below(v);
        }
    }
}

/// Links a process whose wakeups waited behind a CPU's softirq work (runq-lat's finding with
/// that CPU as culprit: its ksoftirqd held most of the long waits, on a CPU busy with softirqs)
/// to the other findings about the same CPU (net-rx's: the CPU doing most of the receive
/// softirq work, its input backlog overflowing). They are the cause seen from the CPU's side:
/// each says whom it delays, with the victim's late waits, and ranks below the victim, the
/// first line of whose finding names the CPU.
pub(super) fn link_cpu_waits_to_softirq(f: &mut [Finding]) {
    let mut victims: Vec<(String, String, Score)> = Vec::new();
    for x in f
        .iter()
        .filter(|x| x.cause == runq_lat::RUNQ_DELAY && x.ev(runq_lat::ev::SOFTIRQ_CPU).is_some())
    {
        let Some(cpu) = x.culprit.as_ref().and_then(|c| c.name.clone()) else {
            continue;
        };
        let ev = |n| x.ev(n).unwrap_or(0.0) as u64;
        let felt = match x.ev(runq_lat::ev::CULPRIT_LATE_DELAY_NS) {
            Some(held) => format!(
                "{} of them waited over {} (max {}), {} of those waits behind this CPU's ksoftirqd",
                ev(runq_lat::ev::WAKE_LATE),
                fmt_ns(ev(runq_lat::ev::WAKE_LATE_OVER_NS)),
                fmt_ns(ev(runq_lat::ev::WAKE_MAX_NS)),
                fmt_ns(held as u64),
            ),
            None => format!(
                "they waited {} in {} waits (p50 {}, max {}), {} of it behind this CPU's ksoftirqd",
                fmt_ns(ev(runq_lat::ev::WAKE_WAIT_TOTAL_NS)),
                ev(runq_lat::ev::WAKE_WAITS),
                fmt_ns(ev(runq_lat::ev::WAKE_P50_NS)),
                fmt_ns(ev(runq_lat::ev::WAKE_MAX_NS)),
                fmt_ns(ev(runq_lat::ev::CULPRIT_DELAY_NS)),
            ),
        };
        victims.push((
            cpu,
            format!(" It delays {}'s wakeups: {felt}.", x.subject.text()),
            x.score,
        ));
    }
    for (cpu, note, score) in victims {
        for y in f
            .iter_mut()
            .filter(|y| y.subject.kind == "cpu" && y.subject.name.as_deref() == Some(&cpu))
        {
            y.summary.push_str(&note);
            y.rank_below(score);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(pid: u32, comm: &str, kthread: bool, cgroup: &str, n: u64, ns: u64) -> DiskIssuer {
        DiskIssuer {
            kdev: 7 << 20,
            disk: "loop0".into(),
            who: Subject::process(pid, comm),
            kthread,
            cgroup: Some(cgroup.into()),
            requests: n,
            time_ns: ns,
            writeback: false,
            flush: false,
        }
    }

    fn issuer(pid: u32, comm: &str, kthread: bool, cgroup: &str, n: u64, ns: u64) -> Link {
        Link::Disk(disk(pid, comm, kthread, cgroup, n, ns))
    }

    fn dirtier(pid: u32, comm: &str, kthread: bool, bytes: u64) -> Link {
        Link::Dirtied(DiskDirtier {
            kdev: 7 << 20,
            disk: "loop0".into(),
            who: Subject::process(pid, comm),
            kthread,
            folios: bytes / 4096,
            bytes: Some(bytes),
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
        .evidence(fsync_lat::ev::P99_NS, 142_000_000u64)
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

    /// The WAL's disk busy with the flusher's writeback (root cgroup: nobody's to change), the
    /// pages mostly dirtied by a bulk writer: the writer is the culprit, by its share of the
    /// disk's dirtied bytes, and the disk's own finding says whom its writeback slows. The
    /// kblockd cache flushes of the WAL's fsyncs are not the other's load.
    #[test]
    fn root_writeback_names_the_process_that_dirtied_the_pages() {
        let disk_finding = Finding::new(
            "io-lat",
            io_lat::IO_LATENCY,
            Subject::named("device", "loop0"),
            Score::NsPerS(1_500_000_000),
            "loop0 is slow.".into(),
        );
        let links = |writer_bytes: u64| {
            [
                issuer(5, "wal", false, "/", 2_000, 600_000_000),
                Link::Disk(DiskIssuer {
                    flush: true,
                    ..disk(90, "kworker/0:1H", true, "/", 2_000, 3_500_000_000)
                }),
                Link::Disk(DiskIssuer {
                    writeback: true,
                    ..disk(40, "kworker/u8:1", true, "/", 900, 4_000_000_000)
                }),
                dirtier(5, "wal", false, 13_000_000),
                dirtier(60, "jbd2/loop0-8", true, 3_000_000),
                dirtier(7, "bulk", false, writer_bytes),
                dirtier(8, "small", false, 2_000_000),
            ]
        };
        let mut f = vec![wal(5), disk_finding];
        link_sync_waits(&mut f, &links(880_000_000));
        let c = f[0].culprit.as_ref().expect("a culprit");
        assert_eq!((c.pid, c.name.as_deref()), (Some(7), Some("bulk")));
        // 4.0 s of 4.6 s without the flushes (with them: 50 %, and the link would hang on it).
        assert_eq!(f[0].ev("culprit_disk_share_ppm"), Some(869_565.0));
        assert_eq!(f[0].ev("culprit_dirtied_bytes"), Some(880_000_000.0));
        assert_eq!(f[0].ev("culprit_dirtied_share_ppm"), Some(979_955.0));
        for want in [
            "busy with writeback of pages bulk (pid 7) dirtied: 87 %",
            "bulk (pid 7) dirtied 839.2MiB of the 856.4MiB dirtied on loop0 in the window (98 %)",
        ] {
            assert!(f[0].summary.contains(want), "{want}: {}", f[0].summary);
        }
        assert!(
            f[0].advice.contains("dirty_background_bytes"),
            "{}",
            f[0].advice
        );
        assert!(
            f[1].summary
                .contains("It slows wal (pid 5)'s sync calls on loop0"),
            "{}",
            f[1].summary
        );
        assert_eq!(f[1].score, Score::NsPerS(899_999_999));
        // A writer with a third of the dirtied bytes is not behind most of the writeback.
        let mut f = vec![wal(5)];
        link_sync_waits(&mut f, &links(9_000_000));
        assert_eq!(f[0].culprit, None, "{:?}", f[0]);
        assert!(!f[0].summary.contains("busy with"), "{}", f[0].summary);
    }

    fn drops(pid: u32, score: u64) -> Finding {
        Finding::new(
            "net-rx",
            net_rx::NET_DROPS,
            Subject::process(pid, "iperf3"),
            Score::NsPerS(score),
            "udp :5999: 31016 drops.".into(),
        )
    }

    fn waits(pid: u32, culprit: Option<u32>) -> Finding {
        let mut w = Finding::new(
            "runq-lat",
            runq_lat::RUNQ_DELAY,
            Subject::process(pid, "iperf3"),
            Score::NsPerS(211_000_000),
            "iperf3 waited.".into(),
        )
        .evidence(runq_lat::ev::WAKE_WAITS, 16_175u64)
        .evidence(runq_lat::ev::WAKE_WAIT_TOTAL_NS, 1_477_000_000u64)
        .evidence(runq_lat::ev::WAKE_LATE, 289u64)
        .evidence(runq_lat::ev::WAKE_MAX_NS, 9_170_000u64)
        .evidence(crate::report::findings::WINDOW_NS, 7_000_000_000u64);
        if let Some(c) = culprit {
            w.culprit = Some(Subject::process(c, "sh"));
            w = w.evidence(runq_lat::ev::CULPRIT_LATE_DELAY_NS, 900_000_000u64);
        }
        w
    }

    /// The receiver's drops name the holder of its CPU when runq-lat measured one for the same
    /// process, and the saturation finding ranks below them; another process's waits, or
    /// waits with no changeable holder, link nothing.
    #[test]
    fn drops_name_the_holder_of_the_receivers_cpu() {
        let sat = Finding::new(
            "runq-lat",
            runq_lat::CPU_SATURATED,
            Subject::named("cpu", "1"),
            Score::NsPerS(210_999_999),
            "CPU 1 saturated.".into(),
        );
        let mut f = vec![waits(7, Some(9)), sat, drops(7, 173_000_000)];
        link_drops_to_cpu_waits(&mut f);
        let d = &f[2];
        assert_eq!(d.culprit.as_ref().and_then(|c| c.pid), Some(9));
        assert!(
            d.summary
                .contains("waited for a CPU 21.1 % of the time (16175 waits, 289 of them over 1.00ms, max 9.17ms); sh (pid 9) held its CPU for 900ms of its waits over 1.00ms"),
            "{}",
            d.summary
        );
        assert_eq!(d.ev("receiver_wait_ns"), Some(1_477_000_000.0));
        assert!(
            d.advice.starts_with("give the reader its CPU first"),
            "{}",
            d.advice
        );
        assert_eq!(f[1].score, Score::NsPerS(172_999_999));
        for mut f in [
            vec![waits(8, Some(9)), drops(7, 1)],
            vec![waits(7, None), drops(7, 1)],
        ] {
            link_drops_to_cpu_waits(&mut f);
            assert_eq!(f[1].culprit, None);
            assert_eq!(f[1].summary, "udp :5999: 31016 drops.");
        }
    }

    /// A process whose wakeups waited behind CPU 1's softirq work: net-rx's finding about CPU
    /// 1 says whom it delays and ranks below; a finding about CPU 0 is untouched; a receiver's
    /// drops name CPU 1's softirq work and are told to move off it or move the work.
    #[test]
    fn softirq_work_on_a_cpu_is_linked_to_whom_it_delays() {
        let mut w = waits(7, None)
            .evidence(runq_lat::ev::SOFTIRQ_CPU, 1u64)
            .evidence(runq_lat::ev::CPU_SOFTIRQ_PPM, 250_000u64)
            .evidence(runq_lat::ev::WAKE_LATE_OVER_NS, 1_000_000u64)
            .evidence(runq_lat::ev::CULPRIT_LATE_DELAY_NS, 35_000_000u64);
        w.culprit = Some(Subject::named("cpu", "CPU 1"));
        w.score = Score::NsPerS(12_000_000);
        let cpu = |n: u32, score| {
            Finding::new(
                "net-rx",
                net_rx::SOFTIRQ_IMBALANCE,
                Subject::named("cpu", format!("CPU {n}")),
                Score::NsPerS(score),
                format!("CPU {n} handles NET_RX."),
            )
        };
        let mut f = vec![
            w,
            cpu(1, 220_000_000),
            cpu(0, 50_000_000),
            drops(7, 173_000_000),
        ];
        link_drops_to_cpu_waits(&mut f);
        link_cpu_waits_to_softirq(&mut f);
        assert_eq!(f[1].score, Score::NsPerS(11_999_999));
        assert_eq!(
            f[1].summary,
            "CPU 1 handles NET_RX. It delays iperf3 (pid 7)'s wakeups: 289 of them waited over 1.00ms (max 9.17ms), 35.0ms of those waits behind this CPU's ksoftirqd."
        );
        assert_eq!(f[2].score, Score::NsPerS(50_000_000));
        assert_eq!(f[2].summary, "CPU 0 handles NET_RX.");
        let d = &f[3];
        assert_eq!(d.culprit.as_ref().map(|c| c.kind), Some("cpu"));
        assert!(
            d.summary.contains(
                "CPU 1's softirq work (ksoftirqd) held its CPU for 35.0ms of its waits over 1.00ms"
            ),
            "{}",
            d.summary
        );
        assert!(
            d.advice.starts_with("keep the reader off CPU 1"),
            "{}",
            d.advice
        );
    }
}
