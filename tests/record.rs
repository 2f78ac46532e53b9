//! Root tests for `tracekit record` and `tracekit compare`: record an fsync workload on tmpfs
//! (where fsync has nothing to write: a few microseconds), record it again on the work tree's
//! disk (milliseconds): compare must call the latency change significant and worse, with the
//! right sign; two recordings of the same workload must show no significant change; and the
//! recorded fsync count must equal the workload's own. (Bigger writes per fsync on the disk were
//! tried first: on a disk shared with other builders their medians overlapped.)

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracekit_tests::*;

/// `tk-workload fsync-paced PATH MS KIB`: writes KIB KiB at the start of PATH then fsyncs, again
/// and again for MS milliseconds; prints its pid and how many fsyncs it made.
pub fn workload(args: &[String]) -> Option<i32> {
    if args.first().map(String::as_str) != Some("fsync-paced") || args.len() != 4 {
        return None;
    }
    let (ms, kib): (u64, usize) = (args[2].parse().ok()?, args[3].parse().ok()?);
    let mut f = open_trunc(&args[1]);
    let buf = vec![0x5au8; kib << 10];
    let end = Instant::now() + Duration::from_millis(ms);
    let mut n = 0u64;
    while Instant::now() < end {
        // Rewritten in place: the file never grows (on tmpfs it is memory).
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).expect("seek");
        std::io::Write::write_all(&mut f, &buf).expect("write");
        f.sync_all().expect("fsync");
        n += 1;
    }
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "fsyncs": n})
    );
    Some(0)
}

/// Records `tk-workload fsync-paced` on `file` with `kib` per fsync for 3 s in 250 ms
/// intervals; returns the workload's report.
fn record(out: &Path, file: &Path, kib: u32) -> Value {
    let tk = Tracer::spawn(&[
        "record",
        "--tools",
        "fsync-lat",
        "--duration",
        "60s",
        "--interval",
        "250ms",
        "--output",
        out.to_str().unwrap(),
    ]);
    // Attached once the header line is in the file.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(out).is_ok_and(|s| s.contains('\n')) {
        assert!(Instant::now() < deadline, "no header in {}", out.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let w = run_workload(&[
        "fsync-paced",
        file.to_str().unwrap(),
        "3000",
        &kib.to_string(),
    ]);
    tk.signal(libc::SIGINT);
    let (status, _, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("Recorded "), "{stderr}");
    w
}

fn lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn compare(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(tracekit_bin())
        .arg("compare")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `change` line of the workload's fsync `stat` latency.
fn fsync_line<'a>(changes: &'a [Value], stat: &str) -> &'a Value {
    changes
        .iter()
        .find(|c| {
            c["type"] == "change"
                && c["metric"] == format!("{stat} fsync latency")
                && c["subject"].as_str().is_some_and(|s| {
                    // Keys sit between the table and the syscall: the container, when the
                    // test runs inside a cgroup of its own (`runtime=cgroup` on this host).
                    s.starts_with("tk-workload [fsync-lat summary ")
                        && s.ends_with(" syscall=fsync]")
                })
        })
        .unwrap_or_else(|| panic!("no {stat} fsync line in {changes:?}"))
}

