//! Root tests of JSON's one lossless representation of bytes from outside (README, Safety;
//! `report::sanitize`): every field that names something the node chose — process and thread
//! names, file paths, waker and wakee names, network device names — is the string when its
//! bytes are UTF-8, else the string with U+FFFD plus `<field>_bytes` holding the exact bytes.
//! The hostile names here hold ESC, a newline (where the kernel allows one) and 0xff.

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::OsStrExt,
    process::Command,
    time::Duration,
};

use tracekit_tests::*;

/// ESC, a newline and a byte that is not UTF-8 in a process name.
const HOSTILE_HEX: &str = "1b5b324a0a6576696cff";

#[test]
fn hostile_process_names_are_escaped_in_text_and_faithful_in_json() {
    require_root();
    let dir = scratch("hostile");
    let path = dir.join("f");
    // Text.
    let tk = Tracer::spawn(&["fsync-lat", "--interval", "200ms"]);
    std::thread::sleep(Duration::from_millis(600));
    run_workload(&["named", HOSTILE_HEX, path.to_str().unwrap(), "3"]);
    std::thread::sleep(Duration::from_millis(300));
    tk.signal(libc::SIGINT);
    let (_, text, _) = tk.finish_text(Duration::from_secs(10));
    let text = text.join("\n");
    assert!(
        !text.contains('\x1b'),
        "raw escape reached the terminal: {text:?}"
    );
    assert!(
        text.contains("\\x1b[2J\\x0aevil\\xff"),
        "escaped name missing: {text}"
    );
    // JSON.
    let mut tj = Tracer::spawn(&["fsync-lat", "--json"]);
    tj.wait_attached();
    let w = run_workload(&["named", HOSTILE_HEX, path.to_str().unwrap(), "3"]);
    tj.signal(libc::SIGINT);
    let (_, lines, _) = tj.finish(Duration::from_secs(10));
    let pid = w["pid"].as_u64().unwrap() as u32;
    let row = rows_for(&lines, "fsync-lat", pid)
        .into_iter()
        .next()
        .expect("row for the named process");
    // Lossless: the string with U+FFFD for the invalid byte, and the exact bytes beside it.
    assert_eq!(row["comm"], "\u{1b}[2J\nevil\u{fffd}");
    assert_eq!(bytes_of(row, "comm"), hex(HOSTILE_HEX));
    let _ = std::fs::remove_dir_all(dir);
}

fn hex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// The exact bytes of a JSON field in tracekit's representation (README, Safety): the string,
/// or `<key>_bytes` when the bytes are not UTF-8.
fn bytes_of(v: &serde_json::Value, key: &str) -> Vec<u8> {
    if let Some(a) = v[format!("{key}_bytes")].as_array() {
        return a.iter().map(|b| b.as_u64().unwrap() as u8).collect();
    }
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
        .as_bytes()
        .to_vec()
}

