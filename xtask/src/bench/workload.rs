//! The workloads the benchmark times, each run once per call with its metric (lower is better).

use std::{net::UdpSocket, os::fd::AsRawFd, path::Path, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

mod ramdisk;

use ramdisk::RamDisk;

use super::parse::{
    parse_block_stat_ios, parse_fio_read_lat_ns, parse_perf_pipe, parse_proc_stat_ctxt,
    parse_snmp_tcp_insegs, parse_snmp_udp_drops, parse_stress_ng,
};

#[derive(Clone, Debug)]
pub(super) enum Workload {
    /// `perf bench sched pipe -l N`, optionally pinned to CPU 1. Metric: µs per op.
    Pipe { loops: u32, pinned: bool },
    /// `stress-ng --switch 2 -t S`. Metric: ns per bogo op (1e9 / ops per second).
    SwitchStorm { secs: u32 },
    /// `tk-workload fsync PATH N 0`. Metric: mean ns per fsync.
    Fsync { n: u32 },
    /// `tk-workload compact`, N times (each compacts every zone). Metric: ns per compaction run.
    Compaction { n: u32 },
    /// `taskset -c 1 perf bench syscall basic -l N` (getppid): what every syscall pays while a
    /// syscall tracer runs. Metric: ns per syscall.
    Syscalls { loops: u32 },
    /// UDP datagrams on loopback the kernel drops (`skb:kfree_skb`): `n / 2` of 32 bytes to a
    /// closed port (NO_SOCKET), `n / 2` to a receiver with a 1 KiB buffer that never reads
    /// (SOCKET_RCVBUFF), sent by `tk-workload net-rx-send`. Metric: ns per datagram.
    UdpDrops { n: u32 },
    /// `tk-workload tcp-stream MIB`: one TCP connection on loopback, `mib` MiB in 128 KiB
    /// writes. Metric: ns per MiB received (its inverse is the throughput).
    TcpStream { mib: u32 },
    /// `fio` 4 KiB random reads, O_DIRECT, one at a time, `n` of them, on a loop device over
    /// 64 MiB in RAM ([`RamDisk`]) under I/O scheduler `sched` (`none`: issue → complete, as on
    /// NVMe; `mq-deadline`: insert → issue → complete). The same seeded sequence every run.
    /// Metric: mean ns per read.
    BlockRead { n: u32, sched: &'static str },
    /// `taskset -c 1 stress-ng --cpu 1 --cpu-method int64 --cpu-ops N`: a fixed amount of pure
    /// integer work (no syscalls, no memory traffic in the loop), the profilers' workload.
    /// Metric: the CPU time the work took (utime + stime of the run, reaped children included),
    /// not its wall time: the machine is shared with builders, so wall time mostly measures the
    /// run queue, while the CPU time of fixed work grows only by what lands on the workload's
    /// CPU (this kernel has no IRQ time accounting, so the sampling interrupt and the BPF
    /// program run in it are charged to the task they interrupt).
    Cpu { ops: u32 },
    /// `taskset -c 1 python3 -c PY_JSON_BENCH LOOPS` (the Python on PATH): a request handler's
    /// call path, `handler → save → json.dumps` of a 2,000-key dict, `loops` times; the Python
    /// profilers' workload (issue 29). Metric: the CPU time of the fixed work, as [`Cpu`].
    Python { loops: u32 },
}

/// The Python workload: the same call path as `tests/profile/python.rs`.
const PY_JSON_BENCH: &str = "import json, sys
def save(doc):
    return json.dumps(doc)
def handler(doc):
    return save(doc)
doc = {'key%d' % i: i for i in range(2000)}
for _ in range(int(sys.argv[1])):
    handler(doc)
";

/// py-spy in the scripts directory of the Python on PATH, installed there with pip when
/// missing (the bench's one peer that Debian does not package).
pub(super) fn py_spy() -> Option<std::path::PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()?;
    let bin = std::path::Path::new(String::from_utf8_lossy(&out.stdout).trim()).join("py-spy");
    if !bin.is_file() {
        eprintln!("xtask: installing py-spy with pip: the Python profiler the bench compares with");
        let _ = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "py-spy"])
            .status();
    }
    bin.is_file().then_some(bin)
}

