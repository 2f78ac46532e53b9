//! Statistics and the parsers of what the workloads, /proc and strace print.

/// Median of `v` (mean of the middle two for even lengths).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// `      4.012345 usecs/op` from `perf bench sched pipe`.
pub fn parse_perf_pipe(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("usecs/op"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `bogo ops/s (real time)` of the `switch` stressor from `stress-ng --metrics-brief`.
pub fn parse_stress_ng(out: &str) -> Option<f64> {
    // stress-ng: metrc: [6646] switch  164874  1.00  0.13  1.09  164734.12  134279.27
    out.lines()
        .filter(|l| l.contains("metrc:") || l.contains("info:"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|x| *x == "switch")?;
            let nums: Vec<f64> = f[i + 1..].iter().filter_map(|x| x.parse().ok()).collect();
            (nums.len() >= 5).then(|| nums[4])
        })
        .next()
}

/// utime + stime (clock ticks) from a /proc/<pid>/stat line; the comm may contain spaces and
/// parentheses, so fields are counted after the last ')'.
pub fn parse_proc_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(3) … utime is field 14, stime 15 overall → index 11, 12 here.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// `se.sum_exec_runtime : 12.345678` (ms) from /proc/<pid>/sched.
pub fn parse_sum_exec_runtime_ms(sched: &str) -> Option<f64> {
    sched
        .lines()
        .find(|l| l.trim_start().starts_with("se.sum_exec_runtime"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

/// The `-ttt` timestamp of an strace line (with -f, lines start with the pid).
fn strace_ts(l: &str) -> Option<f64> {
    let mut it = l.split_whitespace();
    let first = it.next()?;
    let t = if first.contains('.') {
        first
    } else {
        it.next()?
    };
    t.parse().ok()
}

/// Milliseconds from the first execve to the last attach syscall in `strace -ttt` output.
pub fn parse_strace_attach_ms(trace: &str) -> Option<f64> {
    let start = trace.lines().find(|l| l.contains("execve("))?;
    let attach = |l: &&str| {
        l.contains("BPF_LINK_CREATE")
            || l.contains("BPF_RAW_TRACEPOINT_OPEN")
            || l.contains("PERF_EVENT_IOC_SET_BPF")
            || l.contains("PERF_EVENT_IOC_ENABLE")
    };
    let last = trace
        .lines()
        .filter(attach)
        .rfind(|l| !l.contains("= -1"))?;
    Some((strace_ts(last)? - strace_ts(start)?) * 1000.0)
}

/// Milliseconds from the last write to stdout (the report) to the end of the process in
/// `strace -f -ttt` output: what detaching and exiting cost after the user has the answer. The
/// process is the one strace started (the pid of the first line); a child it leaves behind
/// (tracekit closes classic tracepoints in a background child, each waiting ~70 ms for RCU)
/// does not hold up the shell and is not counted.
pub fn parse_strace_exit_ms(trace: &str) -> Option<f64> {
    let lines: Vec<&str> = trace.lines().collect();
    let pid = lines.first()?.split_whitespace().next()?;
    let end = lines
        .iter()
        .position(|l| l.contains("+++ exited with") && l.split_whitespace().next() == Some(pid))?;
    let last_write = lines[..end]
        .iter()
        .rposition(|l| l.contains(" write(1, "))?;
    Some((strace_ts(lines[end])? - strace_ts(lines[last_write])?) * 1000.0)
}

/// `prog_id:` of a /proc/<pid>/fdinfo file (a BPF program's or link's fd).
pub fn parse_fdinfo_prog_id(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Context switches since boot: the `ctxt` line of /proc/stat.
pub fn parse_proc_stat_ctxt(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("ctxt "))
        .and_then(|v| v.trim().parse().ok())
}

/// `Udp:` NoPorts + RcvbufErrors from /proc/net/snmp: the datagrams the kernel dropped for a
/// closed port or a full receive buffer.
pub fn parse_snmp_udp_drops(snmp: &str) -> Option<f64> {
    Some(snmp_field(snmp, "Udp: ", "NoPorts")? + snmp_field(snmp, "Udp: ", "RcvbufErrors")?)
}

/// `Tcp:` InSegs from /proc/net/snmp: the TCP segments the host received (on loopback every
/// one its own).
pub fn parse_snmp_tcp_insegs(snmp: &str) -> Option<f64> {
    snmp_field(snmp, "Tcp: ", "InSegs")
}

/// One counter of a /proc/net/snmp group (`prefix` is `"Udp: "`, `"Tcp: "`, …): the group's
/// first line names the counters, its second holds their values.
fn snmp_field(snmp: &str, prefix: &str, key: &str) -> Option<f64> {
    let mut lines = snmp.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (lines.next()?, lines.next()?);
    let i = names.split_whitespace().position(|n| n == key)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Requests completed (reads, writes, discards, flushes) from /sys/block/<dev>/stat.
pub fn parse_block_stat_ios(stat: &str) -> Option<f64> {
    let f: Vec<f64> = stat
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // reads completed @0, writes @4, discards @11, flushes @15 (the last two since 4.18/5.5).
    Some([0, 4, 11, 15].iter().filter_map(|&i| f.get(i)).sum())
}

/// Mean latency of the reads of fio's first job (`--output-format=json`), in ns.
pub fn parse_fio_read_lat_ns(json: &str) -> Option<f64> {
    // fio may print notes before the JSON document.
    let v: serde_json::Value = serde_json::from_str(&json[json.find('{')?..]).ok()?;
    v["jobs"][0]["read"]["lat_ns"]["mean"].as_f64()
}

/// The samples `perf record` wrote, from its closing line on stderr:
/// `[ perf record: Captured and wrote 0.452 MB perf.data (2031 samples) ]`.
pub fn parse_perf_record_samples(line: &str) -> Option<u64> {
    let rest = line.split("perf record: Captured and wrote").nth(1)?;
    let open = rest.rfind('(')?;
    rest[open + 1..].split_whitespace().next()?.parse().ok()
}

/// py-spy record's closing line: `py-spy> Wrote raw flamegraph data to 'x'. Samples: 295
/// Errors: 0`.
pub fn parse_py_spy_samples(line: &str) -> Option<u64> {
    let rest = line.split("Samples: ").nth(1)?;
    line.contains("py-spy>")
        .then(|| rest.split_whitespace().next()?.parse().ok())
        .flatten()
}

/// utime + stime of a rusage, in ms (the workload's and the tracer's CPU time).
pub(super) fn rusage_ms(ru: &libc::rusage) -> f64 {
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_py_spy_closing_line() {
        assert_eq!(
            parse_py_spy_samples(
                "py-spy> Wrote raw flamegraph data to 'py-spy.txt'. Samples: 295 Errors: 0"
            ),
            Some(295)
        );
        assert_eq!(parse_py_spy_samples("Samples: 3"), None);
    }

    #[test]
    fn medians_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 3.0));
    }

    #[test]
    fn parses_perf_bench_pipe() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 20000 pipe operations between two processes\n\n     Total time: 0.142 [sec]\n\n       7.140300 usecs/op\n         140049 ops/sec\n";
        assert_eq!(parse_perf_pipe(out), Some(7.1403));
        assert_eq!(parse_perf_pipe("garbage"), None);
    }

    #[test]
    fn parses_stress_ng_switch() {
        let out = "stress-ng: metrc: [6646] stressor       bogo ops real time  usr time  sys time   bogo ops/s     bogo ops/s\nstress-ng: metrc: [6646]                           (secs)    (secs)    (secs)   (real time) (usr+sys time)\nstress-ng: metrc: [6646] switch           164874      1.00      0.13      1.09    164734.12      134279.27\nstress-ng: metrc: [6646] switch             12143.20 nanosecs per context switch (pipe method)\n";
        assert_eq!(parse_stress_ng(out), Some(164734.12));
    }

    #[test]
    fn parses_proc_stat_with_hostile_comm() {
        let stat =
            "1234 (a) b (c)) S 1 1234 1234 0 -1 4194304 100 0 0 0 250 17 0 0 20 0 1 0 100 1000 10";
        assert_eq!(parse_proc_stat_cpu_ticks(stat), Some(267));
        assert_eq!(parse_proc_stat_cpu_ticks("no paren"), None);
    }

    #[test]
    fn parses_sched_runtime() {
        let s = "tracekit (123, #threads: 1)\n---------\nse.exec_start  :  5.0\nse.sum_exec_runtime                          :             1.014640\n";
        assert_eq!(parse_sum_exec_runtime_ms(s), Some(1.01464));
        assert_eq!(parse_sum_exec_runtime_ms("nothing"), None);
    }

    #[test]
    fn parses_strace_exit_time() {
        let t = "100 1000.000000 execve(\"/x\", [...]) = 0\n100 1001.000000 write(1, \"report\\n\", 7) = 7\n100 1001.002500 exit_group(0) = ?\n100 1001.003000 +++ exited with 0 +++\n";
        let ms = parse_strace_exit_ms(t).unwrap();
        assert!((ms - 3.0).abs() < 1e-6, "{ms}");
        // A background child ending later is not the process's end.
        let t = "100 1000.000000 execve(\"/x\", [...]) = 0\n100 1001.000000 write(1, \"report\\n\", 7) = 7\n100 1001.000100 clone(...) = 101\n100 1001.004000 +++ exited with 0 +++\n101 1001.800000 +++ exited with 0 +++\n";
        let ms = parse_strace_exit_ms(t).unwrap();
        assert!((ms - 4.0).abs() < 1e-6, "{ms}");
        assert_eq!(
            parse_strace_exit_ms("100 1.0 write(1, \"x\", 1) = 1\n"),
            None
        );
    }

    #[test]
    fn parses_strace_attach_time() {
        let t = "100 1000.000000 execve(\"/x\", [\"x\"], 0x7ff) = 0\n100 1000.010000 bpf(BPF_PROG_LOAD, {...}, 148) = 5\n100 1000.015000 bpf(BPF_LINK_CREATE, {...}, 64) = 6\n100 1000.017500 ioctl(6, PERF_EVENT_IOC_ENABLE, 0) = 0\n100 1000.020000 ioctl(7, PERF_EVENT_IOC_ENABLE, 0) = -1 EINVAL\n";
        let ms = parse_strace_attach_ms(t).unwrap();
        assert!((ms - 17.5).abs() < 1e-6, "{ms}");
        assert_eq!(parse_strace_attach_ms("nothing"), None);
    }

    #[test]
    fn parses_kernel_event_counters() {
        assert_eq!(parse_fdinfo_prog_id("pos:\t0\nflags:\t02000002\nlink_type:\tperf\nlink_id:\t7\nprog_tag:\tab\nprog_id:\t34725\n"), Some(34725));
        assert_eq!(parse_fdinfo_prog_id("pos:\t0\nflags:\t02\n"), None);
        assert_eq!(
            parse_proc_stat_ctxt("cpu  1 2 3\nintr 5 0\nctxt 123456789\nbtime 1\n"),
            Some(123456789.0)
        );
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 10 300 40 7 40 0 0 0 0\nUdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n";
        assert_eq!(parse_snmp_udp_drops(snmp), Some(340.0));
        assert_eq!(parse_snmp_udp_drops("Ip: a\nIp: 1\n"), None);
        let tcp = "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs\nTcp: 1 200 120000 -1 5 4 0 0 2 98765 43210\n";
        assert_eq!(parse_snmp_tcp_insegs(tcp), Some(98765.0));
        assert_eq!(parse_snmp_tcp_insegs(snmp), None);
        let stat = "  100 0 800 50 20 0 160 30 0 60 80 5 0 40 0 3 1\n";
        assert_eq!(parse_block_stat_ios(stat), Some(128.0));
        assert_eq!(
            parse_block_stat_ios("100 0 800 50 20 0 160 30 0 60 80\n"),
            Some(120.0)
        );
        assert_eq!(parse_block_stat_ios("x"), None);
    }

    #[test]
    fn parses_perf_record_closing_line() {
        let l = "[ perf record: Captured and wrote 0.452 MB perf.data (2031 samples) ]";
        assert_eq!(parse_perf_record_samples(l), Some(2031));
        // With --call-graph dwarf the size is larger; the count is still the last parenthesis.
        let l = "[ perf record: Captured and wrote 31.907 MB perf.data (3920 samples) ]";
        assert_eq!(parse_perf_record_samples(l), Some(3920));
        assert_eq!(
            parse_perf_record_samples("[ perf record: Woken up 1 times to write data ]"),
            None
        );
        assert_eq!(parse_perf_record_samples("(12 samples)"), None);
    }

    #[test]
    fn parses_fio_json() {
        let out = "note: both iodepth >= 1 and synchronous I/O engine are selected\n{\"fio version\": \"fio-3.33\", \"jobs\": [{\"jobname\": \"tk\", \"read\": {\"total_ios\": 2000, \"lat_ns\": {\"min\": 1, \"max\": 9, \"mean\": 123456.5}}}]}\n";
        assert_eq!(parse_fio_read_lat_ns(out), Some(123456.5));
        assert_eq!(parse_fio_read_lat_ns("fio: error"), None);
    }
}
