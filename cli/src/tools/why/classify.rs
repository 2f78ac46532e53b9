//! What an off-CPU interval was, from the kernel stack the thread blocked in: storage, memory,
//! a lock or another thread, the network, a sleep on purpose, or another wait named by its
//! kernel function. Markers are kernel function names (stable across 5.10–6.18 where named
//! below; a kernel that renamed one falls back to `other` with the wait function shown, never
//! to a wrong part).

use serde::Serialize;

/// The parts of a thread's wall-clock time, in the order they are reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    Running,
    Runnable,
    Storage,
    Memory,
    Lock,
    Network,
    Sleep,
    Other,
}

impl Part {
    pub const ALL: [Part; 8] = [
        Part::Running,
        Part::Runnable,
        Part::Storage,
        Part::Memory,
        Part::Lock,
        Part::Network,
        Part::Sleep,
        Part::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Running => "running",
            Part::Runnable => "runnable",
            Part::Storage => "storage",
            Part::Memory => "memory",
            Part::Lock => "lock",
            Part::Network => "network",
            Part::Sleep => "sleep",
            Part::Other => "other",
        }
    }

    /// What the part means in a sentence ("blocked in storage").
    pub fn phrase(self) -> &'static str {
        match self {
            Part::Running => "running on a CPU",
            Part::Runnable => "runnable, waiting for a CPU",
            Part::Storage => "blocked in storage",
            Part::Memory => "blocked in memory management",
            Part::Lock => "blocked on a lock or another thread",
            Part::Network => "waiting on the network",
            Part::Sleep => "sleeping on purpose",
            Part::Other => "blocked in another wait",
        }
    }

    /// One letter for the bar of the text output.
    pub fn glyph(self) -> char {
        match self {
            Part::Running => '#',
            Part::Runnable => 'q',
            Part::Storage => 'S',
            Part::Memory => 'M',
            Part::Lock => 'L',
            Part::Network => 'n',
            Part::Sleep => '.',
            Part::Other => '?',
        }
    }

    /// Time the thread loses to someone or something else (a finding's material). Running is
    /// its own work, a network wait is its peer's pace, a sleep is on purpose; `other` is not
    /// known to be harm.
    pub fn harmful(self) -> bool {
        matches!(
            self,
            Part::Runnable | Part::Storage | Part::Memory | Part::Lock
        )
    }
}

/// A blocked interval's part and what in it (`fsync`, `direct reclaim`, `futex`, or the kernel
/// wait function for `other`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    pub part: Part,
    pub what: String,
}

impl Class {
    fn of(part: Part, what: &str) -> Class {
        Class {
            part,
            what: what.to_string(),
        }
    }
}

/// Frames of every wait that say nothing about what was waited for.
fn generic(f: &str) -> bool {
    f.starts_with("schedule")
        || f.starts_with("__schedule")
        || f.starts_with("io_schedule")
        || f.starts_with("preempt_schedule")
        || f.starts_with("bpf_")
        || f.starts_with("__bpf_")
        || f.starts_with("__traceiter_")
        || f.starts_with("trace_")
        || f.starts_with("__traceiter")
        || f.starts_with("do_syscall")
        || f.starts_with("entry_SYSCALL")
        || f.starts_with("__x64_sys_")
        || f.starts_with("__se_sys_")
        || f.starts_with("__do_sys_")
        || f.starts_with("x64_sys_call")
        || matches!(f, "finish_task_switch" | "context_switch")
        || f.starts_with("finish_task_switch")
}

/// (marker prefix, what) per part, checked memory first (reclaim waits on I/O, swap-in reads
/// a disk), then storage, lock, network, sleep. A marker matches a frame that starts with it.
/// A memory cgroup's reclaim anywhere on the stack names the wait (its throttles and I/O waits
/// are the cgroup's limit at work).
const MEMCG: &[(&str, &str)] = &[
    ("try_to_free_mem_cgroup_pages", "memcg reclaim"),
    ("mem_cgroup_handle_over_high", "memcg reclaim"),
    ("reclaim_high", "memcg reclaim"),
    ("try_charge_memcg", "memcg reclaim"),
];

