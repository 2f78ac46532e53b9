//! Root tests for `tracekit net-rx` with real packets, only to loopback (127.0.0.1) or inside a
//! network namespace the test creates, every flood bounded in count and time. Ground truth is
//! twofold: what this test itself sent to and queued on its own ports (exact whatever else runs
//! on the machine), and the kernel's own counters: `/proc/net/snmp` (system-wide, so equal only
//! when no other process drops UDP datagrams meanwhile) and an nftables rule's counter.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    process::Command,
    time::Duration,
};

use serde_json::{json, Value};
use tracekit_tests::{
    udp::{delta, drain, iperf3_one_off_server, send, small_receiver, udp_snmp},
    *,
};

/// After the root check: the lock every test here holds while it runs (they compare
/// system-wide counters, which a concurrent test's traffic would disturb).
fn root_serial() -> std::sync::MutexGuard<'static, ()> {
    require_root();
    serial()
}

/// A port on 127.0.0.1 nobody listens on (bound, then released).
fn closed_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .unwrap_or(40_999)
}

/// `net-rx` drop rows with `reason`.
fn drops<'a>(lines: &'a [Value], reason: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["tool"] == "net-rx" && v["type"] == "drop" && v["reason"] == reason)
        .collect()
}

fn count(rows: &[&Value], pred: impl Fn(&Value) -> bool) -> u64 {
    rows.iter()
        .filter(|r| pred(r))
        .filter_map(|r| r["count"].as_u64())
        .sum()
}

/// Drops of `reason` to udp/`port`, and to every IPv4 UDP port.
fn udp_drops(lines: &[Value], reason: &str, port: u16) -> (u64, u64) {
    let rows = drops(lines, reason);
    let mine = count(&rows, |r| r["port"] == port && r["proto"] == "udp");
    let udp4 = count(&rows, |r| r["proto"] == "udp" && r["l3proto"] == 0x0800);
    (mine, udp4)
}

fn trace(args: &[&str], work: impl FnOnce()) -> Vec<Value> {
    let mut a = vec!["net-rx", "--json"];
    a.extend_from_slice(args);
    let mut tk = Tracer::spawn(&a);
    tk.wait_attached();
    work();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(20));
    assert!(status.success(), "exit {status}: {stderr}");
    lines
}

fn closed_port_case(attach: &str) {
    let port = closed_port();
    const N: usize = 3000;
    let mut snmp = (BTreeMap::new(), BTreeMap::new());
    let mut sent = 0;
    let lines = trace(&["--attach", attach], || {
        snmp.0 = udp_snmp();
        sent = send(N, 32, port);
        // Loopback delivers in the sender's context: every datagram is dropped by now.
        snmp.1 = udp_snmp();
    });
    let meta = lines.iter().find(|l| l["type"] == "meta").unwrap();
    assert_eq!(meta["attach"], attach);
    let (mine, udp4) = udp_drops(&lines, "NO_SOCKET", port);
    let noports = delta(&snmp.0, &snmp.1, "NoPorts");
    eprintln!(
        "{attach}: sent {sent} to udp/{port}: NO_SOCKET for the port {mine}, all udp4 {udp4}; Udp:NoPorts +{noports}"
    );
    assert_eq!(sent, N);
    assert_eq!(mine, N as u64, "drops to our closed port");
    assert_eq!(udp4, noports, "udp4 NO_SOCKET drops vs Udp: NoPorts");
    let rows = drops(&lines, "NO_SOCKET");
    let row = rows.iter().find(|r| r["port"] == port).unwrap();
    assert_eq!(row["daddr"], "127.0.0.1");
    assert_eq!(row["dev"], "lo");
    assert_eq!(
        row["finding"],
        format!("nobody listens on udp/{port}").as_str()
    );
    assert!(row["location"].as_str().unwrap().contains("udp"), "{row}");
    let f = lines
        .iter()
        .find(|l| l["type"] == "finding" && l["subject"]["name"] == format!("udp/{port}"))
        .unwrap_or_else(|| panic!("no finding for udp/{port}"));
    assert_eq!(f["cause"], "net-drops");
    assert_eq!(f["evidence"]["drops"], N as u64);
}

