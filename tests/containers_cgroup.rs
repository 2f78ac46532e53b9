//! Root test for container attribution of a cgroup no runtime made: a process in
//! `/tk-unknown-<pid>/app1` (made in the v1 memory hierarchy and the v2 one, as this host mounts
//! them) is shown with that path as its container (runtime `cgroup`) by fsync-lat and ctxsw,
//! `--by container` folds it, and `--container PATH` keeps only it; the cgroup tracekit itself
//! runs in (of no runtime's layout) is the host's. Unit tests on fixture paths
//! (which layouts stay the host) are in `cli/src/host/container.rs`.

use std::{path::PathBuf, process::Command, time::Duration};

use serde_json::Value;
use tracekit_tests::*;

/// The mount points of the v1 memory hierarchy and of the v2 hierarchy, as this host has them.
fn cgroup_mounts() -> (Option<PathBuf>, Option<PathBuf>) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let (mut v1, mut v2) = (None, None);
    for l in info.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let mp = pre.split_whitespace().nth(4).map(PathBuf::from);
        let mut post = post.split_whitespace();
        let fstype = post.next().unwrap_or("");
        let opts = post.nth(1).unwrap_or("");
        if fstype == "cgroup2" && v2.is_none() {
            v2 = mp;
        } else if fstype == "cgroup" && opts.split(',').any(|o| o == "memory") {
            v1 = mp;
        }
    }
    (v1, v2)
}

/// A cgroup of no runtime's layout (`/tk-unknown-<pid>/app1`), made in the v1 memory hierarchy
/// and in the v2 one (whichever this host mounts), removed on drop.
struct Unknown {
    rel: String,
    dirs: Vec<PathBuf>,
}

impl Unknown {
    fn new() -> Unknown {
        let rel = format!("/tk-unknown-{}/app1", std::process::id());
        let (v1, v2) = cgroup_mounts();
        let dirs: Vec<PathBuf> = [v1, v2]
            .into_iter()
            .flatten()
            .map(|m| m.join(&rel[1..]))
            .collect();
        assert!(!dirs.is_empty(), "no cgroup hierarchy mounted");
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        }
        Unknown { rel, dirs }
    }

    /// A shell line that moves itself into every hierarchy's cgroup.
    fn enter(&self) -> String {
        self.dirs
            .iter()
            .map(|d| format!("echo $$ > {}/cgroup.procs; ", d.display()))
            .collect()
    }
}

impl Drop for Unknown {
    fn drop(&mut self) {
        // The workload may still be on its way out (see `Release`).
        for _ in 0..100 {
            for d in &self.dirs {
                let _ = std::fs::remove_dir(d);
                let _ = std::fs::remove_dir(d.parent().unwrap());
            }
            if self.dirs.iter().all(|d| !d.exists()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Gate files written on drop, so a workload waiting on them ends even when the test fails.
struct Release(Vec<PathBuf>);

impl Drop for Release {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::write(f, "");
        }
    }
}

#[test]
fn an_unknown_cgroup_layout_is_named_by_its_path() {
    require_root();
    let cg = Unknown::new();
    let dir = scratch("ct-unknown");
    let (done, end) = (dir.join("done"), dir.join("end"));
    let fsync_all = attached(&["fsync-lat", "--json"]);
    let fsync_by = attached(&["fsync-lat", "--json", "--by", "container"]);
    let ctxsw = attached(&["ctxsw", "--json"]);
    // The workload moves itself into the cgroup, waits for GO, fsyncs 150 times and stays
    // alive (so /proc names it) until END.
    let go = dir.join("go");
    let _release = Release(vec![go.clone(), end.clone()]);
    let w = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{}while [ ! -e {} ]; do sleep 0.1; done; exec {} ct-fsync {} 150 {} {}",
            cg.enter(),
            go.display(),
            workload_bin().display(),
            dir.join("f").display(),
            done.display(),
            end.display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = w.id();
    // --container by the path, started once the workload is in the cgroup.
    let t = std::time::Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&cg.rel))
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "pid {pid} never joined"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let one = attached(&["fsync-lat", "--json", "--container", &cg.rel]);
    let ctxsw_one = attached(&["ctxsw", "--json", "--container", &cg.rel]);
    std::fs::write(&go, "").unwrap();
    wait_file(&done);
    let (all, by, ctxsw) = (stop_json(fsync_all), stop_json(fsync_by), stop_json(ctxsw));
    let (one, ctxsw_one) = (stop_json(one), stop_json(ctxsw_one));
    // doctor says which layouts it recognised: the workload's cgroup, of no runtime's layout,
    // is a container named by its path, holding the workload alone; pid 1 is the host's.
    let out = Command::new(tracekit_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let sys = lines
        .iter()
        .find(|l| l["type"] == "system")
        .unwrap_or_else(|| panic!("doctor: no system line: {lines:?}"));
    let census = &sys["containers"];
    assert!(
        census["by_path"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!([cg.rel, 1])),
        "{census}"
    );
    assert!(census["host_processes"].as_u64() >= Some(1), "{census}");
    std::fs::write(&end, "").unwrap();
    let out = w.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).expect("workload JSON");
    let fsyncs = report["fsync_ns"].as_array().unwrap().len() as u64;
    assert_eq!(fsyncs, 150);