const MEMORY: &[(&str, &str)] = &[
    ("try_to_compact_pages", "compaction"),
    ("__alloc_pages_direct_compact", "compaction"),
    ("compact_zone", "compaction"),
    ("try_to_free_mem_cgroup_pages", "memcg reclaim"),
    ("mem_cgroup_handle_over_high", "memcg reclaim"),
    ("reclaim_high", "memcg reclaim"),
    ("try_charge_memcg", "memcg reclaim"),
    ("try_to_free_pages", "direct reclaim"),
    ("__alloc_pages_direct_reclaim", "direct reclaim"),
    ("__perform_reclaim", "direct reclaim"),
    ("throttle_direct_reclaim", "direct reclaim"),
    ("reclaim_throttle", "direct reclaim"),
    ("do_swap_page", "swap-in"),
    ("swap_read_folio", "swap-in"),
    ("swap_readpage", "swap-in"),
    ("swapin_readahead", "swap-in"),
    ("out_of_memory", "OOM"),
    ("migrate_pages", "page migration"),
    ("collapse_huge_page", "THP collapse"),
];

/// Storage markers are checked in three passes, each anywhere on the stack: the sync family,
/// then the paths that say why it waits for a disk (a page-cache read, dirty-page throttling),
/// then the block layer's waits.
///
/// The sync family anywhere on the stack names the wait, whatever it waits in below (the
/// journal commit, the disk's cache flush, a page under writeback).
const FSYNC: &[(&str, &str)] = &[
    ("vfs_fsync_range", "fsync"),
    ("do_fsync", "fsync"),
    ("ksys_fdatasync", "fsync"),
    ("ksys_sync_file_range", "fsync"),
    ("sync_file_range", "fsync"),
    ("ksys_sync", "fsync"),
    ("sync_filesystem", "fsync"),
    ("ext4_sync_file", "fsync"),
    ("xfs_file_fsync", "fsync"),
    ("jbd2_log_wait_commit", "fsync"),
    ("jbd2_complete_transaction", "fsync"),
    ("blkdev_fsync", "fsync"),
    ("__do_sys_msync", "fsync"),
];

const STORAGE: &[(&str, &str)] = &[
    ("balance_dirty_pages", "writeback throttle"),
    ("filemap_fault", "page-cache read"),
    ("filemap_read", "page-cache read"),
    ("filemap_get_pages", "page-cache read"),
    ("generic_file_read_iter", "page-cache read"),
];

/// Where in the block layer it waits, when no path above says why.
const BLOCK: &[(&str, &str)] = &[
    ("blkdev_read_iter", "block I/O"),
    ("__blkdev_direct_IO", "block I/O"),
    ("iomap_dio_rw", "block I/O"),
    ("__iomap_dio_rw", "block I/O"),
    ("submit_bio_wait", "block I/O"),
    ("blk_mq_get_tag", "block I/O"),
    ("folio_wait_bit", "block I/O"),
    ("wait_on_page_bit", "block I/O"),
    ("__folio_lock", "block I/O"),
    ("__lock_page", "block I/O"),
    ("__wait_on_buffer", "block I/O"),
    ("bit_wait_io", "block I/O"),
    ("io_schedule", "block I/O"),
    ("blk_execute_rq", "block I/O"),
];

const LOCK: &[(&str, &str)] = &[
    ("futex_wait", "futex"),
    ("futex_lock_pi", "futex"),
    ("__futex_wait", "futex"),
    ("__mutex_lock", "kernel mutex"),
    ("mutex_lock", "kernel mutex"),
    ("rwsem_down_", "kernel rwsem"),
    ("down_read", "kernel rwsem"),
    ("down_write", "kernel rwsem"),
    ("__down", "kernel semaphore"),
    ("rt_mutex", "kernel mutex"),
    ("pipe_read", "pipe (another process)"),
    ("pipe_write", "pipe (another process)"),
    ("pipe_wait", "pipe (another process)"),
    ("flock_lock_inode_wait", "file lock"),
    ("posix_lock_inode_wait", "file lock"),
    ("locks_lock_inode_wait", "file lock"),
    ("fcntl_setlk", "file lock"),
];