#[test]
fn closed_port_drops_equal_noports_tp_btf() {
    let _serial = root_serial();
    closed_port_case("tp_btf");
}

#[test]
fn closed_port_drops_equal_noports_classic_tracepoint() {
    let _serial = root_serial();
    closed_port_case("tracepoint");
}

#[test]
fn closed_port_drops_equal_noports_raw_tp() {
    let _serial = root_serial();
    closed_port_case("raw_tp");
}

#[test]
fn rcvbuf_drops_equal_rcvbuferrors_and_name_the_receiver() {
    let _serial = root_serial();
    rcvbuf_case(false);
}

/// The same on the path kernels without `rx_sk` take (< 6.12, Debian's 6.1): the socket is
/// found from the destination port in userspace.
#[test]
fn rcvbuf_drops_name_the_receiver_without_rx_sk() {
    let _serial = root_serial();
    rcvbuf_case(true);
}

fn rcvbuf_case(no_rx_sk: bool) {
    let rx = small_receiver();
    let port = rx.local_addr().unwrap().port();
    const N: usize = 20_000;
    let mut snmp = (BTreeMap::new(), BTreeMap::new());
    let mut sent = 0;
    let args: &[&str] = if no_rx_sk { &["--no-rx-sk"] } else { &[] };
    let lines = trace(args, || {
        snmp.0 = udp_snmp();
        sent = send(N, 200, port);
        snmp.1 = udp_snmp();
    });
    // What the socket kept: everything else was dropped.
    let expect = sent as u64 - drain(&rx);
    let (mine, udp4) = udp_drops(&lines, "SOCKET_RCVBUFF", port);
    let errs = delta(&snmp.0, &snmp.1, "RcvbufErrors");
    eprintln!(
        "sent {sent}, kept {}: SOCKET_RCVBUFF for udp/{port} {mine}, all udp4 {udp4}; Udp:RcvbufErrors +{errs}",
        sent as u64 - expect
    );
    assert_eq!(mine, expect, "drops at our socket = sent - kept");
    assert_eq!(udp4, errs, "udp4 SOCKET_RCVBUFF drops vs Udp: RcvbufErrors");
    let sock: Vec<&Value> = lines
        .iter()
        .filter(|v| v["type"] == "socket" && v["port"] == port)
        .collect();
    assert_eq!(sock.len(), 1, "{sock:?}");
    let s = sock[0];
    assert_eq!(s["count"], expect);
    assert_eq!(s["pid"], std::process::id(), "owner of the socket: {s}");
    assert_eq!(s["reason"], "SOCKET_RCVBUFF");
    assert_eq!(s["proto"], "udp");
    let row = drops(&lines, "SOCKET_RCVBUFF")
        .into_iter()
        .find(|r| r["port"] == port)
        .unwrap();
    assert_eq!(row["pid"], std::process::id(), "drop row names the owner");
    // The finding is about the receiver, unless it is tracekit's own test process: it is.
    if no_rx_sk {
        assert_eq!(s["found_by"], "port");
        assert_eq!(s["sk_drops"], expect, "the socket's own drop counter");
        return;
    }
    assert_eq!(s["found_by"], "socket");
    // SO_RCVBUF is doubled by the kernel, with a floor (SOCK_MIN_RCVBUF).
    let rcvbuf = s["rcvbuf"].as_u64().unwrap();
    assert!((2048..=4608).contains(&rcvbuf), "rcvbuf {rcvbuf}");
    assert_eq!(
        s["full"], s["count"],
        "every drop found the buffer full: {s}"
    );
}