/// The interpreter the Python on PATH runs (pyenv's `python3` is a shell shim; profilers
/// scope by the comm of the real one).
/// Asked once: a `python3` started during a run would be one more process of the profilers'
/// comm (py-spy attached to it once instead of the workload).
pub(super) fn python_exe() -> Option<std::path::PathBuf> {
    static EXE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()?;
        let p = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        p.is_file().then_some(p)
    })
    .clone()
}

/// The comm of stress-ng's CPU stressor (the profilers' `--comm`).
pub(super) const CPU_COMM: &str = "stress-ng-cpu";

impl Workload {
    pub(super) fn name(&self) -> String {
        match self {
            Workload::Pipe {
                loops,
                pinned: true,
            } => format!("taskset -c 1 perf bench sched pipe -l {loops}"),
            Workload::Pipe {
                loops,
                pinned: false,
            } => format!("perf bench sched pipe -l {loops} (unpinned)"),
            Workload::SwitchStorm { secs } => format!("stress-ng --switch 2 -t {secs}"),
            Workload::Fsync { n } => {
                format!("fsync loop: {n} × (write 4 KiB + fsync) on the work tree")
            }
            Workload::Compaction { n } => {
                format!("compaction loop: {n} × echo 1 > /proc/sys/vm/compact_memory")
            }
            Workload::Syscalls { loops } => {
                format!("taskset -c 1 perf bench syscall basic -l {loops} (getppid, not traced)")
            }
            Workload::UdpDrops { n } => format!(
                "UDP drops on loopback: {n} datagrams, half to a closed port, half to a full 1 KiB receive buffer"
            ),
            Workload::TcpStream { mib } => format!(
                "TCP stream on loopback: {mib} MiB over one connection, 128 KiB writes"
            ),
            Workload::BlockRead { n, sched } => format!(
                "fio randread 4 KiB O_DIRECT iodepth 1: {n} reads of a loop device over 64 MiB in RAM (tmpfs, direct I/O), scheduler {sched}"
            ),
            Workload::Cpu { ops } => format!(
                "CPU-bound (profilers): taskset -c 1 stress-ng --cpu 1 --cpu-method int64 --cpu-ops {ops}, CPU time of the fixed work"
            ),
            Workload::Python { loops } => format!(
                "Python (profilers): taskset -c 1 python3, handler → save → json.dumps of a 2,000-key dict × {loops}, CPU time of the fixed work"
            ),
        }
    }