const NETWORK: &[(&str, &str)] = &[
    ("sk_wait_data", "socket receive"),
    ("tcp_recvmsg", "socket receive"),
    ("udp_recvmsg", "socket receive"),
    ("udpv6_recvmsg", "socket receive"),
    ("__skb_wait_for_more_packets", "socket receive"),
    ("__skb_recv_datagram", "socket receive"),
    ("unix_stream_read_generic", "socket receive"),
    ("unix_stream_data_wait", "socket receive"),
    ("unix_dgram_recvmsg", "socket receive"),
    ("inet_csk_accept", "accept"),
    ("inet_csk_wait_for_connect", "accept"),
    ("unix_accept", "accept"),
    ("inet_wait_for_connect", "connect"),
    ("__inet_stream_connect", "connect"),
    ("sk_stream_wait_memory", "socket send (buffer full)"),
    ("sock_alloc_send_pskb", "socket send (buffer full)"),
    ("sk_stream_wait_connect", "connect"),
];

/// Waits for any of many descriptors: on sockets a network wait, else waiting for work.
const POLL: &[&str] = &[
    "ep_poll",
    "do_epoll_wait",
    "do_select",
    "do_sys_poll",
    "do_poll",
];

/// A parent waiting for its child (a shell, a supervisor): the child's time, not harm.
const CHILD: &[(&str, &str)] = &[
    ("do_wait", "a child process (wait4)"),
    ("kernel_wait4", "a child process (wait4)"),
    ("kernel_waitid", "a child process (waitid)"),
];

const SLEEP: &[(&str, &str)] = &[
    ("do_nanosleep", "nanosleep"),
    ("hrtimer_nanosleep", "nanosleep"),
    ("common_nsleep", "nanosleep"),
    ("clock_nanosleep", "nanosleep"),
    ("do_sigtimedwait", "signal wait"),
    ("sigsuspend", "signal wait"),
    ("sys_pause", "signal wait"),
    ("__x64_sys_pause", "signal wait"),
    ("timerfd_read", "timer"),
    ("do_timerfd", "timer"),
    ("eventfd_read", "eventfd"),
    ("worker_thread", "kernel worker idle"),
    ("kthread_worker_fn", "kernel worker idle"),
    ("smpboot_thread_fn", "kernel worker idle"),
    ("rcu_gp_kthread", "kernel worker idle"),
    ("kswapd", "kernel worker idle"),
    ("kcompactd", "kernel worker idle"),
    ("khugepaged", "kernel worker idle"),
];

fn find<'a>(frames: &[&str], table: &'a [(&str, &str)]) -> Option<&'a str> {
    frames.iter().find_map(|f| {
        table
            .iter()
            .find(|(m, _)| f.starts_with(m))
            .map(|(_, what)| *what)
    })
}

/// The class of a block whose kernel stack is `frames` (function names, innermost first);
/// `sockets`: the process holds sockets (a poll or epoll wait is then a network wait).
pub fn classify(frames: &[&str], sockets: bool) -> Class {
    if frames.is_empty() {
        return Class::of(Part::Other, "[stack not recorded]");
    }
    if let Some(w) = find(frames, MEMCG).or_else(|| find(frames, MEMORY)) {
        return Class::of(Part::Memory, w);
    }
    if let Some(w) = find(frames, FSYNC)
        .or_else(|| find(frames, STORAGE))
        .or_else(|| find(frames, BLOCK))
    {
        return Class::of(Part::Storage, w);
    }
    if let Some(w) = find(frames, LOCK) {
        return Class::of(Part::Lock, w);
    }
    if let Some(w) = find(frames, NETWORK) {
        return Class::of(Part::Network, w);
    }
    if let Some(p) = frames
        .iter()
        .find(|f| POLL.iter().any(|m| f.starts_with(m)))
    {
        let what = if p.starts_with("ep_") || p.starts_with("do_epoll") {
            "epoll"
        } else {
            "poll/select"
        };
        return if sockets {
            Class::of(Part::Network, &format!("{what} (holds sockets)"))
        } else {
            Class::of(Part::Sleep, &format!("{what} (waiting for work)"))
        };
    }
    if let Some(w) = find(frames, SLEEP) {
        return Class::of(Part::Sleep, w);
    }
    if let Some(w) = find(frames, CHILD) {
        return Class::of(Part::Other, w);
    }
    let wait = frames
        .iter()
        .find(|f| !generic(f))
        .copied()
        .unwrap_or(frames[0]);
    Class::of(Part::Other, wait)
}