/// A receiver with a 1 KiB buffer that never reads, in another process (`tk-workload
/// net-rx-hold`, 8 s): the child, its pid and its port.
fn hold() -> (std::process::Child, u64, u16) {
    let mut holder = Command::new(workload_bin())
        .args(["net-rx-hold", "8000"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("tk-workload");
    use std::io::BufRead;
    let mut line = String::new();
    let out = holder.stdout.as_mut().unwrap();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    let (pid, port) = (
        v["pid"].as_u64().unwrap(),
        v["port"].as_u64().unwrap() as u16,
    );
    (holder, pid, port)
}

/// The rcvbuf finding names a receiver that is another process (the workload holds the
/// socket), with the buffer evidence and the fix.
#[test]
fn rcvbuf_finding_names_the_receiving_process() {
    let _serial = root_serial();
    let (mut holder, pid, port) = hold();
    let lines = trace(&[], || {
        send(5000, 200, port);
    });
    let f = lines
        .iter()
        .find(|l| l["type"] == "finding" && l["pid"] == pid)
        .unwrap_or_else(|| panic!("no finding for the receiver {pid}: {lines:?}"));
    eprintln!("{}", f["summary"]);
    assert_eq!(f["cause"], "net-drops");
    assert!(f["summary"].as_str().unwrap().contains("SOCKET_RCVBUFF"));
    assert!(f["summary"].as_str().unwrap().contains("full 100 %"), "{f}");
    assert!(f["advice"].as_str().unwrap().contains("SO_RCVBUF"), "{f}");
    assert!(f["evidence"]["drops"].as_u64().unwrap() >= 4990);
    // The receiver's title, /proc/<pid>/cmdline read while it lives, on its socket row, the
    // drop rows it owns and the finding.
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let title: String = String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim_end()
        .to_string();
    assert_eq!(
        title,
        format!("{} net-rx-hold 8000", workload_bin().display())
    );
    assert_eq!(f["cmdline"], title.as_str(), "{f}");
    let sock = lines
        .iter()
        .find(|l| l["type"] == "socket" && l["port"] == port)
        .unwrap_or_else(|| panic!("no socket row for :{port}: {lines:?}"));
    assert_eq!(sock["cmdline"], title.as_str(), "{sock}");
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Issue #33 (4): a receiver that closes its socket (here: exits) before the window ends is
/// still named: its owner was learnt soon after the first drop, not at the report.
#[test]
fn a_receiver_gone_before_the_report_is_still_named() {
    let _serial = root_serial();
    let (mut holder, pid, port) = hold();
    let lines = trace(&[], || {
        send(5000, 200, port);
        // A few of the collector's polls (every 200 ms) while the receiver lives.
        std::thread::sleep(Duration::from_millis(700));
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    });
    assert_drops_named(&lines, port, pid, "tk-workload");
}

/// The drop finding about `port` names `pid` (`comm`), though it is gone.
fn assert_drops_named(lines: &[Value], port: u16, pid: u64, comm: &str) {
    let f = lines
        .iter()
        .find(|l| {
            l["type"] == "finding" && l["cause"] == "net-drops" && l["evidence"]["port"] == port
        })
        .unwrap_or_else(|| panic!("no finding for :{port}: {lines:?}"));
    eprintln!("{}", f["summary"]);
    assert_eq!(f["pid"], pid, "{f}");
    assert_eq!(f["comm"], comm, "{f}");
    assert!(
        !f["summary"]
            .as_str()
            .unwrap()
            .contains("no process holds it"),
        "{f}"
    );
}

/// #33 (4) with the field report's software: iperf3's one-off server (`-1`) receives a 2 s
/// UDP flood into a 64 KiB socket buffer (the client's `-w`, which iperf3 applies to the
/// server's data socket too) and exits with its test, seconds before the window ends. The
/// drop finding still names iperf3, and the drops at its port are what the kernel counted in
/// `Udp: RcvbufErrors` (nothing else on this host overruns a UDP socket meanwhile).
#[test]
fn iperf3_udp_receiver_that_exited_is_named() {
    let _serial = root_serial();
    let port = closed_port();
    let mut server = iperf3_one_off_server(port, None);
    let pid = server.id();
    let mut snmp = (BTreeMap::new(), BTreeMap::new());
    let mut client = String::new();
    let lines = trace(&[], || {
        snmp.0 = udp_snmp();
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port.to_string()])
            .args([
                "-u", "-b", "2G", "-l", "1400", "-w", "64K", "-t", "2", "--json",
            ])
            .output()
            .expect("iperf3 -c");
        client = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "iperf3 client: {out:?}");
        let _ = server.wait();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        // The window goes on without the receiver.
        std::thread::sleep(Duration::from_millis(1500));
        snmp.1 = udp_snmp();
    });
    let errs = delta(&snmp.0, &snmp.1, "RcvbufErrors");
    let (mine, udp4) = udp_drops(&lines, "SOCKET_RCVBUFF", port);
    let lost: Value = serde_json::from_str(&client).unwrap_or(Value::Null);
    eprintln!(
        "iperf3: client says lost {} of {} datagrams; SOCKET_RCVBUFF at :{port} {mine}, all udp4 {udp4}; Udp: RcvbufErrors +{errs}",
        lost["end"]["sum"]["lost_packets"], lost["end"]["sum"]["packets"]
    );
    assert!(mine > 0, "no drops at iperf3's port: {lines:?}");
    assert_eq!(udp4, errs, "udp4 SOCKET_RCVBUFF drops vs Udp: RcvbufErrors");
    assert_drops_named(&lines, port, u64::from(pid), "iperf3");
}

