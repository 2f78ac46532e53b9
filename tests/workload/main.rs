//! `tk-workload`: the workloads tracekit's root tests (and the VM tests) start. Each measures
//! itself and prints one JSON object on stdout, so a test can compare tracekit with ground truth
//! that does not come from tracekit. No Python: this runs inside the minimal VM too.

use std::{fs::OpenOptions, io::Write, os::fd::AsRawFd, time::Instant};

mod vm_check;

fn usage() -> ! {
    eprintln!("usage: tk-workload fsync PATH N_FSYNC N_FDATASYNC | vm-check");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fsync") if args.len() == 4 => fsync(&args[1], parse(&args[2]), parse(&args[3])),
        Some("vm-check") => std::process::exit(vm_check::main()),
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
