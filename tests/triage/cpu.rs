//! CPU incidents under triage: a context-switch storm, sleepers beside hogs (at nice 0, in
//! equal-weight cgroups, starved), and a merely busy node (one saturation finding, no victim).

use super::*;

#[test]
fn context_switch_storm_ranks_first() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-ctxsw-innocents", 14_000);
    let mut report = Value::Null;
    let (f, _) = triage(6, &[], || report = run_workload(&["pingpong", "150000"]));
    let storm = f
        .iter()
        .find(|x| x["cause"] == "ctxsw-storm")
        .unwrap_or_else(|| panic!("no ctxsw-storm finding: {:#?}", brief(&f)));
    assert_eq!(storm["rank"], 1, "{:#?}", brief(&f));
    let procs: Vec<u64> = report["procs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_u64()).collect())
        .unwrap_or_default();
    let pid = storm["pid"].as_u64().unwrap();
    assert!(
        procs.contains(&pid) || report["pid"] == pid,
        "the storm names {pid}, the ping-pong is {report}"
    );
    innocents.assert_named_only_for_what_they_felt(&f, Some(&f[0]));
}

/// A latency-sensitive process that sleeps 1 ms at a time, pinned to the CPU where two hogs
/// spin: it is the victim (runq-delay, ranked first) and a hog is the culprit.
#[test]
fn starved_sleeper_ranks_first_with_the_hog_as_culprit() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    // Two spinners at nice -10 on the last CPU: CFS then gives the sleeper's wakeups no
    // precedence over them, as a batch job at a higher priority would.
    let hogs = niced_hogs("7000");
    std::thread::sleep(Duration::from_millis(300));
    sleeper_ranks_first(&cpu, hogs);
}

/// Runs the 1 ms sleeper on `cpu` for 5 s under a 6 s triage beside `hogs` (its own clock is
/// printed), and checks that it ranks first as a run-queue victim with a hog as culprit: the
/// findings and the hogs' pids.
fn sleeper_ranks_first(cpu: &str, hogs: Child) -> (Vec<Value>, Vec<u64>) {
    let mut victim = Value::Null;
    let (f, _) = triage(6, &[], || {
        victim = run_workload(&["triage-sleeper", cpu, "5000"]);
    });
    let hog_pids = hog_pids(hogs);
    eprintln!("sleeper's own clock: {victim}");
    eprintln!("findings: {:#?}", brief(&f));
    let first = &f[0];
    assert_eq!(first["cause"], "runq-delay", "{:#?}", brief(&f));
    assert_eq!(first["pid"], victim["pid"], "{:#?}", brief(&f));
    let culprit = first["culprit_pid"].as_u64().unwrap_or(0);
    assert!(
        hog_pids.contains(&culprit),
        "culprit {culprit}, hogs {hog_pids:?}: {first}"
    );
    (f, hog_pids)
}

/// The field report's case: a 1 ms sleeper pinned beside two CPU hogs at the default nice
/// level, with two innocent busy processes. It loses only a few percent of its time, but its
/// wakeups wait milliseconds behind a hog: it ranks first, a hog as culprit, and no hog is a
/// victim (the hogs are the saturation finding's culprits). Its own clock is printed beside.
#[test]
fn sleeper_beside_hogs_at_nice_0_ranks_first_among_innocents() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let _innocents = Innocents::start("triage-nice0", 9_000);
    let hogs = hogs_at("8000", 0);
    std::thread::sleep(Duration::from_millis(300));
    let (f, hog_pids) = sleeper_ranks_first(&cpu, hogs);
    let first = &f[0];
    // What it felt, in the finding: late waits, and a p99.9 its own clock saw as overshoot.
    assert!(
        first["evidence"]["wake_late"].as_u64().unwrap_or(0) > 0,
        "{first}"
    );
    for x in &f {
        if x["cause"] == "runq-delay" {
            let pid = x["pid"].as_u64().unwrap_or(0);
            assert!(!hog_pids.contains(&pid), "a hog as a victim: {x}");
        }
    }
    let sat: Vec<&Value> = f.iter().filter(|x| x["cause"] == "cpu-saturated").collect();
    assert_eq!(sat.len(), 1, "{:#?}", brief(&f));
    assert!(
        hog_pids.contains(&sat[0]["culprit_pid"].as_u64().unwrap_or(0)),
        "{}",
        sat[0]
    );
}