/// Loopback runs NET_RX in the sender's context, so a flood from a sender pinned with taskset
/// to CPU 1 is softirq work on CPU 1.
#[test]
fn softirq_time_lands_on_the_flooding_cpu() {
    let _serial = root_serial();
    let port = closed_port();
    const N: u64 = 20_000;
    let mut w = Value::Null;
    let lines = trace(&[], || {
        let out = Command::new("taskset")
            .args(["-c", "1"])
            .arg(workload_bin())
            .args(["net-rx-send", &port.to_string(), &N.to_string(), "32"])
            .output()
            .expect("taskset");
        assert!(out.status.success(), "{out:?}");
        w = serde_json::from_slice(&out.stdout).unwrap();
    });
    assert_eq!(w["sent"], N);
    let on = |c: u64, k: &str| -> u64 {
        lines
            .iter()
            .filter(|l| l["type"] == "cpu" && l["cpu"] == c)
            .filter_map(|l| l[k].as_u64())
            .sum()
    };
    eprintln!(
        "NET_RX runs: cpu0 {} cpu1 {}; drops cpu0 {} cpu1 {}",
        on(0, "softirq_count"),
        on(1, "softirq_count"),
        on(0, "drops"),
        on(1, "drops")
    );
    assert!(
        on(1, "softirq_count") >= N,
        "each loopback datagram runs NET_RX on CPU 1"
    );
    assert!(on(1, "softirq_count") > 5 * on(0, "softirq_count"));
    assert!(on(1, "drops") >= N, "the drops happened on CPU 1 too");
    assert!(on(1, "softirq_ns") > 0 && on(1, "processed") >= N);
    // The finding names the CPU that did the NET_RX work, with its share as evidence.
    let imbalance: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "finding" && l["cause"] == "softirq-imbalance")
        .collect();
    eprintln!("imbalance findings: {imbalance:?}");
    assert_eq!(imbalance.len(), 1, "{lines:?}");
    let f = imbalance[0];
    assert_eq!(f["subject"]["kind"], "cpu", "{f}");
    assert_eq!(f["subject"]["name"], "CPU 1", "{f}");
    assert_eq!(f["evidence"]["cpu"], 1, "{f}");
    assert_eq!(f["evidence"]["softirq_ns"], on(1, "softirq_ns"), "{f}");
    assert!(f["evidence"]["share_pct"].as_f64().unwrap() >= 75.0, "{f}");
    assert!(
        f["summary"].as_str().unwrap().starts_with("CPU 1 handles "),
        "{f}"
    );
    assert!(
        f["advice"]
            .as_str()
            .unwrap()
            .starts_with("loopback traffic"),
        "{f}"
    );
}

#[test]
fn tcp_connects_to_a_closed_port_are_no_socket_drops() {
    let _serial = root_serial();
    // A listener bound then dropped: its port is closed, and nothing else should take it in the
    // fraction of a second this test needs.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    const N: u64 = 200;
    let mut refused = 0;
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let lines = trace(&[], || {
        for _ in 0..N {
            // Each SYN meets no socket: the kernel answers RST and frees the SYN as NO_SOCKET.
            match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused += 1,
                other => panic!("connect to closed port {port}: {other:?}"),
            }
        }
    });
    let rows = drops(&lines, "NO_SOCKET");
    let mine = count(&rows, |r| r["port"] == port && r["proto"] == "tcp");
    eprintln!("{refused} refused connects to tcp/{port}: NO_SOCKET {mine}");
    assert_eq!(refused, N);
    assert_eq!(mine, N, "one NO_SOCKET drop per SYN");
    let row = rows.iter().find(|r| r["port"] == port).unwrap();
    assert_eq!(
        row["finding"],
        format!("nobody listens on tcp/{port}").as_str()
    );
}

