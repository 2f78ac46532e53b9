//! `numa-place`, the workload of numa's tests and VM check: memory on one node, CPU time on
//! another (tk-workload dispatches here through `numa::workload`).

use std::time::{Duration, Instant};

use tracekit::host::numa;
use tracekit_tests::anon_map;

/// `numa-place MODE CPU_NODE MEM_NODE MIB SECS`: MIB of anonymous memory (no huge pages) on
/// MEM_NODE, then SECS of reading and writing it from CPU_NODE's CPUs. MODE `bind`: the memory
/// is bound to MEM_NODE (`mbind`, MPOL_BIND) and touched from CPU_NODE; `first-touch`: it is
/// touched while pinned to MEM_NODE, then the process moves to CPU_NODE (for NUMA balancing to
/// migrate). Prints its pid, its own numa_maps per node and `numa_pages_migrated`, then sleeps
/// until stdin closes.
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["numa-place", mode, cpu, mem, mib, secs] => Some(place(
            *mode == "bind",
            cpu.parse().ok()?,
            mem.parse().ok()?,
            mib.parse().ok()?,
            secs.parse().ok()?,
        )),
        _ => None,
    }
}

/// Pins the calling process to node `n`'s CPUs.
fn pin_node(t: &numa::Topology, n: u32) {
    let node = t.nodes.iter().find(|x| x.id == n).expect("no such node");
    // SAFETY: cpu_set_t is plain data; we set the node's CPUs and pin ourselves.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in &node.cpus {
            libc::CPU_SET(c as usize, &mut set);
        }
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(rc, 0, "sched_setaffinity to node {n}");
    }
}

fn place(bind: bool, cpu_node: u32, mem_node: u32, mib: usize, secs: u64) -> i32 {
    const PAGE: usize = 4096;
    let t = numa::Topology::read();
    let len = mib << 20;
    let p = anon_map(len);
    // Small pages only: the kernel counts huge page migrations differently across versions.
    // SAFETY: advice on our own mapping.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    if bind {
        let mask: u64 = 1 << mem_node;
        // SAFETY: mbind(addr, len, MPOL_BIND, &mask, maxnode, 0) on our own mapping; maxnode
        // counts one more than the bits the kernel reads.
        let rc = unsafe { libc::syscall(libc::SYS_mbind, p, len, 2, &mask as *const u64, 65, 0) };
        assert_eq!(rc, 0, "mbind: {}", std::io::Error::last_os_error());
        pin_node(&t, cpu_node);
    } else {
        pin_node(&t, mem_node);
    }
    let mem = p as *mut u8;
    let touch = |round: u8| {
        for off in (0..len).step_by(PAGE) {
            // SAFETY: within our mapping.
            unsafe { std::ptr::write_volatile(mem.add(off), round) };
        }
    };
    touch(1);
    pin_node(&t, cpu_node);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut round = 2u8;
    let mut sum = 0u64;
    while Instant::now() < end {
        for off in (0..len).step_by(PAGE / 4) {
            // SAFETY: within our mapping.
            sum += unsafe { std::ptr::read_volatile(mem.add(off)) } as u64;
        }
        touch(round);
        round = round.wrapping_add(1);
    }
    let me = std::process::id();
    let placement = numa::placement_of(me).expect("own numa_maps");
    let width = t.nodes.iter().map(|n| n.id as usize + 1).max().unwrap_or(1);
    let by_node: Vec<u64> = (0..width as u32)
        .map(|n| placement.kib_by_node.get(&n).copied().unwrap_or(0))
        .collect();
    let report = serde_json::json!({
        "pid": me,
        "mem_kib_by_node": by_node,
        "region_kib": len / 1024,
        "pages_migrated_life": numa::task_numa_of(me, me).map(|t| t.pages_migrated),
        "checksum": sum,
    });
    println!("{report}");
    use std::io::{Read, Write};
    let _ = std::io::stdout().flush();
    // Stay alive, asleep, until the test is done reading /proc about us.
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    0
}