    pub(super) fn unit(&self) -> &'static str {
        match self {
            Workload::Pipe { .. } => "us/op",
            Workload::SwitchStorm { .. } => "ns/switch-op",
            Workload::Fsync { .. } => "ns/fsync",
            Workload::Compaction { .. } => "ns/compaction",
            Workload::Syscalls { .. } => "ns/syscall",
            Workload::UdpDrops { .. } => "ns/datagram",
            Workload::TcpStream { .. } => "ns/MiB",
            Workload::BlockRead { .. } => "ns/read",
            Workload::Cpu { .. } | Workload::Python { .. } => "ms CPU",
        }
    }

    /// The wall time of one run from its metric, where the metric is per unit of a fixed count
    /// (not for the switch storm, which runs for a time and counts what it got done).
    pub(super) fn run_ns(&self, metric: f64) -> Option<f64> {
        let units = match self {
            Workload::Pipe { loops, .. } => return Some(metric * 1000.0 * f64::from(*loops)),
            Workload::SwitchStorm { .. } => return None,
            Workload::Fsync { n }
            | Workload::Compaction { n }
            | Workload::UdpDrops { n }
            | Workload::BlockRead { n, .. } => *n,
            Workload::Syscalls { loops } => *loops,
            Workload::TcpStream { mib } => *mib,
            // CPU time, not wall time: the untraced CPU time stands for the run.
            Workload::Cpu { .. } | Workload::Python { .. } => return Some(metric * 1e6),
        };
        Some(metric * f64::from(units))
    }

    /// Runs once; returns the metric (lower is better).
    pub(super) fn run(&self, workload_bin: &Path, scratch: &Path) -> Result<f64> {
        match self {
            Workload::Pipe { loops, pinned } => {
                let mut c = if *pinned {
                    let mut c = Command::new("taskset");
                    c.args(["-c", "1", "perf"]);
                    c
                } else {
                    Command::new("perf")
                };
                c.args(["bench", "sched", "pipe", "-l", &loops.to_string()]);
                let out = c.output().context("perf bench sched pipe")?;
                parse_perf_pipe(&String::from_utf8_lossy(&out.stdout))
                    .context("parsing perf bench output")
            }
            Workload::SwitchStorm { secs } => {
                let out = Command::new("stress-ng")
                    .args(["--switch", "2", "-t", &secs.to_string(), "--metrics-brief"])
                    .output()
                    .context("stress-ng")?;
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let ops = parse_stress_ng(&text).context("parsing stress-ng output")?;
                Ok(1e9 / ops)
            }
            Workload::Fsync { n } => {
                let out = Command::new(workload_bin)
                    .args([
                        "fsync",
                        scratch.join("bench-fsync").to_str().unwrap(),
                        &n.to_string(),
                        "0",
                    ])
                    .output()?;
                let v: Value = serde_json::from_slice(&out.stdout).context("tk-workload output")?;
                let ns: Vec<f64> = v["fsync_ns"]
                    .as_array()
                    .context("fsync_ns")?
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect();
                Ok(ns.iter().sum::<f64>() / ns.len().max(1) as f64)
            }
            Workload::Syscalls { loops } => {
                let out = Command::new("taskset")
                    .args(["-c", "1", "perf", "bench", "syscall", "basic", "-l"])
                    .arg(loops.to_string())
                    .output()
                    .context("perf bench syscall basic")?;
                let us = parse_perf_pipe(&String::from_utf8_lossy(&out.stdout))
                    .context("parsing perf bench syscall output")?;
                Ok(us * 1000.0)
            }
            Workload::UdpDrops { n } => udp_drops(*n, workload_bin),
            Workload::TcpStream { mib } => {
                let out = Command::new(workload_bin)
                    .args(["tcp-stream", &mib.to_string()])
                    .output()
                    .context("tk-workload tcp-stream")?;
                let v: Value =
                    serde_json::from_slice(&out.stdout).context("tk-workload tcp-stream output")?;
                let bytes = v["bytes"].as_f64().context("bytes")?;
                if bytes == 0.0 {
                    bail!("no byte received");
                }
                Ok(v["wall_ns"].as_f64().context("wall_ns")? / (bytes / f64::from(1 << 20)))
            }
            Workload::BlockRead { n, sched } => {
                let disk = RamDisk::get()?;
                disk.set_scheduler(sched)?;
                let out = Command::new("fio")
                    .args([
                        "--name=tk-bench",
                        "--rw=randread",
                        "--bs=4k",
                        "--direct=1",
                        "--ioengine=psync",
                        "--iodepth=1",
                        "--randrepeat=1",
                        "--output-format=json",
                    ])
                    .arg(format!("--size={}", ramdisk::SIZE))
                    // More reads than the disk has blocks: fio goes over it again.
                    .arg(format!("--io_size={}", u64::from(*n) * 4096))
                    .arg(format!("--filename={}", disk.path()))
                    .output()
                    .context("fio");
                // The device keeps its scheduler after detach: leave the default.
                let _ = disk.set_scheduler("none");
                let out = out?;
                parse_fio_read_lat_ns(&String::from_utf8_lossy(&out.stdout))
                    .context("parsing fio output")
            }
            Workload::Cpu { ops } => {
                let before = children_cpu_ms();
                let out = Command::new("taskset")
                    .args([
                        "-c",
                        "1",
                        "stress-ng",
                        "--cpu",
                        "1",
                        "--cpu-method",
                        "int64",
                    ])
                    .arg("--cpu-ops")
                    .arg(ops.to_string())
                    .output()
                    .context("stress-ng --cpu")?;
                if !out.status.success() {
                    bail!("stress-ng --cpu: {}", String::from_utf8_lossy(&out.stderr));
                }
                Ok(children_cpu_ms() - before)
            }
            Workload::Python { loops } => {
                let py = python_exe().context("python3 on PATH")?;
                let before = children_cpu_ms();
                let out = Command::new("taskset")
                    .args(["-c", "1"])
                    .arg(&py)
                    .args(["-c", PY_JSON_BENCH, &loops.to_string()])
                    .output()
                    .context("python3")?;
                if !out.status.success() {
                    bail!("python3: {}", String::from_utf8_lossy(&out.stderr));
                }
                Ok(children_cpu_ms() - before)
            }
            Workload::Compaction { n } => {
                let mut total = 0.0;
                for _ in 0..*n {
                    let out = Command::new(workload_bin).arg("compact").output()?;
                    let v: Value = serde_json::from_slice(&out.stdout)
                        .context("tk-workload compact output")?;
                    total += v["wall_ns"].as_f64().context("wall_ns")?;
                }
                Ok(total / f64::from((*n).max(1)))
            }
        }
    }
}