/// Every field from outside has the same lossless representation: a file name (`file`) and a
/// preemptor's name (`preempted_by[].comm`) holding a byte that is not UTF-8 and a real
/// backslash come back exact, and the two are told apart.
#[test]
fn json_bytes_are_lossless_in_every_field() {
    require_root();
    // 0xff, then a literal backslash followed by "xff": two different byte strings that the old
    // `\xNN` escaping printed the same.
    let name: &[u8] = b"wal-\xff-\\xff";
    let dir = scratch("lossless");
    // The kernel names the file by its canonical path.
    let path = std::fs::canonicalize(&dir)
        .unwrap()
        .join(std::ffi::OsStr::from_bytes(name));
    let me = std::process::id().to_string();
    let mut tk = Tracer::spawn(&["fsync-lat", "--json", "--by-file", "--pid", &me]);
    tk.wait_attached();
    let f = std::fs::File::create(&path).unwrap();
    for _ in 0..3 {
        f.sync_all().unwrap();
    }
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    let file = lines
        .iter()
        .find(|l| l["type"] == "file")
        .unwrap_or_else(|| panic!("no file line: {lines:?}"));
    assert_eq!(
        bytes_of(file, "file"),
        path.as_os_str().as_bytes(),
        "{file}"
    );
    assert!(
        file["file"].as_str().unwrap().contains('\u{fffd}'),
        "{file}"
    );
    drop(f);

    // Two spinners named with the same kind of bytes preempt each other.
    let pname = b"sp\xff\\xff".to_vec();
    let hexname: String = pname.iter().map(|b| format!("{b:02x}")).collect();
    let (w, lines) = trace_workload(
        &["ctxsw", "--json", "--interval", "300ms"],
        &["spin-named", &hexname, "1000"],
    );
    let pids = workload_proc_pids(&w);
    let by: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["type"] == "summary" && pids.contains(&l["pid"].as_u64().unwrap_or(0)))
        .flat_map(|l| l["preempted_by"].as_array().unwrap().iter())
        .filter(|p| pids.contains(&p["pid"].as_u64().unwrap_or(0)))
        .collect();
    assert!(
        !by.is_empty(),
        "the spinners never preempted each other: {lines:?}"
    );
    assert!(
        by.iter().any(|p| bytes_of(p, "comm") == pname),
        "preempted_by names not exact: {by:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A waker thread's name: ESC, a newline and 0xff.
const WAKER: &[u8] = b"wk\x1b[2J\n\xff";
/// A wakee thread's name: 0xff, then a real backslash and "xff" (the old escaping's twin).
const WAKEE: &[u8] = b"we\n\xff\\xff";

/// ctxsw's waker rows (`--threads`) name both ends exactly: `comm`/`wakee_comm` with
/// `comm_bytes`/`wakee_comm_bytes` (they were lossy strings only).
#[test]
fn json_bytes_are_lossless_in_waker_rows() {
    require_root();
    let me = std::process::id().to_string();
    // Rows take a task's name when first seen in a window: later windows see the new names.
    let mut tk = Tracer::spawn(&[
        "ctxsw",
        "--json",
        "--threads",
        "--pid",
        &me,
        "--interval",
        "300ms",
    ]);
    tk.wait_attached();
    let (t1, t2) = std::thread::spawn(|| thread_pingpong(1.5, [Some(WAKER), Some(WAKEE)]))
        .join()
        .unwrap();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let wakers: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "waker").collect();
    // Whatever the row, a name with U+FFFD carries its bytes.
    for w in &wakers {
        for key in ["comm", "wakee_comm"] {
            if w[key].as_str().unwrap().contains('\u{fffd}') {
                assert!(w[format!("{key}_bytes")].is_array(), "{key} lossy: {w}");
            }
        }
    }
    let pair: Vec<&&serde_json::Value> = wakers
        .iter()
        .filter(|l| l["tid"] == t1 && l["wakee_tid"] == t2)
        .collect();
    let exact = pair
        .iter()
        .filter(|l| bytes_of(l, "comm") == WAKER && bytes_of(l, "wakee_comm") == WAKEE)
        .count();
    eprintln!(
        "waker rows {t1} -> {t2}: {} in all, {exact} with both names exact",
        pair.len()
    );
    assert!(exact > 0, "no exact waker row for {t1} -> {t2}: {pair:?}");
}

/// A veth pair whose root-namespace end has a hostile name and address 10.213.77.1/30; the
/// peer (10.213.77.2) lives in a network namespace of its own. Both go on drop, also when the
/// test fails.
struct HostileLink {
    ns: String,
    dev: OsString,
}