fn json_of(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn compare_finds_slower_fsyncs_and_not_noise() {
    require_root();
    let dir = scratch("record");
    let disk = dir.join("data");
    let shm = PathBuf::from(format!("/dev/shm/tk-record-{}", std::process::id()));
    let p = |n: &str| -> PathBuf { dir.join(n) };
    let (a1, a2, b) = (p("a1.tkr"), p("a2.tkr"), p("b.tkr"));
    let w1 = record(&a1, &shm, 4);
    record(&a2, &shm, 4);
    record(&b, &disk, 4);
    let _ = std::fs::remove_file(&shm);

    // The recorded count is the workload's own.
    let rec = lines(&a1);
    assert_eq!(rec[0]["format"], "tracekit-record");
    assert_eq!(rec[0]["version"], 1);
    assert!(rec[0]["facts"]["sysctl:vm.swappiness"].is_string());
    let pid = w1["pid"].as_u64().unwrap();
    let counted: u64 = rec
        .iter()
        .filter(|l| l["type"] == "row" && l["row"]["pid"] == pid && l["row"]["syscall"] == "fsync")
        .map(|l| {
            let n = l["row"]["count"].as_u64().unwrap();
            assert_eq!(
                l["dists"]["fsync"]["count"], n,
                "histogram holds every call"
            );
            n
        })
        .sum();
    assert_eq!(counted, w1["fsyncs"].as_u64().unwrap(), "fsync count");
    let nodes = rec.iter().filter(|l| l["type"] == "node").count();
    assert!(nodes >= 12, "{nodes} node lines for 3 s of 250 ms");
    assert!(rec
        .iter()
        .filter(|l| l["type"] == "node")
        .all(|l| l["cpu_idle_pct"].is_number() && l["ctxsw_per_s"].is_number()));
    assert_eq!(rec.last().unwrap()["type"], "end");

    // Bigger writes per fsync: slower, significantly, and worse; exit 7 on request.
    let (code, out, err) = compare(&[
        a1.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
        "--fail-on-regression",
    ]);
    let ch = json_of(&out);
    let l = fsync_line(&ch, "p50");
    assert_eq!(code, 7, "{err}; p50 fsync line: {l}");
    assert!(err.contains("significant regression"), "{err}");
    assert!(l["change_pct"].as_f64().unwrap() > 100.0, "{l}");
    assert_eq!(l["significant"], true, "{l}");
    assert_eq!(l["verdict"], "worse", "{l}");
    // The other way round it is better.
    let (code, out, err) = compare(&[b.to_str().unwrap(), a1.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let ch = json_of(&out);
    let l = fsync_line(&ch, "p50");
    assert!(l["change_pct"].as_f64().unwrap() < -50.0, "{l}");
    assert_eq!(l["verdict"], "better", "{l}");

    // The same workload twice: no significant change in its median.
    let (code, out, err) = compare(&[
        a1.to_str().unwrap(),
        a2.to_str().unwrap(),
        "--json",
        "--fail-on-regression",
    ]);
    let ch = json_of(&out);
    let l = fsync_line(&ch, "p50");
    assert_eq!(l["verdict"], "no significant change", "{l}");
    assert!(code == 0 || code == 7, "{err}");

    // Text report and the HTML page.
    let page = dir.join("report.html");
    let (code, text, err) = compare(&[
        a1.to_str().unwrap(),
        b.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("fsync latency of tk-workload"), "{text}");
    assert!(text.starts_with("tracekit compare: "), "{text}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.matches("<svg").count() >= 2, "plots drawn");
    for outside in ["<script", "src=", "href=", "url(", "@import"] {
        assert!(!html.contains(outside), "self-contained: {outside}");
    }
    check_page_renders(&page, &dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// Renders the page in headless chromium (Debian package `chromium`) and checks the screenshot
/// holds more than a blank page's.
fn check_page_renders(page: &Path, dir: &Path) {
    let shot = |url: &str, png: &Path| {
        let profile = dir.join(format!(
            "chromium-{}",
            png.file_stem().unwrap().to_string_lossy()
        ));
        let out = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--window-size=1200,2000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--screenshot={}", png.display()))
            .arg(url)
            .output()
            .expect("chromium is installed (Debian package chromium)");
        assert!(
            png.exists(),
            "no screenshot: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::metadata(png).unwrap().len()
    };
    let blank = shot("about:blank", &dir.join("blank.png"));
    let ours = shot(&format!("file://{}", page.display()), &dir.join("page.png"));
    assert!(
        ours > blank * 4,
        "page screenshot {ours} bytes vs blank {blank}: nothing drawn?"
    );
}
