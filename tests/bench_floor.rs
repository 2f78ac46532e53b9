//! `bench-floor`, the benchmark's control: the cheapest program on a hook attaches and counts.
//! Its VM check runs in every guest kernel of `cargo xtask vm-test`.

use tracekit_tests::*;

#[test]
fn counts_every_switch_of_a_pipe_ping_pong() {
    require_root();
    vm_check().unwrap();
}

/// bench-floor: the cheapest sched_switch program attaches and counts.
pub fn vm_check() -> Result<String, String> {
    let (lines, _, modes) = tracekit_tests::vm::traced_with(
        &["bench-floor", "--hook", "sched-switch"],
        &["pingpong", "200"],
        // Run on one hook by request: doctor's other hooks for it go unattached.
        false,
    )?;
    let events = counted(&lines);
    if events < 400 {
        return Err(format!(
            "only {events} sched_switch events for 400 pipe hops"
        ));
    }
    Ok(format!("{events} events; {modes}"))
}

/// The lower-bound controls the bench compares the tools with: the wake-wait pair and the
/// receive path's four hooks attach and count what their workloads do.
#[test]
fn lower_bound_controls_attach_and_count() {
    require_root();
    for hook in [
        "wake-wait",
        "wake-wait-proc",
        "wake-wait-counters",
        "wake-wait-culprits",
        "switch-node",
    ] {
        let (lines, _, modes) = tracekit_tests::vm::traced_with(
            &["bench-floor", "--hook", hook],
            &["pingpong", "200"],
            false,
        )
        .unwrap();
        let events = counted(&lines);
        assert!(
            events >= 400,
            "{hook}: {events} switches for 400 pipe hops ({modes})"
        );
        if hook == "wake-wait-culprits" {
            for prog in ["tk_floor_wakeup_steal=", "tk_floor_wwait_cul="] {
                assert!(modes.contains(prog), "{hook}: {prog} not attached: {modes}");
            }
        }
    }
    // fsync-timed counts the calls it timed: every fsync of the workload.
    let (lines, w, modes) = tracekit_tests::vm::traced_with(
        &["bench-floor", "--hook", "fsync-timed"],
        &[
            "fsync",
            &scratch("floor").join("f").display().to_string(),
            "50",
            "0",
        ],
        false,
    )
    .unwrap();
    let events = counted(&lines);
    assert!(
        events >= 50,
        "fsync-timed: {events} timed calls for 50 fsyncs ({modes}; {w})"
    );
    for hook in ["net-rx-path", "net-rx-keyed"] {
        let mut tk = Tracer::spawn(&["bench-floor", "--hook", hook, "--json"]);
        tk.wait_attached();
        // Datagrams to a port nobody listens on: each is one kfree_skb (NO_SOCKET) on loopback.
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert_eq!(tracekit_tests::udp::send(500, 64, port), 500);
        tk.signal(libc::SIGINT);
        let (status, lines, stderr) = tk.finish(std::time::Duration::from_secs(30));
        assert!(status.success(), "{hook}: {stderr}");
        let events = counted(&lines);
        // Each drop is a kfree_skb, and its softirq and NAPI poll fire the other three hooks.
        assert!(events >= 500, "{hook}: {events} events for 500 drops");
    }
}

/// The block floor (io-lat's lower bound) times every request of O_DIRECT reads under
/// mq-deadline (insert, issue and complete all fire): its completions are at least the reads
/// /proc/diskstats counts on the device.
#[test]
fn io_split_floor_times_every_request() {
    block_floor_counts("io-split", 1);
}

/// The block floor with the submission stamp also runs on every bio: O_DIRECT 4 KiB reads are
/// one bio and one request each, so it counts at least twice the reads the device completed.
#[test]
fn io_split_submit_floor_stamps_every_bio() {
    block_floor_counts("io-split-submit", 2);
}

/// Runs the block floor `hook` over 300 O_DIRECT reads of a loop device under mq-deadline and
/// holds its count to at least `per_read` events for each read /proc/diskstats counted.
fn block_floor_counts(hook: &str, per_read: u64) {
    require_root();
    let lo = tracekit_tests::block::LoopDev::new(&format!("floor-{hook}"));
    lo.set("scheduler", "mq-deadline");
    let mut tk = Tracer::spawn(&["bench-floor", "--hook", hook, "--json"]);
    tk.wait_attached();
    let (reads0, _) = lo.diskstats();
    tracekit_tests::block::read_direct(&lo.dev, 300);
    let (reads1, _) = lo.diskstats();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(std::time::Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let reads = reads1 - reads0;
    assert!(
        reads >= 300,
        "diskstats: {reads} reads for 300 O_DIRECT reads"
    );
    let events = counted(&lines);
    assert!(
        events >= per_read * reads,
        "{hook} counted {events} events, the device completed {reads} reads ({per_read} each)"
    );
}

/// The events a bench-floor run counted (its stats lines).
fn counted(lines: &[serde_json::Value]) -> u64 {
    lines
        .iter()
        .filter(|l| l["type"] == "stats")
        .filter_map(|l| l["events"].as_u64())
        .sum()
}