/// Two cgroups of the CPU controller with equal weights (v1 `cpu.shares` 1024, or v2
/// `cpu.weight` 100, the defaults, written anyway), removed on drop, and on v2 the controller
/// enabled at the root for the test if it was not (put back on drop).
struct EqualCpuGroups {
    dirs: Vec<std::path::PathBuf>,
    enabled_cpu: Option<std::path::PathBuf>,
}

impl EqualCpuGroups {
    fn new(names: &[&str]) -> EqualCpuGroups {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let (mut v1, mut v2) = (None, None);
        for l in info.lines() {
            let Some((pre, post)) = l.split_once(" - ") else {
                continue;
            };
            let mp = pre.split_whitespace().nth(4).map(std::path::PathBuf::from);
            let mut post = post.split_whitespace();
            let fstype = post.next().unwrap_or("");
            let opts = post.nth(1).unwrap_or("");
            if fstype == "cgroup" && opts.split(',').any(|o| o == "cpu") {
                v1 = mp;
            } else if fstype == "cgroup2" && v2.is_none() {
                v2 = mp;
            }
        }
        let mut enabled_cpu = None;
        let (root, file, weight) = match (v1, v2) {
            (Some(r), _) => (r, "cpu.shares", "1024"),
            (None, Some(r)) => {
                let ctl = r.join("cgroup.subtree_control");
                let on = std::fs::read_to_string(&ctl).unwrap_or_default();
                if !on.split_whitespace().any(|c| c == "cpu") {
                    std::fs::write(&ctl, "+cpu").expect("enable the cpu controller");
                    enabled_cpu = Some(ctl);
                }
                (r, "cpu.weight", "100")
            }
            (None, None) => panic!("no cgroup hierarchy with the cpu controller"),
        };
        let me = std::process::id();
        let dirs: Vec<std::path::PathBuf> = names
            .iter()
            .map(|n| root.join(format!("tk-{n}-{me}")))
            .collect();
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            std::fs::write(d.join(file), weight)
                .unwrap_or_else(|e| panic!("{}/{file}: {e}", d.display()));
        }
        EqualCpuGroups { dirs, enabled_cpu }
    }

    /// `tk-workload ARGS` started inside group `i` (a shell moves itself in, then execs).
    fn spawn(&self, i: usize, args: &[&str]) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} {}",
                self.dirs[i].display(),
                workload_bin().display(),
                args.join(" ")
            ))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a workload in a cgroup")
    }
}