/// `TcpExt` counters of `/proc/net/netstat` and `Tcp` of `/proc/net/snmp`, by `Proto:Name`.
fn tcp_counters() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for f in ["/proc/net/netstat", "/proc/net/snmp"] {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            let (Some((p, n)), Some((_, v))) = (names.split_once(':'), values.split_once(':'))
            else {
                continue;
            };
            for (n, v) in n.split_whitespace().zip(v.split_whitespace()) {
                if let Ok(v) = v.parse::<u64>() {
                    out.insert(format!("{p}:{n}"), v);
                }
            }
        }
    }
    out
}

fn moved(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>, k: &str) -> u64 {
    b.get(k).copied().unwrap_or(0) - a.get(k).copied().unwrap_or(0)
}

/// Issue #33: nginx (Debian's) with a full accept queue (`net.core.somaxconn` 16, two workers
/// of 64 connections each, `ab -c 1000`). The kernel's `ListenOverflows` is the ground truth,
/// bracketed: read inside tracekit's window (after attach, before the signal) it is at most
/// what tracekit reports, read outside (before the spawn, after the exit) at least. The finding
/// names a worker (a holder whose parent, the master, holds the socket too), the backlog in
/// force, and says nothing of "nobody listens" on a port nginx listens on.
#[test]
fn nginx_full_accept_queue_is_one_listen_overflow_naming_a_worker() {
    let _serial = root_serial();
    for bin in ["/usr/sbin/nginx", "/usr/bin/ab"] {
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} missing: `cargo xtask test` installs nginx and apache2-utils"
        );
    }
    let _somaxconn = tracekit_tests::mm::Setting::set("/proc/sys/net/core/somaxconn", "16");
    let dir = scratch("nginx");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let d = dir.display();
    let conf = format!(
        "daemon off; master_process on; worker_processes 2; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{ access_log off; client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;
  uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;
  server {{ listen 127.0.0.1:{port} backlog=511; location / {{ return 200 \"ok\\n\"; }} }} }}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let mut nginx = Command::new("/usr/sbin/nginx")
        .args(["-p", &d.to_string(), "-c", &format!("{d}/nginx.conf")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let master = nginx.id();
    // Up when its port answers.
    let up = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(
        up,
        "nginx did not listen on {port}: {:?}",
        std::fs::read_to_string(dir.join("error.log"))
    );
    let outer0 = tcp_counters();
    let mut tk = Tracer::spawn(&["net-rx", "--json"]);
    tk.wait_attached();
    let inner0 = tcp_counters();
    let ab = Command::new("timeout")
        .args([
            "20",
            "/usr/bin/ab",
            "-q",
            "-r",
            "-s",
            "2",
            "-n",
            "20000",
            "-c",
            "1000",
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .unwrap();
    let inner1 = tcp_counters();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(20));
    let outer1 = tcp_counters();
    // The master ends its workers on SIGTERM.
    // SAFETY: a signal to the child this test spawned and has not reaped.
    unsafe { libc::kill(master as i32, libc::SIGTERM) };
    let _ = nginx.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "exit {status}: {stderr}");
    let ab_out = String::from_utf8_lossy(&ab.stdout);
    let k = "TcpExt:ListenOverflows";
    let (inner, outer) = (moved(&inner0, &inner1, k), moved(&outer0, &outer1, k));
    assert!(
        inner > 0,
        "ab did not overflow nginx's accept queue (ListenOverflows +0): {ab_out}"
    );
    let f: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "finding" && l["cause"] == "listen-overflow")
        .collect();
    assert_eq!(f.len(), 1, "{f:?}");
    let f = f[0];
    eprintln!("{}", f["summary"]);
    let seen = f["evidence"]["listen_overflows"].as_u64().unwrap();
    assert!(
        inner <= seen && seen <= outer,
        "ListenOverflows: inside {inner} <= tracekit {seen} <= outside {outer}"
    );
    assert_eq!(f["evidence"]["port"], port, "{f}");
    assert_eq!(f["evidence"]["backlog"], 16, "somaxconn caps the 511: {f}");
    assert_eq!(f["comm"], "nginx", "{f}");
    let pid = f["pid"].as_u64().unwrap() as u32;
    assert_ne!(pid, master, "a worker, not the master: {f}");
    assert!(
        f["advice"].as_str().unwrap().contains("net.core.somaxconn"),
        "{f}"
    );
    let closed = format!("nobody listens on tcp/{port}");
    assert!(
        !lines.iter().any(|l| l.to_string().contains(&closed)),
        "{closed} while nginx listened"
    );
    let row = lines
        .iter()
        .find(|l| l["type"] == "listen" && l["port"] == port)
        .unwrap_or_else(|| panic!("no listen row for {port}"));
    assert!(
        row["pids"].as_array().unwrap().len() >= 3,
        "master and two workers: {row}"
    );
}

/// Issue #33: sockets closed with data unread are routine teardown (`SOCKET_CLOSE` from
/// `unix_release_sock` here), shown as rows and never a finding.
#[test]
fn connection_churn_is_no_drop_finding() {
    use std::{io::Write, os::unix::net::UnixStream};
    let _serial = root_serial();
    const N: u64 = 20_000;
    let lines = trace(&[], || {
        for _ in 0..N {
            let (mut a, b) = UnixStream::pair().unwrap();
            a.write_all(&[7; 64]).unwrap();
            drop(b);
            drop(a);
        }
    });
    let rows = drops(&lines, "SOCKET_CLOSE");
    let closed = count(&rows, |r| r["routine"] == true);
    assert!(
        closed >= N,
        "{closed} SOCKET_CLOSE rows marked routine of {N}: {rows:?}"
    );
    let f: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "finding" && l["cause"] == "net-drops")
        .collect();
    assert!(f.is_empty(), "routine drops made findings: {f:?}");
}

/// A firewall rule's drops are NETFILTER_DROP, as many as the rule's own counter, in a network
/// namespace of the test's own (the host's rules are not touched).
#[test]
fn firewall_drops_equal_the_rules_counter() {
    let _serial = root_serial();
    let Some(nft) = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        eprintln!("skipped: nft is not installed (apt-get install nftables) and this test needs it for a rule in its own network namespace");
        return;
    };
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("skipped: unshare (util-linux) is not installed");
        return;
    }
    const N: u64 = 500;
    let port = 47_011u16;
    let script = format!(
        "set -e; ip link set lo up; \
         {nft} add table inet tk_net_rx; \
         {nft} add chain inet tk_net_rx input '{{ type filter hook input priority 0; }}'; \
         {nft} add rule inet tk_net_rx input udp dport {port} counter drop; \
         {w} net-rx-send {port} {N} 64; \
         {nft} list chain inet tk_net_rx input",
        w = workload_bin().display()
    );
    let mut out = None;
    let lines = trace(&[], || {
        out = Some(
            Command::new("unshare")
                .args(["--net", "sh", "-c", &script])
                .output()
                .expect("unshare"),
        );
    });
    let out = out.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counter: u64 = stdout
        .split("counter packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no rule counter in {stdout}"));
    let (mine, _) = udp_drops(&lines, "NETFILTER_DROP", port);
    eprintln!("nft counter {counter}, NETFILTER_DROP for udp/{port} {mine}");
    assert_eq!(counter, N, "the rule saw every datagram");
    assert_eq!(mine, counter, "NETFILTER_DROP drops = the rule's counter");
    let f = lines
        .iter()
        .find(|l| l["type"] == "finding" && l["subject"]["name"] == "NETFILTER_DROP");
    assert!(f.is_some(), "a finding for NETFILTER_DROP");
}

/// Every line carries the keys the issue names, and the conntrack, device and snmp lines exist.
#[test]
fn json_lines_have_their_keys() {
    let _serial = root_serial();
    let port = closed_port();
    let lines = trace(&["--consume"], || {
        send(100, 32, port);
    });
    let meta = lines.iter().find(|l| l["type"] == "meta").unwrap();
    let progs: Vec<&str> = meta["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        progs.len(),
        5,
        "every hook attached with --consume: {progs:?}"
    );
    for l in &lines {
        assert_eq!(l["tool"], "net-rx", "{l}");
        match l["type"].as_str().unwrap() {
            "drop" => {
                for k in ["reason", "count", "proto", "port", "cpus", "location"] {
                    assert!(!l[k].is_null(), "drop line lacks {k}: {l}");
                }
            }
            "cpu" => {
                for k in [
                    "cpu",
                    "softirq_ns",
                    "softirq_count",
                    "squeezed",
                    "backlog_drops",
                    "consumed",
                ] {
                    assert!(!l[k].is_null(), "cpu line lacks {k}: {l}");
                }
            }
            "device" => assert!(l["dev"].is_string() && l["rx_packets"].is_u64(), "{l}"),
            "conntrack" => assert!(l["loaded"].is_boolean(), "{l}"),
            "snmp" => assert!(l["delta"]["Udp:NoPorts"].as_u64() >= Some(100), "{l}"),
            "finding" => assert!(l["summary"].is_string() && l["advice"].is_string()),
            "meta" | "stats" | "socket" => {}
            other => panic!("unexpected line type {other}: {l}"),
        }
    }
    let consumed: u64 = lines
        .iter()
        .filter(|l| l["type"] == "cpu")
        .filter_map(|l| l["consumed"].as_u64())
        .sum();
    assert!(consumed > 0, "--consume counts normal frees");
    let lo = lines
        .iter()
        .find(|l| l["type"] == "device" && l["dev"] == "lo")
        .expect("a device line for lo");
    assert!(lo["rx_packets"].as_u64() >= Some(100), "{lo}");
    let conntrack_loaded =
        std::path::Path::new("/proc/sys/net/netfilter/nf_conntrack_max").exists();
    let ct = lines.iter().find(|l| l["type"] == "conntrack").unwrap();
    assert_eq!(ct["loaded"], conntrack_loaded, "{ct}");
    let st = last_stats(&lines);
    assert!(st["drops"].as_u64() >= Some(100), "{st}");
    assert!(st["recursion_misses"].is_u64(), "{st}");
}

/// `--pid` keeps the drops at that process's sockets: the workload's flooded receiver is
/// shown, exact against `Udp: RcvbufErrors`; this test's own flooded receiver is not, and no
/// finding is about anything else. `--threads` does not apply: refused with one line, exit 2.
#[test]
fn pid_filter_keeps_that_processes_sockets() {
    let _serial = root_serial();
    let (mut holder, pid, port) = hold();
    let mine = small_receiver();
    let my_port = mine.local_addr().unwrap().port();
    let mut errs = 0;
    let lines = trace(&["--pid", &pid.to_string()], || {
        send(3000, 200, my_port);
        let before = udp_snmp();
        send(3000, 200, port);
        errs = delta(&before, &udp_snmp(), "RcvbufErrors");
    });
    let _ = holder.kill();
    let _ = holder.wait();
    let (theirs, udp4) = udp_drops(&lines, "SOCKET_RCVBUFF", port);
    eprintln!("--pid {pid}: SOCKET_RCVBUFF for its udp/{port} {theirs} (all kept udp4 {udp4}); Udp:RcvbufErrors +{errs} during its flood");
    assert_eq!(
        theirs, errs,
        "the receiver's drops = RcvbufErrors of its flood"
    );
    assert_eq!(udp4, theirs, "only the traced process's socket is kept");
    assert!(theirs >= 2990, "{theirs}");
    for l in lines
        .iter()
        .filter(|l| ["drop", "socket"].contains(&l["type"].as_str().unwrap_or("")))
    {
        assert_eq!(l["pid"], pid, "a row of another process: {l}");
    }
    assert!(drain(&mine) > 0);
    let f: Vec<&Value> = lines.iter().filter(|l| l["type"] == "finding").collect();
    assert!(
        !f.is_empty() && f.iter().all(|f| f["subject"]["pid"] == pid),
        "{f:?}"
    );
    let o = Command::new(tracekit_bin())
        .args(["net-rx", "--threads", "--duration", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--threads"), "{err}");
}

#[test]
fn vm_check_passes_here() {
    let _serial = root_serial();
    eprintln!("{}", vm_check().unwrap());
}

/// net-rx's workloads (tk-workload dispatches here; the VM guest has busybox, no python or
/// iperf, so every packet source is here).
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["net-rx-send", port, n, len] => {
            let before = udp_snmp();
            let sent = send(n.parse().ok()?, len.parse().ok()?, port.parse().ok()?);
            let after = udp_snmp();
            println!(
                "{}",
                json!({
                    "pid": std::process::id(),
                    "sent": sent,
                    "noports": delta(&before, &after, "NoPorts"),
                    "rcvbuf_errors": delta(&before, &after, "RcvbufErrors"),
                })
            );
        }
        ["net-rx-hold", ms] => {
            // A receiver with a 1 KiB buffer that never reads, held for MS milliseconds.
            let rx = small_receiver();
            let port = rx.local_addr().ok()?.port();
            println!("{}", json!({"pid": std::process::id(), "port": port}));
            std::thread::sleep(Duration::from_millis(ms.parse().ok()?));
        }
        _ => return None,
    }
    Some(0)
}

/// net-rx in the guest kernels: the closed-port and rcvbuf cases, exact against what was sent
/// and kept and against `/proc/net/snmp`, on 6.1 (no `rx_sk`: sockets found by port) and 5.10
/// (no reasons: inferred from the dropping function and the counters) as here. The receiver
/// socket belongs to this process, so its owner is known when tracekit reports.
pub fn vm_check() -> Result<String, String> {
    const N: u64 = 2000;
    vm::lo_up()?;
    // Closed port.
    let port = closed_port();
    let (lines, w, modes) = vm::traced(
        &["net-rx", "--consume"],
        &["net-rx-send", &port.to_string(), &N.to_string(), "32"],
    )?;
    let (mine, udp4) = udp_drops(&lines, "NO_SOCKET", port);
    if w["sent"] != N || mine != N || udp4 != w["noports"].as_u64().unwrap_or(0) {
        return Err(format!(
            "closed port udp/{port}: sent {}, NO_SOCKET {mine} for the port, {udp4} for udp4, Udp:NoPorts +{}",
            w["sent"], w["noports"]
        ));
    }
    let meta = lines
        .iter()
        .find(|l| l["type"] == "meta")
        .cloned()
        .unwrap_or_default();
    // A receiver that never reads.
    let rx = small_receiver();
    let port = rx.local_addr().map_err(|e| e.to_string())?.port();
    let (lines, w, _) = vm::traced(
        &["net-rx", "--consume"],
        &["net-rx-send", &port.to_string(), &N.to_string(), "200"],
    )?;
    let expect = w["sent"].as_u64().unwrap_or(0) - drain(&rx);
    let (mine, udp4) = udp_drops(&lines, "SOCKET_RCVBUFF", port);
    let errs = w["rcvbuf_errors"].as_u64().unwrap_or(0);
    if mine != expect || udp4 != errs || expect == 0 {
        return Err(format!(
            "rcvbuf udp/{port}: expected {expect} drops, SOCKET_RCVBUFF {mine} for the port, {udp4} for udp4, Udp:RcvbufErrors +{errs}"
        ));
    }
    let me = std::process::id();
    let sock = lines
        .iter()
        .find(|l| l["type"] == "socket" && l["port"] == port)
        .ok_or_else(|| format!("no socket row for udp/{port}"))?;
    if sock["pid"] != me || sock["count"] != expect {
        return Err(format!(
            "socket row {sock}: expected pid {me}, count {expect}"
        ));
    }
    Ok(format!(
        "NO_SOCKET {N}/{N} = Udp:NoPorts, SOCKET_RCVBUFF {expect}/{expect} = Udp:RcvbufErrors, receiver pid {me} (found by {}); reason {}, rx_sk {}; {modes}; programs unloaded",
        sock["found_by"].as_str().unwrap_or("?"),
        if meta["has_reason"] == true { "from the kernel" } else { "inferred (none on this kernel)" },
        if meta["has_rx_sk"] == true { "yes" } else { "no" },
    ))
}
