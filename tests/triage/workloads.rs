//! The incidents' workloads, run by `tk-workload` (each prints one JSON object: its own
//! account of what it did and felt).

use super::*;

/// Workloads for the incidents: `Some(exit code)` when `args` name one.
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["triage-duty", ms] => {
            // A third of a CPU in 0.5 ms runs, 1 ms asleep between: busy, and never in anyone's
            // way for long enough to be felt (a late wait is 1 ms or more, report::harm). With
            // 3 ms runs, the page-cache writer woken beside it waited out whole runs (1 wakeup
            // in 35 over 1 ms, p99.9 11.9 ms, 7.3 ms/s of excess) whenever the fsync incident
            // held the other CPU: a real victim, which the harm model names.
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            while Instant::now() < end {
                let burst = Instant::now() + Duration::from_micros(500);
                while Instant::now() < burst {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            println!("{}", json!({"pid": std::process::id()}));
        }
        ["triage-fsync", path, ms] => {
            // An append-and-fsync loop, like a ledger or a WAL without group commit.
            use std::io::Write;
            let mut f = std::fs::File::create(path).ok()?;
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            let mut calls = 0u64;
            while Instant::now() < end {
                f.write_all(&[0x42; 512]).ok()?;
                f.sync_all().ok()?;
                calls += 1;
            }
            println!("{}", json!({"pid": std::process::id(), "calls": calls}));
        }
        ["triage-sleeper", cpu, ms, period @ ..] => {
            // A latency-sensitive loop: pinned to CPU, wakes every millisecond (or every
            // `period` microseconds) for a moment.
            let cpu: usize = cpu.parse().ok()?;
            let period = Duration::from_micros(match period {
                [us] => us.parse().ok()?,
                _ => 1_000,
            });
            // SAFETY: cpu_set_t is plain data; we set one bit and pin ourselves.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            // Its own clock is the ground truth of what it felt: each sleep's overshoot. The
            // kernel's own account of the part spent waiting for a CPU after each wakeup is
            // its run_delay (/proc/thread-self/schedstat), read around each sleep: a guest
            // whose vCPU the host preempts oversleeps without waiting in a run queue (a
            // fresh-clone run: 17.6 ms late once, 11 sleeps late, none of it run-queue time).
            let run_delay = || -> Option<u64> {
                std::fs::read_to_string("/proc/thread-self/schedstat")
                    .ok()?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()
            };
            // What it waited before its loop, from the shell's fork to its move to its CPU (its first run after
            // wake_up_new_task is a wakeup wait too: 31.9 ms once beside the hogs, its
            // sleeps never more than 7.2 ms late).
            let start_delay = run_delay()?;
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            let (mut over, mut queued): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
            while Instant::now() < end {
                let (t, d) = (Instant::now(), run_delay()?);
                std::thread::sleep(period);
                over.push((t.elapsed().as_nanos() as u64).saturating_sub(period.as_nanos() as u64));
                queued.push(run_delay()?.saturating_sub(d));
            }
            // The harm model's terms (report::harm): waits of 1 ms or more, and their excess
            // over the median.
            let terms = |v: &mut Vec<u64>| {
                v.sort_unstable();
                let q = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
                let late: Vec<u64> = v.iter().copied().filter(|o| *o >= 1_000_000).collect();
                let excess: u64 = late.iter().map(|o| o - q(0.5)).sum();
                (
                    q(0.5),
                    q(0.99),
                    v.last().copied().unwrap_or(0),
                    late.len(),
                    excess,
                )
            };
            let (p50, p99, max, late, excess) = terms(&mut over);
            let (rq_p50, rq_p99, rq_max, rq_late, rq_excess) = terms(&mut queued);
            println!(
                "{}",
                json!({"pid": std::process::id(), "wakeups": over.len(),
                       "overshoot_p50_ns": p50, "overshoot_p99_ns": p99,
                       "overshoot_max_ns": max, "late_1ms": late, "late_excess_ns": excess,
                       "runq_p50_ns": rq_p50, "runq_p99_ns": rq_p99, "runq_max_ns": rq_max,
                       "runq_late_1ms": rq_late, "runq_excess_ns": rq_excess,
                       "start_run_delay_ns": start_delay})
            );
        }
        ["triage-udp-flood", port, ms] => {
            // Datagrams of 200 bytes to 127.0.0.1:PORT for MS, pinned to CPU 0 at SCHED_IDLE:
            // receive work for whichever CPU lo's RPS steers it to, sent in time nobody else
            // wanted on CPU 0.
            // SAFETY: cpu_set_t and sched_param are plain data; we pin ourselves and change
            // our own policy.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                let p = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) != 0 {
                    return Some(1);
                }
            }
            let port: u16 = port.parse().ok()?;
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            // One socket, never bound to PORT itself: a fresh socket per batch once drew PORT
            // as its own ephemeral port and flooded itself (net-drops named it, rightly).
            let s = std::iter::repeat_with(|| std::net::UdpSocket::bind("127.0.0.1:0"))
                .take(8)
                .filter_map(Result::ok)
                .find(|s| s.local_addr().is_ok_and(|a| a.port() != port))?;
            let buf = [0x42u8; 200];
            let mut sent = 0usize;
            while Instant::now() < end {
                // ECONNREFUSED (an earlier datagram's ICMP) does not stop it: this one left.
                for _ in 0..1000 {
                    sent += usize::from(s.send_to(&buf, ("127.0.0.1", port)).is_ok());
                }
            }
            println!("{}", json!({"pid": std::process::id(), "sent": sent}));
        }
        ["triage-writer", path, ms] => {
            // 64 KiB to the page cache every 10 ms, rewinding at 16 MiB; never synced.
            use std::io::{Seek, Write};
            let mut f = std::fs::File::create(path).ok()?;
            let buf = vec![0x5a_u8; 64 << 10];
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            let mut n = 0u64;
            while Instant::now() < end {
                f.write_all(&buf).ok()?;
                n += 1;
                if n.is_multiple_of(256) {
                    f.rewind().ok()?;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("{}", json!({"pid": std::process::id(), "writes": n}));
        }
        ["bulk-rewrite", path, mib, ms, us_per_mib, rest @ ..] => {
            // A bulk writer: rewrites the first MIB MiB of PATH in 64 KiB buffered writes,
            // paced at US_PER_MIB (5000: 200 MiB/s, leaving the CPUs to others), until MS have
            // passed (one pass at least); never syncs. Optionally joins a cgroup first (its
            // `cgroup.procs`). Reports the bytes it dirtied by its own counter (/proc/self/io
            // write_bytes: the page cache counts each page it makes dirty).
            use std::io::{Seek, Write};
            if let [procs] = rest {
                std::fs::write(procs, std::process::id().to_string()).ok()?;
            }
            let write_bytes = || -> Option<u64> {
                let io = std::fs::read_to_string("/proc/self/io").ok()?;
                io.lines()
                    .find_map(|l| l.strip_prefix("write_bytes: "))?
                    .trim()
                    .parse()
                    .ok()
            };
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(path)
                .ok()?;
            let (mib, start) = (mib.parse::<u64>().ok()?, Instant::now());
            let pace: u64 = us_per_mib.parse().ok()?;
            let end = start + Duration::from_millis(ms.parse().ok()?);
            let buf = vec![0xa5_u8; 64 << 10];
            let before = write_bytes()?;
            let mut written = 0u64;
            loop {
                for _ in 0..mib * 16 {
                    f.write_all(&buf).ok()?;
                    written += 1;
                    let due = start + Duration::from_micros(written * pace / 16);
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                }
                if Instant::now() >= end {
                    break;
                }
                f.rewind().ok()?;
            }
            println!(
                "{}",
                json!({"pid": std::process::id(), "written_bytes": written << 16,
                       "write_bytes": write_bytes()? - before})
            );
        }
        ["triage-forks", per_s, ms] => {
            // A fork storm: `true` spawned PER_S times a second (paced in 10 ms steps), reaped
            // in batches, for MS.
            let per_s: u64 = per_s.parse().ok()?;
            let start = Instant::now();
            let end = start + Duration::from_millis(ms.parse().ok()?);
            let mut kids = Vec::new();
            let mut spawned = 0u64;
            while Instant::now() < end {
                let due = start.elapsed().as_millis() as u64 * per_s / 1000;
                while spawned < due {
                    kids.push(
                        Command::new("/bin/true")
                            .stdout(Stdio::null())
                            .spawn()
                            .ok()?,
                    );
                    spawned += 1;
                    if kids.len() >= 64 {
                        for mut k in kids.drain(..) {
                            let _ = k.wait();
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            for mut k in kids {
                let _ = k.wait();
            }
            println!("{}", json!({"pid": std::process::id(), "spawned": spawned}));
        }
        _ => return None,
    }
    Some(0)
}
