//! Root tests for container attribution with a real container runtime: podman (with runc: crun
//! refuses this host's v1 hybrid layout) runs an fsync loop and a memory-limited writer in two
//! named containers built offline from busybox-static and `tk-workload`; every tool names the
//! containers as `podman inspect` does, `--by container` totals equal the sum of the
//! processes' rows, and `--container NAME` keeps only that container's processes.
//!
//! Needs the Debian packages `podman runc busybox-static` (installed here when missing) and
//! `default_ulimits = []` under `[containers]` in `/etc/containers/containers.conf` (this host
//! denies raising RLIMIT_NPROC; the setting is added when missing, nothing else is changed).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use tracekit_tests::{
    podman::{podman, podman_ready, Pod},
    *,
};

/// After the root and runtime checks: a pod of the image `localhost/tk-<tag>-<pid>` (busybox-static
/// and `/tk-workload`) owning the test's scratch directory, that directory, and the container
/// names `tk-<tag>-<name>-<pid>` (started by the test with `run` or `start`).
fn made(tag: &str, names: &[&str]) -> (Pod, PathBuf, Vec<String>) {
    require_root();
    podman_ready();
    let pid = std::process::id();
    let dir = scratch(&format!("containers-{tag}"));
    let pod = Pod::import(
        &format!("localhost/tk-{tag}-{pid}:latest"),
        &dir,
        &[(&workload_bin(), "/tk-workload")],
    )
    .owning(&dir);
    let names = names
        .iter()
        .map(|n| format!("tk-{tag}-{n}-{pid}"))
        .collect();
    (pod, dir, names)
}

/// Starts container `name` running `/tk-workload <cmd> /gate/done-<name> /gate/end` once
/// `<gate>/go` exists; returns its host pid (the workload's: `exec`).
fn run(pod: &mut Pod, dir: &Path, name: &str, cmd: &str) -> u32 {
    start(
        pod,
        dir,
        name,
        &format!(
            "while [ ! -e /gate/go ]; do sleep 0.1; done; exec /tk-workload {cmd} /gate/done-{name} /gate/end"
        ),
    )
}

