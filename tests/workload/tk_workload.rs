//! `tk-workload`: the workloads tracekit's root tests (and the VM tests) start. Each measures
//! itself and prints one JSON object on stdout, so a test can compare tracekit with ground truth
//! that does not come from tracekit. No Python: this runs inside the minimal VM too.
//!
//! With `TK_WAIT_STDIN=1` a workload prints `{"ready":PID}` and waits for a line on stdin
//! before it starts, so a test can point `tracekit --pid` at it first.

use std::{
    fs::OpenOptions,
    io::{BufRead, Write},
    time::Instant,
};

mod vm_check;

include!(concat!(env!("OUT_DIR"), "/tools.rs"));

use tracekit_tests::{anon_map, open_trunc, timed_sync};

fn usage() -> ! {
    eprintln!(
        "usage: tk-workload fsync PATH N_FSYNC N_FDATASYNC\n       tk-workload fsync-procs PATH N      (N processes, one fsync each)\n       (and each tool's own workloads, in tests/<tool>.rs)\n       tk-workload named HEXNAME PATH N    (set comm to the bytes HEXNAME, then N fsyncs)\n       tk-workload compact\n       tk-workload collapse N_2MIB\n       tk-workload collapse-einval         (one MADV_COLLAPSE the kernel refuses with EINVAL)\n       tk-workload memcg-write CGROUP_PROCS FILE MIB\n       tk-workload pingpong ROUNDS\n       tk-workload pingpong-split ROUNDS   (the two sides pinned to CPUs 0 and 1: every hop wakes an idle CPU)\n       tk-workload spin MILLISECONDS\n       tk-workload tcp-stream MIB          (MIB MiB over one loopback TCP connection, at most 20 s)\n       tk-workload spin-named HEXNAME MS   (spin, the children named by the bytes HEXNAME)\n       tk-workload vm-check"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::env::var_os("TK_WAIT_STDIN").is_some() {
        println!("{}", serde_json::json!({"ready": std::process::id()}));
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
    }
    for dispatch in WORKLOADS {
        if let Some(code) = dispatch(&args) {
            std::process::exit(code);
        }
    }
    match args.first().map(String::as_str) {
        Some("named") if args.len() == 4 => named(&args[1], &args[2], parse(&args[3])),
        Some("compact") if args.len() == 1 => compact(),
        Some("collapse") if args.len() == 2 => collapse(parse(&args[1])),
        Some("collapse-einval") if args.len() == 1 => collapse_einval(),
        Some("memcg-write") if args.len() == 4 => memcg_write(&args[1], &args[2], parse(&args[3])),
        Some("pingpong") if args.len() == 2 => pingpong(parse(&args[1]), false),
        Some("pingpong-split") if args.len() == 2 => pingpong(parse(&args[1]), true),
        Some("tcp-stream") if args.len() == 2 => tcp_stream(parse(&args[1])),
        Some("spin") if args.len() == 2 => spin(parse(&args[1]) as u64, None),
        Some("spin-named") if args.len() == 3 => {
            spin(parse(&args[2]) as u64, Some(hex_bytes(&args[1])))
        }
        Some("vm-check") => std::process::exit(vm_check::main()),
        _ => usage(),
    }
}

fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos() as u64
}

fn parse(s: &str) -> usize {
    s.parse().unwrap_or_else(|_| usage())
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or_else(|_| usage()))
        .collect()
}

/// Names the calling thread with the raw bytes (at most 15) with prctl(PR_SET_NAME).
fn set_name(bytes: &[u8]) {
    let mut name = [0u8; 16];
    let len = bytes.len().min(15);
    name[..len].copy_from_slice(&bytes[..len]);
    // SAFETY: PR_SET_NAME reads at most 16 bytes from a NUL-terminated buffer we own.
    let rc = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
    assert_eq!(rc, 0, "prctl(PR_SET_NAME)");
}

/// Renames itself to the raw bytes of HEXNAME (escape sequences, newlines, invalid UTF-8 are the
/// point) with prctl(PR_SET_NAME), then does N fsyncs.
fn named(hex: &str, path: &str, n: usize) {
    set_name(&hex_bytes(hex));
    let mut f = open_trunc(path);
    let fs = timed_sync(&mut f, "fsync", n);
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "fsync_ns": fs})
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
    let base = anon_map(len);
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