impl Workload {
    /// What the kernel itself has counted so far of the events this workload makes (the
    /// denominator of kernel time per event): context switches (/proc/stat `ctxt`), UDP drops
    /// (/proc/net/snmp NoPorts + RcvbufErrors), TCP segments received (/proc/net/snmp
    /// InSegs: data and acks, up to 64 KiB each on loopback), requests completed by all disks.
    /// Everything else on the machine counts too, in the tracers' run time as here. `None`
    /// where the kernel keeps no such count (fsync calls: the workload's own count is used).
    pub(super) fn events(&self) -> Option<f64> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        match self {
            Workload::Pipe { .. } | Workload::SwitchStorm { .. } => {
                parse_proc_stat_ctxt(&read("/proc/stat")?)
            }
            Workload::UdpDrops { .. } => parse_snmp_udp_drops(&read("/proc/net/snmp")?),
            Workload::TcpStream { .. } => parse_snmp_tcp_insegs(&read("/proc/net/snmp")?),
            // Every whole disk's requests (/sys/block lists no partitions): the tracers' programs
            // run on all of them, the RAM disk's are nearly all.
            Workload::BlockRead { .. } => std::fs::read_dir("/sys/block")
                .ok()?
                .filter_map(|e| read(e.ok()?.path().join("stat").to_str()?))
                .map(|s| parse_block_stat_ios(&s))
                .sum(),
            Workload::Fsync { .. }
            | Workload::Compaction { .. }
            | Workload::Syscalls { .. }
            | Workload::Cpu { .. }
            | Workload::Python { .. } => None,
        }
    }

    /// What one event is, for the kernel-time table.
    pub(super) fn event_name(&self) -> &'static str {
        match self {
            Workload::Pipe { .. } | Workload::SwitchStorm { .. } => "context switch",
            Workload::UdpDrops { .. } => "dropped datagram",
            Workload::TcpStream { .. } => "TCP segment received",
            Workload::BlockRead { .. } => "block request",
            Workload::Fsync { .. } => "fsync call",
            Workload::Compaction { .. } => "compaction run",
            Workload::Syscalls { .. } => "syscall",
            Workload::Cpu { .. } | Workload::Python { .. } => "sample",
        }
    }
}

/// utime + stime of the children this process has reaped, in ms (getrusage(RUSAGE_CHILDREN):
/// the workload is the only child reaped while it runs; tracers are reaped after).
fn children_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid who and a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    super::parse::rusage_ms(&ru)
}

/// Half the datagrams to a closed port, half to a full receiver; ns per datagram sent.
fn udp_drops(n: u32, workload_bin: &Path) -> Result<f64> {
    // Bound, then released: nobody listens there.
    let closed = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
    let full = UdpSocket::bind("127.0.0.1:0")?;
    let small: libc::c_int = 1024;
    // SAFETY: setsockopt on a socket we own, with a c_int option value that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            full.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const small).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("SO_RCVBUF: {}", std::io::Error::last_os_error());
    }
    let t0 = Instant::now();
    let mut sent = 0.0;
    for port in [closed, full.local_addr()?.port()] {
        let out = Command::new(workload_bin)
            .args(["net-rx-send", &port.to_string(), &(n / 2).to_string(), "32"])
            .output()
            .context("tk-workload net-rx-send")?;
        let v: Value =
            serde_json::from_slice(&out.stdout).context("tk-workload net-rx-send output")?;
        sent += v["sent"].as_f64().context("sent")?;
    }
    if sent == 0.0 {
        bail!("no datagram sent");
    }
    Ok(t0.elapsed().as_nanos() as f64 / sent)
}
