//! UDP on loopback for the receive-path tests: a receiver whose buffer overflows, a bounded
//! sender, and the `Udp:` counters of /proc/net/snmp (per network namespace: read inside a
//! container, they are the container's).

use std::{
    collections::BTreeMap,
    net::UdpSocket,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

/// `Udp:` counters of /proc/net/snmp.
pub fn udp_snmp() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("Udp:")).collect();
    if lines.len() < 2 {
        return BTreeMap::new();
    }
    let keys = lines[0].split_whitespace().skip(1);
    let vals = lines[1]
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<i64>().unwrap_or(0) as u64);
    keys.map(String::from).zip(vals).collect()
}

/// Increase of counter `k` from `a` to `b`.
pub fn delta(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>, k: &str) -> u64 {
    b.get(k).copied().unwrap_or(0) - a.get(k).copied().unwrap_or(0)
}

/// Sends `n` datagrams of `len` bytes to 127.0.0.1:`port`, giving up after 10 s. Errors
/// (ECONNREFUSED from an earlier ICMP) do not stop the loop: the datagram still left.
pub fn send(n: usize, len: usize, port: u16) -> usize {
    let Ok(s) = UdpSocket::bind("127.0.0.1:0") else {
        return 0;
    };
    let buf = vec![0x42u8; len];
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    while sent < n && Instant::now() < deadline {
        if s.send_to(&buf, ("127.0.0.1", port)).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// A UDP receiver on 127.0.0.1 with a 1 KiB receive buffer (the kernel doubles it and applies
/// its floor: 2304 bytes on 6.x) that never reads.
pub fn small_receiver() -> UdpSocket {
    let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let small: libc::c_int = 1024;
    // SAFETY: setsockopt on a socket we own with a c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            rx.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const small).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUF");
    rx
}

/// Datagrams waiting on `rx` (read and counted: what the kernel kept).
pub fn drain(rx: &UdpSocket) -> u64 {
    let _ = rx.set_nonblocking(true);
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while rx.recv(&mut buf).is_ok() {
        n += 1;
    }
    n
}

/// iperf3's one-off server (`-s -1`: it exits with its one test) on `port`, pinned to `cpu`
/// when given (taskset), returned once its control port (TCP) listens, as /proc/net/tcp{,6}
/// shows (a connection to check would be the one-off server's one client).
pub fn iperf3_one_off_server(port: u16, cpu: Option<&str>) -> std::process::Child {
    let mut cmd = match cpu {
        Some(c) => {
            let mut t = std::process::Command::new("taskset");
            t.args(["-c", c, "iperf3"]);
            t
        }
        None => std::process::Command::new("iperf3"),
    };
    let server = cmd
        .args(["-s", "-1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 (Debian package iperf3, installed by cargo xtask test)");
    let hex = format!(":{port:04X} ");
    let listening = || {
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    let c: Vec<&str> = l.split_whitespace().collect();
                    c.len() > 3 && format!("{} ", c[1]).ends_with(&hex) && c[3] == "0A"
                })
        })
    };
    let t = Instant::now();
    while !listening() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "iperf3 -s never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}