    // Every row of the workload names the cgroup, runtime "cgroup"; the count is its own.
    let r = summary_rows(&all, "fsync-lat");
    let mine: Vec<&&Value> = r.iter().filter(|x| x["pid"] == pid).collect();
    assert!(!mine.is_empty(), "no row for pid {pid}: {r:?}");
    for x in &mine {
        assert_eq!(x["container"], cg.rel.as_str(), "{x}");
        assert_eq!(x["container_id"], cg.rel.as_str(), "{x}");
        assert_eq!(x["runtime"], "cgroup", "{x}");
    }
    assert_eq!(container_count(&r, &cg.rel, "count"), fsyncs);
    // --by container: one row for the cgroup, the sum of its processes.
    let b = summary_rows(&by, "fsync-lat");
    let folded: Vec<&&Value> = b.iter().filter(|x| x["container"] == cg.rel).collect();
    assert!(!folded.is_empty(), "{b:?}");
    assert!(
        folded
            .iter()
            .all(|x| x["pid"] == 0 && x["processes"].as_u64() >= Some(1)),
        "{folded:?}"
    );
    assert_eq!(container_count(&b, &cg.rel, "count"), fsyncs);
    // --container PATH: only the cgroup's process, with its exact count.
    let o = summary_rows(&one, "fsync-lat");
    assert!(!o.is_empty() && o.iter().all(|x| x["pid"] == pid), "{o:?}");
    assert_eq!(container_count(&o, &cg.rel, "count"), fsyncs);
    // ctxsw names it too, and --container keeps only the cgroup's processes (the workload and
    // the `sleep`s its shell ran while waiting).
    let c = summary_rows(&ctxsw, "ctxsw");
    let x = c
        .iter()
        .find(|x| x["pid"] == pid)
        .unwrap_or_else(|| panic!("ctxsw: no row for {pid}: {c:?}"));
    assert_eq!(x["container"], cg.rel.as_str(), "{x}");
    assert_eq!(x["runtime"], "cgroup", "{x}");
    let c1 = summary_rows(&ctxsw_one, "ctxsw");
    assert!(
        c1.iter().any(|x| x["pid"] == pid),
        "ctxsw --container: {c1:?}"
    );
    // A process gone before tracekit named it (one of the shell's 0.1 s `sleep`s, on a busy
    // node: /proc/<pid>/cgroup read after it was reaped) has no container to read, and none
    // is guessed; every one that lives is named.
    let alive = |x: &Value| {
        x["pid"]
            .as_u64()
            .is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    assert!(
        c1.iter()
            .all(|x| x["container"] == cg.rel.as_str() || (x["pid"] != pid && !alive(x))),
        "{c1:?}"
    );
    // The host's own processes stay the host: pid 1 (the root cgroup) has no container.
    let host_rows = c.iter().filter(|x| x["pid"] == 1);
    for x in host_rows {
        assert!(x.get("container").is_none(), "{x}");
    }
    // So do the processes that share tracekit's own cgroup of an unknown layout (a sandbox's
    // or a login session's: this test and tracekit, its child): the host, not a container.
    let me = std::process::id();
    let own: Vec<&&Value> = c.iter().filter(|x| x["pid"] == me).collect();
    assert!(!own.is_empty(), "ctxsw: no row for the test itself ({me})");
    for x in own {
        assert!(x.get("container").is_none(), "{x}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