fn ip(args: &[&OsStr]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

impl HostileLink {
    fn create(dev: &[u8]) -> HostileLink {
        let me = std::process::id();
        let link = HostileLink {
            ns: format!("tk-hostile-{me}"),
            dev: OsStr::from_bytes(dev).to_owned(),
        };
        let peer = format!("tkp{}", me % 100_000);
        let o = |s: &'static str| OsStr::new(s);
        let (ns, d, p) = (
            OsStr::new(&link.ns),
            link.dev.as_os_str(),
            OsStr::new(&peer),
        );
        let steps: [&[&OsStr]; 7] = [
            &[o("netns"), o("add"), ns],
            &[
                o("link"),
                o("add"),
                d,
                o("type"),
                o("veth"),
                o("peer"),
                o("name"),
                p,
                o("netns"),
                ns,
            ],
            &[o("addr"), o("add"), o("10.213.77.1/30"), o("dev"), d],
            &[o("link"), o("set"), d, o("up")],
            &[
                o("-n"),
                ns,
                o("addr"),
                o("add"),
                o("10.213.77.2/30"),
                o("dev"),
                p,
            ],
            &[o("-n"), ns, o("link"), o("set"), p, o("up")],
            &[o("-n"), ns, o("link"), o("set"), o("lo"), o("up")],
        ];
        for s in steps {
            // A failed step panics: `link` is dropped on the way out, removing what was made.
            if let Err(e) = ip(s) {
                panic!("{e}");
            }
        }
        link
    }

    fn ifindex(&self) -> u64 {
        let p = std::path::Path::new("/sys/class/net")
            .join(&self.dev)
            .join("ifindex");
        std::fs::read_to_string(p).unwrap().trim().parse().unwrap()
    }

    /// Sends `n` UDP datagrams from inside the namespace to 10.213.77.1:`port`, received on the
    /// hostile link (a thread joins the namespace; the test process stays where it is).
    fn send_from_peer(&self, port: u16, n: usize) {
        let ns = format!("/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let f = std::fs::File::open(&ns).unwrap();
            use std::os::fd::AsRawFd;
            // SAFETY: setns moves only this thread into the namespace `f` names.
            assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            let s = std::net::UdpSocket::bind("10.213.77.2:0").unwrap();
            for _ in 0..n {
                // ICMP port unreachable may come back as an error on the next send: ignored.
                let _ = s.send_to(b"tracekit", ("10.213.77.1", port));
            }
        })
        .join()
        .unwrap();
    }
}

impl Drop for HostileLink {
    fn drop(&mut self) {
        let _ = ip(&[OsStr::new("link"), OsStr::new("del"), self.dev.as_os_str()]);
        let _ = ip(&[OsStr::new("netns"), OsStr::new("del"), OsStr::new(&self.ns)]);
    }
}

/// A device name may hold any byte but `/`, `:` and whitespace: net-rx's device and drop rows
/// carry `dev_bytes` beside the lossy `dev` (it was converted lossily, and the device's sysfs
/// and ethtool lookups went to a name that does not exist).
#[test]
fn json_bytes_are_lossless_in_device_names() {
    require_root();
    let name: &[u8] = b"tk\x1b\xff\xfe";
    let link = HostileLink::create(name);
    let ifindex = link.ifindex();
    // A port nobody listens on: bound, then released.
    let port = std::net::UdpSocket::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut tk = Tracer::spawn(&["net-rx", "--json"]);
    tk.wait_attached();
    let sent = 200;
    link.send_from_peer(port, sent);
    std::thread::sleep(Duration::from_millis(300));
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let dev = lines
        .iter()
        .find(|l| l["type"] == "device" && l["dev"].as_str().is_some_and(|d| d.starts_with("tk")))
        .unwrap_or_else(|| panic!("no device row for the link: {lines:?}"));
    assert_eq!(bytes_of(dev, "dev"), name, "{dev}");
    assert!(dev["dev"].as_str().unwrap().contains('\u{fffd}'), "{dev}");
    let rx = dev["rx_packets"].as_u64().unwrap();
    let drops: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["type"] == "drop" && l["ifindex"] == ifindex && l["port"] == port)
        .collect();
    let dropped: u64 = drops.iter().map(|d| d["count"].as_u64().unwrap()).sum();
    eprintln!(
        "sent {sent} datagrams: device row rx_packets {rx}, NO_SOCKET drops on the link {dropped}"
    );
    // The peer's ARP and IPv6 chatter arrive on the link too.
    assert!(rx >= sent as u64, "rx_packets {rx} < {sent} sent: {dev}");
    assert_eq!(dropped, sent as u64, "{drops:?}");
    for d in &drops {
        assert_eq!(d["reason"], "NO_SOCKET", "{d}");
        assert_eq!(bytes_of(d, "dev"), name, "{d}");
    }
    drop(link);
}