/// Starts container `name` (64 MiB limit, `<dir>/gate` at `/gate`) running `sh -c script`;
/// returns its host pid.
fn start(pod: &mut Pod, dir: &Path, name: &str, script: &str) -> u32 {
    let gate = dir.join("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let volume = format!("{}:/gate", gate.display());
    pod.run_with(
        name,
        &["--memory", "64m", "-v", &volume],
        &["sh", "-c", script],
    )
}

#[test]
fn every_tool_names_the_containers() {
    let (mut pod, dir, names) = made("ct", &["fsync", "mem", "udp", "spin"]);
    let (fsync_name, mem_name) = (names[0].clone(), names[1].clone());
    // 300 fsyncs of a file in the container's own layer.
    let fsync_pid = run(&mut pod, &dir, &fsync_name, "ct-fsync /data/f 300");
    // 256 MiB written under a 64 MiB limit: memcg reclaim in the writer.
    let mem_pid = run(&mut pod, &dir, &mem_name, "ct-write /data/big 256");
    // 20,000 datagrams into a 2 KiB receive buffer: drops at a socket owned in a container.
    let (udp_name, spin_name) = (names[2].clone(), names[3].clone());
    let udp_pid = run(&mut pod, &dir, &udp_name, "ct-udp 20000");
    // 1.5 s on the CPU: profile's and numa's rows.
    let spin_pid = run(&mut pod, &dir, &spin_name, "ct-spin 1500");
    for (n, p) in [
        (&fsync_name, fsync_pid),
        (&mem_name, mem_pid),
        (&udp_name, udp_pid),
        (&spin_name, spin_pid),
    ] {
        assert_eq!(
            podman(&["inspect", "--format", "{{.Name}}", n]).as_str(),
            n.as_str()
        );
        assert!(p > 0, "{n} runs");
    }

    // An unknown container is a usage error, before anything loads.
    let (status, _, stderr) = {
        let o = Command::new(tracekit_bin())
            .args([
                "fsync-lat",
                "--container",
                "tk-no-such-container",
                "-d",
                "1s",
            ])
            .output()
            .unwrap();
        (o.status, (), String::from_utf8_lossy(&o.stderr).to_string())
    };
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("tk-no-such-container"), "{stderr}");

    let fsync_all = attached(&["fsync-lat", "--json"]);
    let fsync_by = attached(&["fsync-lat", "--json", "--by", "container"]);
    let fsync_one = attached(&["fsync-lat", "--json", "--container", &fsync_name]);
    let memstall = attached(&["memstall", "--json"]);
    let memstall_by = attached(&["memstall", "--json", "--by", "container"]);
    let others: Vec<(&str, Tracer)> = ["ctxsw", "runq-lat", "io-lat"]
        .into_iter()
        .map(|t| (t, attached(&[t, "--json"])))
        .collect();
    // Tools without --by container: net-rx (drops by socket), numa (forced on one node),
    // profile (frame pointers: the workload's own stacks do not matter here).
    let net_rx = attached(&["net-rx", "--json"]);
    let numa = attached(&["numa", "--json", "--force"]);
    let profile = attached(&["profile", "--json", "--unwind", "fp"]);
    let others_by: Vec<(&str, Tracer)> = ["ctxsw", "runq-lat", "io-lat"]
        .into_iter()
        .map(|t| (t, attached(&[t, "--json", "--by", "container"])))
        .collect();

    // The workloads stay alive (named by /proc) until every tracer has reported.
    let gate = dir.join("gate");
    std::fs::write(gate.join("go"), "").unwrap();
    for n in &names {
        let done = gate.join(format!("done-{n}"));
        let t = std::time::Instant::now();
        while !done.exists() {
            assert!(t.elapsed() < Duration::from_secs(180), "{n} did not finish");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let out = podman(&["logs", &fsync_name]);
    let w: Value = serde_json::from_str(out.lines().last().unwrap_or("{}")).expect(&out);
    let fsyncs = w["fsync_ns"].as_array().expect("fsync_ns").len() as u64;
    assert_eq!(fsyncs, 300);

    let fsync_by = stop_json(fsync_by);
    let fsync_one = stop_json(fsync_one);
    let memstall = stop_json(memstall);
    let memstall_by = stop_json(memstall_by);
    let others: Vec<(&str, Vec<Value>)> =
        others.into_iter().map(|(t, x)| (t, stop_json(x))).collect();
    let others_by: Vec<(&str, Vec<Value>)> = others_by
        .into_iter()
        .map(|(t, x)| (t, stop_json(x)))
        .collect();
    let net_rx = stop_json(net_rx);
    let numa = stop_json(numa);
    let profile = stop_json(profile);
    let all = stop_json(fsync_all);
    std::fs::write(gate.join("end"), "").unwrap();
    for n in &names {
        podman(&["wait", n]);
    }

    // Every row of the container's process names it; the count is the workload's own.
    let r = summary_rows(&all, "fsync-lat");
    let mine: Vec<&&Value> = r.iter().filter(|x| x["pid"] == fsync_pid).collect();
    assert!(!mine.is_empty(), "no row for pid {fsync_pid}: {r:?}");
    for x in &mine {
        assert_eq!(x["container"], fsync_name.as_str(), "{x}");
        assert_eq!(x["runtime"], "podman", "{x}");
        assert_eq!(x["container_id"].as_str().unwrap().len(), 64, "{x}");
    }
    assert_eq!(container_count(&r, &fsync_name, "count"), fsyncs);
    let finding = all
        .iter()
        .find(|l| l["type"] == "finding" && l["pid"] == fsync_pid);
    if let Some(f) = finding {
        assert_eq!(f["container"], fsync_name.as_str(), "{f}");
    }

    // --by container: one row per container and syscall, the sum of its processes' rows.
    let b = summary_rows(&fsync_by, "fsync-lat");
    let folded: Vec<&&Value> = b.iter().filter(|x| x["container"] == fsync_name).collect();
    assert!(!folded.is_empty(), "{b:?}");
    for x in &folded {
        assert_eq!(x["pid"], 0, "{x}");
        assert!(x["processes"].as_u64().unwrap() >= 1, "{x}");
        let sum: u64 = r
            .iter()
            .filter(|y| y["container"] == fsync_name && y["syscall"] == x["syscall"])
            .map(|y| y["count"].as_u64().unwrap())
            .sum();
        assert_eq!(x["count"].as_u64().unwrap(), sum, "{x}");
    }
    assert_eq!(container_count(&b, &fsync_name, "count"), fsyncs);
    assert!(
        b.iter().all(|x| x["pid"] == 0),
        "every row folded (host rows in [host]): {b:?}"
    );

    // --container NAME: only that container's processes.
    let o = summary_rows(&fsync_one, "fsync-lat");
    assert!(!o.is_empty());
    for x in &o {
        assert_eq!(x["container"], fsync_name.as_str(), "{x}");
    }
    assert_eq!(container_count(&o, &fsync_name, "count"), fsyncs);

    // memstall: the writer's memcg reclaim, named by its container.
    let m = summary_rows(&memstall, "memstall");
    let writer: Vec<&&Value> = m.iter().filter(|x| x["pid"] == mem_pid).collect();
    assert!(
        !writer.is_empty(),
        "no memstall row for the writer {mem_pid}: {m:?}"
    );
    for x in &writer {
        assert_eq!(x["container"], mem_name.as_str(), "{x}");
    }
    assert!(
        writer
            .iter()
            .any(|x| x["kind"] == "memcg_reclaim" && x["count"].as_u64() > Some(0)),
        "{writer:?}"
    );

    // memstall --by container: the writer's container's reclaim is the sum of its processes'.
    let mb = summary_rows(&memstall_by, "memstall");
    let kind = |rs: &[&Value], k: &str| -> u64 {
        rs.iter()
            .filter(|x| x["container"] == mem_name && x["kind"] == k)
            .map(|x| x["count"].as_u64().unwrap_or(0))
            .sum()
    };
    let folded = mb
        .iter()
        .find(|x| x["container"] == mem_name && x["kind"] == "memcg_reclaim")
        .unwrap_or_else(|| panic!("no folded memcg_reclaim row for {mem_name}: {mb:?}"));
    assert_eq!(folded["pid"], 0, "{folded}");
    assert_eq!(folded["comm"], mem_name.as_str(), "{folded}");
    assert_eq!(kind(&mb, "memcg_reclaim"), kind(&m, "memcg_reclaim"));
    assert!(kind(&m, "memcg_reclaim") > 0);

    // ctxsw, runq-lat, io-lat --by container: a row per container, named by it.
    for (tool, lines) in &others_by {
        let r = summary_rows(lines, tool);
        let x = r
            .iter()
            .find(|x| x["container"] == fsync_name)
            .unwrap_or_else(|| panic!("{tool} --by container: no row for {fsync_name}: {r:?}"));
        assert_eq!(x["pid"], 0, "{tool}: {x}");
        assert!(x["processes"].as_u64() >= Some(1), "{tool}: {x}");
        assert!(
            r.iter().all(|x| x["pid"] == 0),
            "{tool}: every row folded: {r:?}"
        );
    }

    // net-rx: the overflowing socket's drops, named by the container of its owner, exactly the
    // container's own Udp: RcvbufErrors (its network namespace counts only its sockets).
    let out = podman(&["logs", &udp_name]);
    let u: Value = serde_json::from_str(out.lines().last().unwrap_or("{}")).expect(&out);
    let dropped = u["sent"].as_u64().unwrap() - u["kept"].as_u64().unwrap();
    assert!(dropped > 0, "{u}");
    assert_eq!(u["rcvbuf_errors"].as_u64(), Some(dropped), "{u}");
    let sock = net_rx
        .iter()
        .find(|v| v["type"] == "socket" && v["port"] == u["port"] && v["pid"] == udp_pid)
        .unwrap_or_else(|| panic!("net-rx: no socket row of pid {udp_pid}: {net_rx:?}"));
    assert_eq!(sock["container"], udp_name.as_str(), "{sock}");
    assert_eq!(sock["reason"], "SOCKET_RCVBUFF", "{sock}");
    assert_eq!(sock["count"].as_u64(), Some(dropped), "{sock}");
    let drop_row = net_rx
        .iter()
        .find(|v| v["type"] == "drop" && v["port"] == u["port"] && v["pid"] == udp_pid)
        .unwrap_or_else(|| panic!("net-rx: no drop row of pid {udp_pid}: {net_rx:?}"));
    assert_eq!(drop_row["container"], udp_name.as_str(), "{drop_row}");

    // numa and profile: the spinner's row is named by its container.
    for (tool, lines, section) in [("numa", &numa, "summary"), ("profile", &profile, "process")] {
        let x = lines
            .iter()
            .find(|l| l["tool"] == tool && l["type"] == section && l["pid"] == spin_pid)
            .unwrap_or_else(|| panic!("{tool}: no {section} row for the spinner {spin_pid}"));
        assert_eq!(x["container"], spin_name.as_str(), "{tool}: {x}");
    }

    // The other tools name the containers' processes too.
    for (tool, lines) in &others {
        let r = summary_rows(lines, tool);
        for (name, pid) in [(&fsync_name, fsync_pid), (&mem_name, mem_pid)] {
            let x = r.iter().find(|x| x["pid"] == pid);
            if *tool == "io-lat" && name == &mem_name && x.is_none() {
                // Buffered writes reach the disk from writeback, charged to the cgroup.
                continue;
            }
            let x = x.unwrap_or_else(|| panic!("{tool}: no row for {name} ({pid})"));
            assert_eq!(x["container"], name.as_str(), "{tool}: {x}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The workloads `tk-workload` runs in the containers (tests/workload/build.rs finds them): each
// does its work, says so in DONE, and stays alive (so /proc still names it) until END exists.

/// `ct-fsync PATH N DONE END`, `ct-write PATH MIB DONE END`, `ct-udp N DONE END` (N datagrams
/// to its own receiver, which never reads: the overflow is `SOCKET_RCVBUFF`; prints the port and
/// the container's `Udp: RcvbufErrors` increase), `ct-spin MS DONE END` (MS ms on the CPU).
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    // What must live until END: the receiver, so tracekit finds its owner when it reports.
    let mut _keep = None;
    let (done, end) = match a.as_slice() {
        ["ct-udp", n, done, end] => {
            use tracekit_tests::udp;
            let rx = udp::small_receiver();
            let port = rx.local_addr().ok()?.port();
            let before = udp::udp_snmp();
            let sent = udp::send(n.parse().ok()?, 200, port);
            let errs = udp::delta(&before, &udp::udp_snmp(), "RcvbufErrors");
            let kept = udp::drain(&rx);
            println!(
                "{}",
                serde_json::json!({"port": port, "sent": sent, "kept": kept, "rcvbuf_errors": errs})
            );
            _keep = Some(rx);
            (done, end)
        }
        ["ct-spin", ms, done, end] => {
            let t = std::time::Instant::now();
            let mut x = 0u64;
            while t.elapsed() < Duration::from_millis(ms.parse().ok()?) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            (done, end)
        }
        ["ct-fsync", path, n, done, end] => {
            let mut f = open_trunc(path);
            let fs = timed_sync(&mut f, "fsync", n.parse().ok()?);
            println!("{}", serde_json::json!({"fsync_ns": fs}));
            (done, end)
        }
        ["ct-write", path, mib, done, end] => {
            use std::io::Write;
            let mut f = open_trunc(path);
            let buf = vec![0xa5u8; 1 << 20];
            for _ in 0..mib.parse::<usize>().ok()? {
                f.write_all(&buf).ok()?;
            }
            (done, end)
        }
        _ => return None,
    };
    std::fs::write(done, "").ok()?;
    // Bounded: a test that died leaves no workload behind for long.
    for _ in 0..6000 {
        if Path::new(end).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(0)
}

/// The pid of the process whose command line holds `needle`, once one does.
fn pid_with_cmdline(needle: &str) -> u32 {
    let t = std::time::Instant::now();
    loop {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(needle) && pid != std::process::id() {
                return pid;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no process runs {needle}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn podman_exec_is_followed() {
    let (mut pod, dir, names) = made("ct-exec", &["exec"]);
    let name = names[0].clone();
    // A running container that only waits.
    start(
        &mut pod,
        &dir,
        &name,
        "while [ ! -e /gate/end ]; do sleep 0.2; done",
    );
    let gate = dir.join("gate");
    let id = podman(&["inspect", "--format", "{{.Id}}", &name]);
    let all = attached(&["fsync-lat", "--json"]);
    let by = attached(&["fsync-lat", "--json", "--by", "container"]);
    // Started before the exec: the exec'd process is no child of the container's processes.
    let one = attached(&["fsync-lat", "--json", "--container", &name]);
    let ctxsw = attached(&["ctxsw", "--json"]);
    // `podman exec` an fsync loop into it; it waits for /gate/go first.
    podman(&[
        "exec",
        "-d",
        &name,
        "sh",
        "-c",
        "while [ ! -e /gate/go ]; do sleep 0.1; done; \
         exec /tk-workload ct-fsync /data/f 200 /gate/done-exec /gate/end > /gate/exec.json",
    ]);
    let pid = pid_with_cmdline("/gate/done-exec");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroup.contains(&id),
        "runc exec joins the container's cgroup: {cgroup}"
    );
    // --container re-reads the container's processes every 0.5 s: give it a few rounds.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(gate.join("go"), "").unwrap();
    wait_file(&gate.join("done-exec"));
    let (all, by, one, ctxsw) = (
        stop_json(all),
        stop_json(by),
        stop_json(one),
        stop_json(ctxsw),
    );
    std::fs::write(gate.join("end"), "").unwrap();
    let report = std::fs::read_to_string(gate.join("exec.json")).unwrap();
    let w: Value = serde_json::from_str(report.trim()).expect(&report);
    let fsyncs = w["fsync_ns"].as_array().expect("fsync_ns").len() as u64;
    assert_eq!(fsyncs, 200);
    podman(&["wait", &name]);

    // The exec'd process's rows name the container, as podman does.
    let r = summary_rows(&all, "fsync-lat");
    let mine: Vec<&&Value> = r.iter().filter(|x| x["pid"] == pid).collect();
    assert!(!mine.is_empty(), "no row for the exec'd pid {pid}: {r:?}");
    for x in &mine {
        assert_eq!(x["container"], name.as_str(), "{x}");
        assert_eq!(x["container_id"], id.as_str(), "{x}");
        assert_eq!(x["runtime"], "podman", "{x}");
    }
    let own: u64 = mine.iter().map(|x| x["count"].as_u64().unwrap()).sum();
    assert_eq!(own, fsyncs, "the exec'd workload's own count");
    assert_eq!(container_count(&r, &name, "count"), fsyncs);
    assert_eq!(
        container_count(&summary_rows(&by, "fsync-lat"), &name, "count"),
        fsyncs
    );
    // --container NAME, started before the exec, follows it.
    let o = summary_rows(&one, "fsync-lat");
    assert!(o.iter().all(|x| x["container"] == name.as_str()), "{o:?}");
    assert_eq!(container_count(&o, &name, "count"), fsyncs, "{o:?}");
    let c = summary_rows(&ctxsw, "ctxsw");
    let x = c
        .iter()
        .find(|x| x["pid"] == pid)
        .unwrap_or_else(|| panic!("ctxsw: no row for the exec'd pid {pid}"));
    assert_eq!(x["container"], name.as_str(), "{x}");
}
