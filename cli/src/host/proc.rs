//! What tracekit reads about processes from /proc: existence, names, open files, privileges.
//! Uses the `procfs` crate where it keeps bytes faithful; `comm` is read raw because procfs
//! returns it lossily as a String and names are compared and escaped byte for byte.

use std::{fs, path::Path};

use super::{read_capped, read_text_capped, SMALL_FILE};

use super::HostError;

pub fn exists(pid: u32) -> bool {
    super::proc_path(&pid.to_string()).exists()
}

/// The processes running now (the numeric entries of /proc).
pub fn pids() -> Vec<u32> {
    fs::read_dir(super::proc_path(""))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The thread group of task `tid` (`Tgid:` in `/proc/<tid>/status`): `tid` itself for a
/// process, its process's pid for a thread.
pub fn tgid_of(tid: u32) -> Option<u32> {
    let text = read_text_capped(&super::proc_path(&format!("{tid}/status")), SMALL_FILE).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Every `--pid` must name a running process, not one of its threads (the filter matches
/// processes; a thread id would silently match nothing).
pub fn check_pids(pids: &[u32]) -> Result<(), HostError> {
    for &p in pids {
        if !exists(p) {
            return Err(HostError::NoSuchProcess(p));
        }
        if let Some(tgid) = tgid_of(p) {
            if tgid != p {
                return Err(HostError::NotAProcess(format!(
                    "--pid {p} is a thread of process {tgid}: use --pid {tgid} (with --threads to see each thread)"
                )));
            }
        }
    }
    Ok(())
}

/// `pids` and every process descending from them now (parents from `/proc/*/stat`), sorted.
pub fn with_descendants(pids: &[u32]) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(rd) = fs::read_dir(super::proc_path("")) {
        for e in rd.filter_map(Result::ok) {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let stat = read_text_capped(&e.path().join("stat"), SMALL_FILE).unwrap_or_default();
            // `pid (comm) S ppid …`: the comm may hold spaces and parentheses.
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            if let Some(pp) = ppid {
                parent_of.push((pid, pp));
            }
        }
    }
    let mut out: Vec<u32> = pids.to_vec();
    let mut frontier = pids.to_vec();
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent_of {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out.sort_unstable();
    out
}

/// `/proc/<pid>/comm` as bytes, without the trailing newline.
pub fn comm(pid: u32) -> Option<Vec<u8>> {
    let mut b = read_capped(&super::proc_path(&format!("{pid}/comm")), SMALL_FILE).ok()?;
    if b.last() == Some(&b'\n') {
        b.pop();
    }
    Some(b)
}

/// The longest process title kept: titles are for telling processes apart, and a JVM's command
/// line can run to tens of kilobytes.
pub const TITLE_MAX: usize = 256;

/// The process title, `/proc/<pid>/cmdline` as the process left it ("postgres: walwriter",
/// "nginx: worker process", or argv joined by spaces), at most [`TITLE_MAX`] bytes; `None` for
/// kernel threads (empty cmdline) and processes that are gone.
pub fn title(pid: u32) -> Option<Vec<u8>> {
    use std::io::Read as _;
    // Only the head is read: a cmdline may be longer than any cap worth refusing at.
    let mut raw = Vec::with_capacity(TITLE_MAX);
    // Non-blocking and regular files only: a `TRACEKIT_PROC` tree may hold a FIFO here.
    super::open_regular(&super::proc_path(&format!("{pid}/cmdline")), u64::MAX)
        .ok()?
        .take(TITLE_MAX as u64)
        .read_to_end(&mut raw)
        .ok()?;
    title_of(&raw)
}

/// [`title`] from the bytes of a cmdline file: NULs between arguments become spaces, trailing
/// NULs and spaces (left by processes that overwrite argv in place) go.
pub fn title_of(raw: &[u8]) -> Option<Vec<u8>> {
    let mut t: Vec<u8> = raw
        .iter()
        .take(TITLE_MAX)
        .map(|&b| if b == 0 { b' ' } else { b })
        .collect();
    while t.last().is_some_and(|b| *b == b' ') {
        t.pop();
    }
    (!t.is_empty()).then_some(t)
}

/// A `Key:   N kB` line of `/proc/<pid>/smaps_rollup` (or `status`, `meminfo`), in KiB.
pub fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// `AnonHugePages` of a live process (KiB of anonymous memory mapped by transparent huge
/// pages), from `/proc/<pid>/smaps_rollup`; `None` when the process is gone or not readable.
pub fn anon_huge_kb(pid: u32) -> Option<u64> {
    let t = read_text_capped(
        &super::proc_path(&format!("{pid}/smaps_rollup")),
        SMALL_FILE,
    )
    .ok()?;
    kb_field(&t, "AnonHugePages")
}

/// What fd `fd` of thread `tid` in process `tgid` refers to, while the process lives:
/// a path (with the kernel's " (deleted)" suffix when unlinked), `socket:[…]`, …; `[closed]`
/// when the process lives but the fd is gone, `[exited]` when the process is gone,
/// `[no access]` when the process belongs to another user and tracekit lacks CAP_SYS_PTRACE.
pub fn fd_path(tgid: u32, tid: u32, fd: i32) -> Vec<u8> {
    let link = super::proc_path(&format!("{tgid}/task/{tid}/fd/{fd}"));
    match fs::read_link(&link)
        .or_else(|_| fs::read_link(super::proc_path(&format!("{tgid}/fd/{fd}"))))
    {
        Ok(p) => p.into_os_string().into_encoded_bytes(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => b"[no access]".to_vec(),
        Err(_) if exists(tgid) => b"[closed]".to_vec(),
        Err(_) => b"[exited]".to_vec(),
    }
}

/// Capabilities tracekit may need, by number (`include/uapi/linux/capability.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    DacReadSearch = 2,
    SysPtrace = 19,
    SysAdmin = 21,
    Perfmon = 38,
    Bpf = 39,
}

impl Cap {
    /// Every capability tracekit may need, in the order `doctor` lists them.
    pub const ALL: &'static [Cap] = &[
        Cap::Bpf,
        Cap::Perfmon,
        Cap::SysAdmin,
        Cap::DacReadSearch,
        Cap::SysPtrace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cap::DacReadSearch => "CAP_DAC_READ_SEARCH",
            Cap::SysPtrace => "CAP_SYS_PTRACE",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }
}

/// What every tool needs to load and attach its programs (BTF tracepoints on this project's
/// kernels; see README "Requirements" for what the fallbacks add).
pub const TOOL_CAPS: &[Cap] = &[Cap::Bpf, Cap::Perfmon];

/// The effective capability set of this process.
pub fn effective_caps() -> u64 {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .map(|s| s.capeff)
        .unwrap_or(0)
}

pub fn has_cap(capeff: u64, c: Cap) -> bool {
    capeff & (1u64 << c as u32) != 0
}

/// Which of `needed` are missing from `capeff`. CAP_SYS_ADMIN stands in for CAP_BPF and
/// CAP_PERFMON (it did before 5.8 and still does).
pub fn missing_caps(capeff: u64, needed: &[Cap]) -> Vec<Cap> {
    needed
        .iter()
        .copied()
        .filter(|&c| {
            let stand_in = matches!(c, Cap::Bpf | Cap::Perfmon) && has_cap(capeff, Cap::SysAdmin);
            !(has_cap(capeff, c) || stand_in)
        })
        .collect()
}

/// Text for a missing capability set: `CAP_BPF and CAP_PERFMON`.
pub fn cap_list(caps: &[Cap]) -> String {
    let names: Vec<&str> = caps.iter().map(|c| c.name()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Checked before touching the kernel, so the user gets one line naming what is missing
/// instead of an EPERM from deep inside a load.
pub fn check_privileges(tool: &str) -> Result<(), HostError> {
    let missing = missing_caps(effective_caps(), TOOL_CAPS);
    if missing.is_empty() {
        return Ok(());
    }
    Err(HostError::Privilege(format!(
        "tracekit {tool} needs root, or the capabilities {} (missing: {}); run it with sudo, or see `tracekit {tool} --help` for the exact set",
        cap_list(TOOL_CAPS),
        cap_list(&missing)
    )))
}

pub fn has_bpf_privileges(capeff: u64) -> bool {
    missing_caps(capeff, TOOL_CAPS).is_empty()
}

/// Threads of this process (`Threads:` in `/proc/self/status`).
pub fn threads() -> Option<u32> {
    let text = read_text_capped(Path::new("/proc/self/status"), SMALL_FILE).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// tracekit's own resident set and its peak (VmRSS, VmHWM), in KiB; zeros if unreadable.
pub fn self_rss_kib() -> (u64, u64) {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .map(|s| (s.vmrss.unwrap_or(0), s.vmhwm.unwrap_or(0)))
        .unwrap_or((0, 0))
}

/// tracekit's own CPU time (user + system) in seconds since it started; 0 if unreadable.
pub fn self_cpu_seconds() -> f64 {
    procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .map(|s| (s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64)
        .unwrap_or(0.0)
}

/// Monotonic clock in ns (the kernel's `bpf_ktime_get_ns`).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Number of possible CPUs (per-CPU maps have one slot each).
pub fn possible_cpus() -> usize {
    aya::util::nr_cpus().unwrap_or(1).max(1)
}

/// `/proc/sys/kernel/pid_max`, bounding how many tasks can exist at once.
pub fn pid_max() -> u32 {
    read_text_capped(&super::proc_path("sys/kernel/pid_max"), SMALL_FILE)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_from_cmdline_bytes() {
        // As postgres leaves it: the title, then argv's old space padded with NULs.
        assert_eq!(
            title_of(b"postgres: walwriter \0\0\0").as_deref(),
            Some(&b"postgres: walwriter"[..])
        );
        assert_eq!(
            title_of(b"/usr/bin/python3\0app.py\0--port\08080\0").as_deref(),
            Some(&b"/usr/bin/python3 app.py --port 8080"[..])
        );
        assert_eq!(title_of(b""), None);
        assert_eq!(title_of(b"\0\0"), None);
        assert_eq!(title_of(&[b'x'; 5000]).map(|t| t.len()), Some(TITLE_MAX));
        assert!(title(std::process::id()).is_some());
    }

    #[test]
    fn privilege_bits() {
        let bit = |c: Cap| 1u64 << c as u32;
        assert!(has_bpf_privileges(bit(Cap::SysAdmin)));
        assert!(has_bpf_privileges(bit(Cap::Bpf) | bit(Cap::Perfmon)));
        assert!(!has_bpf_privileges(bit(Cap::Bpf)));
        assert!(!has_bpf_privileges(0));
        assert_eq!(missing_caps(bit(Cap::Bpf), TOOL_CAPS), vec![Cap::Perfmon]);
        assert_eq!(
            cap_list(&[Cap::Bpf, Cap::Perfmon]),
            "CAP_BPF and CAP_PERFMON"
        );
        assert_eq!(
            cap_list(&[Cap::Bpf, Cap::Perfmon, Cap::DacReadSearch]),
            "CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH"
        );
    }

    #[test]
    fn smaps_rollup_fields() {
        let t = crate::host::fixture("memstall/smaps_rollup");
        assert_eq!(kb_field(&t, "AnonHugePages"), Some(4096));
        assert!(kb_field(&t, "Rss").is_some());
        assert_eq!(kb_field(&t, "NoSuchField"), None);
        assert_eq!(kb_field("AnonHugePages: x kB\n", "AnonHugePages"), None);
        assert!(anon_huge_kb(std::process::id()).is_some());
    }

    #[test]
    fn capped_reads_stop_at_the_limit() {
        let e = read_capped(Path::new("/proc/self/maps"), 16).unwrap_err();
        assert!(
            matches!(e, crate::host::HostError::TooLarge { limit: 16, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("/proc/self/maps"), "{e}");
        let ok = read_capped(Path::new("/proc/self/comm"), SMALL_FILE).unwrap();
        assert!(!ok.is_empty());
    }

    #[test]
    fn threads_are_not_processes() {
        let me = std::process::id();
        assert_eq!(tgid_of(me), Some(me));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // SAFETY: plain syscall.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(tgid_of(tid), Some(me));
        let e = check_pids(&[tid]).unwrap_err();
        assert!(
            e.to_string().contains(&format!("thread of process {me}")),
            "{e}"
        );
        assert_eq!(
            crate::error::Error::from(e).exit(),
            crate::error::Exit::Usage
        );
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn descendants_include_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let all = with_descendants(&[me]);
        assert!(all.contains(&me) && all.contains(&child.id()), "{all:?}");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn own_process() {
        let me = std::process::id();
        assert!(exists(me));
        assert!(comm(me).is_some());
        assert!(check_pids(&[me]).is_ok());
        assert!(matches!(
            check_pids(&[me, 4_000_000]),
            Err(HostError::NoSuchProcess(4_000_000))
        ));
    }

    #[test]
    fn classes_remember_an_exited_task() {
        // A child at nice 15 that exits: learnt while it lived, known after.
        let mut child = std::process::Command::new("nice")
            .args(["-n", "15", "sleep", "0.3"])
            .spawn()
            .unwrap();
        let pid = child.id();
        // `nice` execs sleep: wait for the exec to apply the nice level.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while sched_class(pid).is_some_and(|c| c.nice != 15) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut c = Classes::default();
        assert_eq!(c.learn([pid, pid, 0]), 1);
        assert_eq!(c.learn([pid]), 0, "learnt once");
        child.wait().unwrap();
        assert_eq!(c.of(pid).nice, 15);
        assert_eq!(Classes::default().of(pid), SchedClass::default());
    }

    #[test]
    fn resolves_own_fd() {
        let f = fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        let me = std::process::id();
        let tid = unsafe { libc::gettid() } as u32;
        assert!(fd_path(me, tid, f.as_raw_fd()).ends_with(b"/status"));
        assert_eq!(fd_path(me, tid, 987_654), b"[closed]");
    }
}

/// How a process asked to be scheduled, from `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedClass {
    /// Nice level, -20..19.
    pub nice: i64,
    /// `SCHED_*` policy number (0 normal, 3 batch, 5 idle; 1 and 2 real time).
    pub policy: u32,
    /// A kernel thread (`PF_KTHREAD`): no nice level or cgroup weight of a user's to change.
    pub kthread: bool,
    /// The CPUs it may run on (`Cpus_allowed_list` in `/proc/<pid>/status`) as a mask of CPUs
    /// 0–63; `None` when unknown or when it may run on a CPU above 63.
    pub cpus_allowed: Option<u64>,
}

/// The parent of process `pid` (`/proc/<pid>/stat`), `None` once it has exited.
pub fn ppid(pid: u32) -> Option<u32> {
    use procfs::FromRead;
    let text = read_text_capped(&super::proc_path(&format!("{pid}/stat")), SMALL_FILE).ok()?;
    let st = procfs::process::Stat::from_read(text.as_bytes()).ok()?;
    u32::try_from(st.ppid).ok()
}

/// The scheduling class of process `pid`, `None` once it has exited.
pub fn sched_class(pid: u32) -> Option<SchedClass> {
    use procfs::FromRead;
    const PF_KTHREAD: u32 = 0x0020_0000;
    let text = read_text_capped(&super::proc_path(&format!("{pid}/stat")), SMALL_FILE).ok()?;
    let st = procfs::process::Stat::from_read(text.as_bytes()).ok()?;
    let status = read_text_capped(&super::proc_path(&format!("{pid}/status")), SMALL_FILE);
    let cpus_allowed = status.ok().and_then(|t| {
        let list = t
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
        super::parse_cpu_list(list.trim())?
            .into_iter()
            .try_fold(0u64, |m, c| (c < 64).then(|| m | 1 << c))
    });
    Some(SchedClass {
        nice: st.nice,
        policy: st.policy.unwrap_or(0),
        kthread: st.flags & PF_KTHREAD != 0,
        cpus_allowed,
    })
}

/// Most tasks whose class is remembered; past it the memory starts over.
const CLASSES_CAP: usize = 16_384;
/// Most `/proc` reads of one [`Classes::learn`]: a fork storm's tasks are learnt over a few
/// polls, at a bounded cost each.
const CLASSES_PER_LEARN: usize = 512;

/// Scheduling classes learnt while the tasks lived, so one that exits before the window ends
/// is still judged by how it asked to be scheduled (a SCHED_IDLE UDP sender that ended a
/// second before triage's window was named the saturation's hog, as if at nice 0).
#[derive(Default)]
pub struct Classes {
    by_id: std::collections::HashMap<u32, SchedClass>,
}

impl Classes {
    /// Reads the class of those of `ids` (pids or tids) not known yet, at most
    /// [`CLASSES_PER_LEARN`] of them; returns how many it read.
    pub fn learn(&mut self, ids: impl IntoIterator<Item = u32>) -> usize {
        let mut new: Vec<u32> = ids
            .into_iter()
            .filter(|i| *i != 0 && !self.by_id.contains_key(i))
            .collect();
        new.sort_unstable();
        new.dedup();
        new.truncate(CLASSES_PER_LEARN);
        if self.by_id.len() + new.len() > CLASSES_CAP {
            self.by_id.clear();
        }
        for id in &new {
            if let Some(c) = sched_class(*id) {
                self.by_id.insert(*id, c);
            }
        }
        new.len()
    }

    /// The class of `id` now, or as learnt while it lived; the default (nice 0, normal) when
    /// neither is known.
    pub fn of(&self, id: u32) -> SchedClass {
        sched_class(id)
            .or_else(|| self.by_id.get(&id).copied())
            .unwrap_or_default()
    }
}
