//! `tk-workload`: the workloads tracekit's root tests (and the VM tests) start. Each measures
//! itself and prints one JSON object on stdout, so a test can compare tracekit with ground truth
//! that does not come from tracekit. No Python: this runs inside the minimal VM too.

use std::{fs::OpenOptions, io::Write, os::fd::AsRawFd, time::Instant};

fn usage() -> ! {
    eprintln!(
        "usage: tk-workload fsync PATH N_FSYNC N_FDATASYNC | pingpong ROUNDS | spin MILLISECONDS"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fsync") if args.len() == 4 => fsync(&args[1], parse(&args[2]), parse(&args[3])),
        Some("pingpong") if args.len() == 2 => pingpong(parse(&args[1])),
        Some("spin") if args.len() == 2 => spin(parse(&args[1]) as u64),
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

/// The kernel's own scheduler counters for the calling process, summed over its threads:
/// (voluntary switches, involuntary switches, run-queue wait ns) from
/// `/proc/self/task/*/status` and the second field of `/proc/self/task/*/schedstat`.
fn own_counters() -> (u64, u64, u64) {
    let (mut v, mut iv, mut rd) = (0, 0, 0);
    for t in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = t.expect("task entry").path();
        let status = std::fs::read_to_string(dir.join("status")).expect("status");
        for line in status.lines() {
            let num = |l: &str| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
            if line.starts_with("voluntary_ctxt_switches:") {
                v += num(line);
            } else if line.starts_with("nonvoluntary_ctxt_switches:") {
                iv += num(line);
            }
        }
        let ss = std::fs::read_to_string(dir.join("schedstat")).expect("schedstat");
        rd += ss
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    (v, iv, rd)
}

fn pipe() -> [i32; 2] {
    let mut fds = [0i32; 2];
    // SAFETY: plain syscall writing two fds into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    fds
}

/// Forks one child per body; each child measures its own counters around its body and reports
/// them to the parent, which prints `{"procs":[{pid, voluntary, involuntary, run_delay_ns}]}`.
fn with_children(bodies: Vec<Box<dyn FnOnce()>>) {
    let report = pipe();
    let mut pids = Vec::new();
    for body in bodies {
        // SAFETY: the workload is single-threaded, so the child may run arbitrary code.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let (v0, i0, r0) = own_counters();
            body();
            let (v1, i1, r1) = own_counters();
            let line = format!(
                "{}\n",
                serde_json::json!({
                    "pid": std::process::id(), "voluntary": v1 - v0,
                    "involuntary": i1 - i0, "run_delay_ns": r1 - r0,
                })
            );
            // SAFETY: writes a short line (atomic below PIPE_BUF) and leaves without running
            // the parent's atexit handlers or destructors.
            unsafe {
                libc::write(report[1], line.as_ptr().cast(), line.len());
                libc::_exit(0);
            }
        }
        pids.push(pid);
    }
    // SAFETY: closes our copy of the write end so reading ends when the children exit.
    unsafe { libc::close(report[1]) };
    for pid in &pids {
        let mut st = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(*pid, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "child {pid} failed"
        );
    }
    let mut out = String::new();
    {
        use std::io::Read;
        use std::os::fd::FromRawFd;
        // SAFETY: we own the read end and hand it to File, which closes it.
        let mut f = unsafe { std::fs::File::from_raw_fd(report[0]) };
        f.read_to_string(&mut out)
            .expect("reading the children's reports");
    }
    let procs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("child report"))
        .collect();
    assert_eq!(procs.len(), pids.len(), "every child reports");
    println!("{}", serde_json::json!({ "procs": procs }));
}

/// Two processes bouncing one byte over two pipes ROUNDS times: every hop is a voluntary
/// switch (the reader sleeps in read) and a wakeup.
fn pingpong(rounds: usize) {
    let (a, b) = (pipe(), pipe());
    let hop = move |rd: i32, wr: i32, first: bool| {
        let mut byte = [0u8; 1];
        for i in 0..rounds {
            // SAFETY: plain reads and writes of one byte on our pipes.
            unsafe {
                if !(first && i == 0) {
                    assert_eq!(libc::read(rd, byte.as_mut_ptr().cast(), 1), 1, "read");
                }
                assert_eq!(libc::write(wr, byte.as_ptr().cast(), 1), 1, "write");
            }
        }
        if !first {
            return;
        }
        // SAFETY: the final reply.
        unsafe { assert_eq!(libc::read(rd, byte.as_mut_ptr().cast(), 1), 1, "read") };
    };
    with_children(vec![
        Box::new(move || hop(b[0], a[1], true)),
        Box::new(move || hop(a[0], b[1], false)),
    ]);
}

/// Two CPU-bound processes pinned to the same CPU (the last one), each spinning for MS
/// milliseconds of wall time: every switch between them is a preemption.
fn spin(ms: u64) {
    // SAFETY: sysconf is a plain query.
    let ncpu = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let cpu = ncpu - 1;
    let body = move || {
        // SAFETY: cpu_set_t is plain data; we set one bit and pin ourselves.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0,
                "sched_setaffinity"
            );
        }
        let end = Instant::now() + std::time::Duration::from_millis(ms);
        let mut x = 0u64;
        while Instant::now() < end {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    };
    with_children(vec![Box::new(body), Box::new(body)]);
}