/// The function names of a `/proc/<tid>/stack` text (`[<0>] do_nanosleep+0x6e/0x150`),
/// innermost first.
pub fn proc_stack(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let f = l.split_once("] ").map_or(l, |(_, f)| f).trim();
            let f = f.split(['+', ' ']).next()?;
            (!f.is_empty()).then(|| f.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(frames: &[&str]) -> (Part, String) {
        let k = classify(frames, false);
        (k.part, k.what)
    }

    #[test]
    fn waits_are_classified_by_their_kernel_stack() {
        // fsync on ext4 (6.18): the journal commit wait.
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "jbd2_log_wait_commit",
                "ext4_sync_file",
                "vfs_fsync_range",
                "do_fsync",
                "__x64_sys_fsync",
                "do_syscall_64"
            ]),
            (Part::Storage, "fsync".into())
        );
        // Direct reclaim waiting on a page under writeback is memory, not storage.
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "io_schedule",
                "folio_wait_bit_common",
                "shrink_folio_list",
                "try_to_free_pages",
                "__alloc_pages_slowpath"
            ])
            .0,
            Part::Memory
        );
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "try_to_free_mem_cgroup_pages",
                "try_charge_memcg"
            ]),
            (Part::Memory, "memcg reclaim".into())
        );
        // A throttle inside a memory cgroup's reclaim is the cgroup's limit.
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "schedule_timeout",
                "reclaim_throttle",
                "shrink_node",
                "do_try_to_free_pages",
                "try_to_free_mem_cgroup_pages"
            ]),
            (Part::Memory, "memcg reclaim".into())
        );
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "futex_wait_queue",
                "__futex_wait",
                "futex_wait",
                "do_futex"
            ]),
            (Part::Lock, "futex".into())
        );
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "schedule_timeout",
                "sk_wait_data",
                "tcp_recvmsg_locked",
                "tcp_recvmsg"
            ]),
            (Part::Network, "socket receive".into())
        );
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "do_nanosleep",
                "hrtimer_nanosleep",
                "common_nsleep"
            ]),
            (Part::Sleep, "nanosleep".into())
        );
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "io_schedule",
                "folio_wait_bit_common",
                "filemap_fault"
            ]),
            (Part::Storage, "page-cache read".into())
        );
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "do_wait",
                "kernel_wait4",
                "__do_sys_wait4"
            ]),
            (Part::Other, "a child process (wait4)".into())
        );
        // The flush under an fsync is still the fsync.
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "io_schedule",
                "submit_bio_wait",
                "blkdev_issue_flush",
                "ext4_sync_file",
                "vfs_fsync_range"
            ]),
            (Part::Storage, "fsync".into())
        );
        // Unknown: the first frame that names the wait, not the scheduler's.
        assert_eq!(
            c(&[
                "__schedule",
                "schedule",
                "schedule_timeout",
                "wait_for_completion",
                "foo_ioctl"
            ]),
            (Part::Other, "wait_for_completion".into())
        );
        assert_eq!(c(&[]), (Part::Other, "[stack not recorded]".into()));
    }

    #[test]
    fn a_poll_wait_is_network_only_for_a_process_with_sockets() {
        let f = [
            "__schedule",
            "schedule",
            "schedule_hrtimeout_range",
            "ep_poll",
            "do_epoll_wait",
        ];
        assert_eq!(classify(&f, true).part, Part::Network);
        assert_eq!(classify(&f, false).part, Part::Sleep);
        assert_eq!(classify(&f, false).what, "epoll (waiting for work)");
    }

    #[test]
    fn proc_stack_text_gives_function_names() {
        let text = "[<0>] do_nanosleep+0x6e/0x150\n[<0>] hrtimer_nanosleep+0xc2/0x1b0\n[<0>] do_syscall_64+0x82/0x190\n";
        assert_eq!(
            proc_stack(text),
            ["do_nanosleep", "hrtimer_nanosleep", "do_syscall_64"]
        );
        let f = proc_stack(text);
        let refs: Vec<&str> = f.iter().map(String::as_str).collect();
        assert_eq!(classify(&refs, false).part, Part::Sleep);
        assert!(proc_stack("").is_empty());
    }
}