/// One `madvise(MADV_COLLAPSE)` on a range that is not page-aligned: the kernel refuses it with
/// EINVAL before any collapse work, so it is no stall.
fn collapse_einval() {
    let t = Instant::now();
    // SAFETY: madvise only validates an unaligned address and fails; nothing is touched.
    let rc = unsafe {
        libc::madvise(
            std::ptr::dangling_mut::<libc::c_void>(),
            4096,
            MADV_COLLAPSE,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    assert_eq!(
        (rc, errno),
        (-1, libc::EINVAL),
        "MADV_COLLAPSE should fail with EINVAL"
    );
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "rc": rc, "errno": errno, "wall_ns": ns(t.elapsed())})
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

/// The kernel's own scheduler counters for the calling process, summed over its threads:
/// (voluntary switches, involuntary switches, run-queue wait ns) from
/// `/proc/self/task/*/status` and the second field of `/proc/self/task/*/schedstat`.
fn own_counters() -> (u64, u64, u64) {
    let (mut v, mut iv, mut rd) = (0, 0, 0);
    for t in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = t.expect("task entry").path();
        // Lossy: a task named with bytes that are not UTF-8 shows them in its Name: line.
        let status = String::from_utf8_lossy(&std::fs::read(dir.join("status")).expect("status"))
            .into_owned();
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
            let born = Instant::now();
            let (v0, i0, r0) = own_counters();
            body();
            let (v1, i1, r1) = own_counters();
            let life_ns = ns(born.elapsed());
            let line = format!(
                "{}\n",
                serde_json::json!({
                    "pid": std::process::id(), "voluntary": v1 - v0,
                    "involuntary": i1 - i0, "run_delay_ns": r1 - r0,
                    // Since fork (the kernel zeroes sched_info there): includes the first wait
                    // after fork, which tracekit sees and the delta above cannot.
                    "run_delay_life_ns": r1,
                    // Its own wall clock from its first instruction to this report.
                    "life_ns": life_ns,
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

/// Pins the calling process to `cpu` (modulo the CPUs online).
fn pin(cpu: usize) {
    // SAFETY: sysconf is a plain query; cpu_set_t is plain data, one bit set.
    unsafe {
        let ncpu = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % ncpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// Two processes bouncing one byte over two pipes ROUNDS times: every hop is a voluntary
/// switch (the reader sleeps in read) and a wakeup. `split`: each side on its own CPU, so a
/// side sleeps into the idle task and is woken out of it (switches away from idle).
fn pingpong(rounds: usize, split: bool) {
    let (a, b) = (pipe(), pipe());
    let hop = move |rd: i32, wr: i32, first: bool| {
        if split {
            pin(usize::from(!first));
        }
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
/// milliseconds of wall time: every switch between them is a preemption. With `name`, both
/// children first rename themselves to those bytes.
fn spin(ms: u64, name: Option<Vec<u8>>) {
    // SAFETY: sysconf is a plain query.
    let ncpu = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let cpu = ncpu - 1;
    let body = move || {
        if let Some(n) = &name {
            set_name(n);
        }
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
    with_children(vec![Box::new(body.clone()), Box::new(body)]);
}

/// A TCP stream over loopback: a receiver thread reads to EOF while this thread writes `mib` MiB
/// in 128 KiB writes (stopping early after 20 s, so a slow machine still ends). Prints the bytes
/// the receiver got and the wall time from the first write to the receiver's EOF.
fn tcp_stream(mib: usize) {
    use std::{
        io::Read,
        net::{TcpListener, TcpStream},
        time::Duration,
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local_addr");
    let receiver = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 128 << 10];
        let mut got = 0u64;
        loop {
            match c.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    });
    let mut tx = TcpStream::connect(addr).expect("connect");
    let chunk = vec![0x5au8; 128 << 10];
    let t = Instant::now();
    for _ in 0..mib * 8 {
        tx.write_all(&chunk).expect("write");
        if t.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    drop(tx);
    let bytes = receiver.join().expect("receiver thread");
    let wall = ns(t.elapsed());
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "bytes": bytes, "wall_ns": wall})
    );
}
