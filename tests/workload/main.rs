//! `tk-workload`: the workloads tracekit's root tests (and the VM tests) start. Each measures
//! itself and prints one JSON object on stdout, so a test can compare tracekit with ground truth
//! that does not come from tracekit. No Python: this runs inside the minimal VM too.

use std::{fs::OpenOptions, io::Write, os::fd::AsRawFd, time::Instant};

fn usage() -> ! {
    eprintln!(
        "usage: tk-workload fsync PATH N_FSYNC N_FDATASYNC\n       tk-workload compact\n       tk-workload collapse N_2MIB\n       tk-workload memcg-write CGROUP_PROCS FILE MIB"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fsync") if args.len() == 4 => fsync(&args[1], parse(&args[2]), parse(&args[3])),
        Some("compact") if args.len() == 1 => compact(),
        Some("collapse") if args.len() == 2 => collapse(parse(&args[1])),
        Some("memcg-write") if args.len() == 4 => memcg_write(&args[1], &args[2], parse(&args[3])),
        _ => usage(),
    }
}

fn parse(s: &str) -> usize {
    s.parse().unwrap_or_else(|_| usage())
}

fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

/// Writes 4 KiB then fsyncs, N times; then the same with fdatasync, M times. Times each call.
fn fsync(path: &str, n: usize, m: usize) {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let buf = vec![0x5au8; 4096];
    let mut timed = |kind: &str, count: usize| -> Vec<u64> {
        (0..count)
            .map(|_| {
                f.write_all(&buf).expect("write");
                let t = Instant::now();
                // SAFETY: plain syscalls on an fd we own.
                let rc = unsafe {
                    if kind == "fsync" {
                        libc::fsync(f.as_raw_fd())
                    } else {
                        libc::fdatasync(f.as_raw_fd())
                    }
                };
                let d = ns(t.elapsed());
                assert_eq!(rc, 0, "{kind} failed");
                d
            })
            .collect()
    };
    let fs = timed("fsync", n);
    let fds = timed("fdatasync", m);
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "fsync_ns": fs, "fdatasync_ns": fds})
    );
}

/// Asks the kernel to compact every zone (`/proc/sys/vm/compact_memory`): the compaction runs
/// in this process, one `mm_compaction_begin/end` pair per zone.
fn compact() {
    let t = Instant::now();
    std::fs::write("/proc/sys/vm/compact_memory", "1").expect("write /proc/sys/vm/compact_memory");
    let wall = ns(t.elapsed());
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "wall_ns": wall})
    );
}

const HUGE: usize = 2 << 20;
const MADV_COLLAPSE: libc::c_int = 25;

/// Touches an anonymous 2 MiB-aligned region of `n` huge pages with small pages, then
/// collapses it with one `madvise(MADV_COLLAPSE)`, timing the call.
fn collapse(n: usize) {
    let len = (n + 1) * HUGE;
    // SAFETY: anonymous private mapping; checked for MAP_FAILED below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED, "mmap");
    let aligned = (base as usize).next_multiple_of(HUGE) as *mut u8;
    let size = n * HUGE;
    // Small pages first: with THP off at fault (enabled=madvise, no MADV_HUGEPAGE here) every
    // 4 KiB page is faulted separately, so there is something to collapse.
    for off in (0..size).step_by(4096) {
        // SAFETY: inside the mapping (aligned + size <= base + len).
        unsafe { aligned.add(off).write_volatile(1) };
    }
    let t = Instant::now();
    // SAFETY: the range is mapped and ours.
    let rc = unsafe { libc::madvise(aligned.cast(), size, MADV_COLLAPSE) };
    let wall = ns(t.elapsed());
    let errno = if rc == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    };
    let anon_huge_kb = std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("AnonHugePages:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
        });
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "rc": rc, "errno": errno, "wall_ns": wall, "anon_huge_kb": anon_huge_kb})
    );
}

/// Joins the cgroup whose `cgroup.procs` is given, then writes `mib` MiB to `path`: past the
/// cgroup's memory limit the page cache is reclaimed in this process (memcg reclaim).
fn memcg_write(procs: &str, path: &str, mib: usize) {
    std::fs::write(procs, std::process::id().to_string())
        .unwrap_or_else(|e| panic!("{procs}: {e}"));
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let buf = vec![0xa5u8; 1 << 20];
    let t = Instant::now();
    for _ in 0..mib {
        f.write_all(&buf).expect("write");
    }
    let wall = ns(t.elapsed());
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "wall_ns": wall})
    );
}