impl Drop for EqualCpuGroups {
    fn drop(&mut self) {
        for _ in 0..100 {
            for d in &self.dirs {
                let _ = std::fs::remove_dir(d);
            }
            if self.dirs.iter().all(|d| !d.exists()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(ctl) = &self.enabled_cpu {
            let _ = std::fs::write(ctl, "-cpu");
        }
    }
}

/// #26's second shape of the field case: the sleeper and the hogs at nice 0, each in a cgroup
/// of its own with equal CPU weights (as two containers or two systemd services get by
/// default), so the scheduler shares the CPU between the groups before the tasks. What the
/// sleeper felt (its own clock) decides what triage must say. Here its sleeps overshot by
/// p99 0.11 ms but up to 3.9 ms: late in the tail, and triage said "1 in 353 wakeups waited
/// over 1.00ms, p99.9 3.54ms, max 3.95ms", first, behind the hogs; that is near the harm
/// model's threshold, so the test judges by the sleeper's own late sleeps (below). No hog is
/// a victim either way.
#[test]
fn sleeper_beside_hogs_in_equal_weight_cgroups_is_judged_by_what_it_felt() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let groups = EqualCpuGroups::new(&["sleeper", "hogs"]);
    let innocents = Innocents::start("triage-cgroups", 9_000);
    let hogs = groups.spawn(1, &["spin", "8000"]);
    std::thread::sleep(Duration::from_millis(300));
    let mut victim = Value::Null;
    let (f, _) = triage(6, &[], || {
        let out = groups
            .spawn(0, &["triage-sleeper", &cpu, "5000"])
            .wait_with_output()
            .unwrap();
        victim = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("the sleeper failed ({e}): {out:?}"));
    });
    let hog_pids = hog_pids(hogs);
    eprintln!("sleeper's own clock: {victim}");
    eprintln!("findings: {:#?}", brief(&f));
    // Judged by the kernel's account of its run-queue waits around each sleep (run_delay) in
    // the harm model's terms (report::harm: at least 5 late waits, 1 in 1000, 5 ms/s of
    // excess), with a factor 2 of margin: clearly hurt → above every finding but the
    // innocents', its culprit none of them, no wait longer than its latest sleep; never 1 ms
    // late → no victim; in between either (fresh-clone runs here: max 4.0 ms late both times,
    // once named with 7.45 ms/s of excess, once not). Not by its oversleeping alone: a guest's
    // vCPU preempted by the host oversleeps with no run-queue wait (17.6 ms once, 11 late
    // sleeps, where triage rightly saw no victim).
    let max = victim["overshoot_max_ns"]
        .as_u64()
        .expect("overshoot_max_ns");
    let late = victim["runq_late_1ms"].as_u64().expect("runq_late_1ms");
    let excess_per_s = victim["runq_excess_ns"].as_u64().unwrap_or(0) / 5;
    let wakeups = victim["wakeups"].as_u64().unwrap_or(0);
    let named = |x: &Value| x["cause"] == "runq-delay" && x["pid"] == victim["pid"];
    if late >= 10 && late * 500 >= wakeups && excess_per_s >= 10_000_000 {
        // Ranked above the saturation and every hog; first on a quiet host. On a busy one the
        // innocents may be hurt more by the host's own load and rightly rank above it (a busy
        // loop beside the test: the 3 ms burster at 418 ms/s of excess, the sleeper 10.9).
        let at = f.iter().position(named).unwrap_or_else(|| {
            panic!(
                "{late} sleeps late, {excess_per_s} ns/s of excess, no finding: {:#?}",
                brief(&f)
            )
        });
        let innocents = innocents.pids();
        for x in &f[..at] {
            let pid = x["pid"].as_u64().unwrap_or(0);
            assert!(
                x["cause"] != "cpu-saturated" && innocents.contains(&pid),
                "ranked below {x}: {:#?}",
                brief(&f)
            );
        }
        let mine = &f[at];
        let culprit = mine["culprit_pid"].as_u64().unwrap_or(0);
        assert!(
            !innocents.contains(&culprit) && culprit != victim["pid"].as_u64().unwrap_or(0),
            "culprit {culprit}, hogs {hog_pids:?}: {mine}"
        );
        // Each wait is inside that sleep's overshoot, or the wait before its loop (the new
        // task's first run); the histogram's bucket bound adds < 10 %.
        let start = victim["start_run_delay_ns"].as_u64().unwrap_or(0);
        let bound = max.max(start);
        let wait_max = mine["evidence"]["wake_max_ns"].as_u64().unwrap_or(u64::MAX);
        assert!(
            wait_max <= bound + bound / 10 + 100_000,
            "a wait of {wait_max} ns, but no sleep was more than {max} ns late and it waited {start} ns before its loop: {mine}"
        );
    } else if late == 0 {
        assert!(
            !f.iter().any(named),
            "never waited 1 ms for a CPU by the kernel's run_delay (at most {} ns), yet a victim: {:#?}",
            victim["runq_max_ns"],
            brief(&f)
        );
    }
    for x in &f {
        if x["cause"] == "runq-delay" {
            let pid = x["pid"].as_u64().unwrap_or(0);
            assert!(!hog_pids.contains(&pid), "a hog as a victim: {x}");
        }
    }
}

/// Two CPU hogs alone on one CPU: a busy node, nothing staged latency-sensitive hurt. One
/// saturation finding (a hog its culprit, the CPU pressure in it), no hog a victim.
#[test]
fn a_merely_busy_node_is_one_saturation_finding_and_no_victim() {
    require_root();
    let _s = serial();
    let hogs = hogs_at("6500", 0);
    std::thread::sleep(Duration::from_millis(300));
    let (f, _) = triage(5, &[], || {});
    let hog_pids = hog_pids(hogs);
    eprintln!("findings: {:#?}", brief(&f));
    let sat: Vec<&Value> = f.iter().filter(|x| x["cause"] == "cpu-saturated").collect();
    assert_eq!(sat.len(), 1, "{:#?}", brief(&f));
    assert!(
        hog_pids.contains(&sat[0]["culprit_pid"].as_u64().unwrap_or(0)),
        "{}",
        sat[0]
    );
    // No hog is a victim. The node's other latency-sensitive work may be, truly: this test's
    // own process, woken often, waited 10.5 ms/s late behind the pinned hogs beside two
    // nice-19 spinners.
    assert!(
        f.iter()
            .all(|x| x["cause"] != "runq-delay"
                || !hog_pids.contains(&x["pid"].as_u64().unwrap_or(0))),
        "a hog as a victim on a merely busy node: {:#?}",
        brief(&f)
    );
    assert!(
        f.iter().all(|x| x["cause"] != "pressure"),
        "the CPU pressure is the saturation's, not a finding of its own: {:#?}",
        brief(&f)
    );
}
