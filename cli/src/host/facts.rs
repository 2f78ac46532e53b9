//! What tracekit learns about a process while it lives, learnt once and kept for the run:
//! name, process title, kernel thread or not, memory cgroup. Kernel programs announce new keys
//! (a ring-buffer record when a key is first created), userspace learns the process's facts at
//! once — before a short-lived process exits — and reports use them after it is gone.
//!
//! Entries are trimmed at each window's end: a process not seen in the last two windows whose
//! `/proc` entry is gone is forgotten, so a node churning through processes keeps memory flat.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use super::{proc_path, read_capped, SMALL_FILE};

/// Facts about one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcFacts {
    /// `comm` from `/proc/<pid>/comm`, read again by [`FactsCache::get`] and
    /// [`FactsCache::title`] while the process lives (the last name it had is kept after).
    pub comm: Vec<u8>,
    /// The process title as the process set it (`/proc/<pid>/cmdline`, NULs as spaces):
    /// `postgres: walwriter`, `nginx: worker process`. Empty for kernel threads.
    pub cmdline: Vec<u8>,
    /// A kernel thread (`PF_KTHREAD`): background work, nobody's stall.
    pub kthread: bool,
    /// Memory cgroup path (v1 memory controller, else v2), as `/proc/<pid>/cgroup` shows it
    /// (bytes: cgroup names are chosen by whoever creates them).
    pub cgroup: Option<Vec<u8>>,
}

const PF_KTHREAD: u64 = 0x0020_0000;

/// `/proc/<pid>/comm` without its newline; `None` when the process is gone.
fn read_comm(pid: u32) -> Option<Vec<u8>> {
    let mut comm = read_capped(&proc_path(&format!("{pid}/comm")), SMALL_FILE).ok()?;
    if comm.last() == Some(&b'\n') {
        comm.pop();
    }
    Some(comm)
}

impl ProcFacts {
    /// Reads what /proc says about `pid`; `None` when the process is gone.
    pub fn read(pid: u32) -> Option<ProcFacts> {
        let dir = proc_path(&pid.to_string());
        let read = |f: &str| read_capped(&dir.join(f), SMALL_FILE).ok();
        let comm = read_comm(pid)?;
        let stat = read("stat").unwrap_or_default();
        Some(ProcFacts {
            comm,
            cmdline: super::proc::title(pid).unwrap_or_default(),
            kthread: stat_flags(&String::from_utf8_lossy(&stat))
                .is_some_and(|f| f & PF_KTHREAD != 0),
            cgroup: read("cgroup").and_then(|t| super::cgroup::memory_path(&t)),
        })
    }
}

/// The `flags` field (9th) of `/proc/<pid>/stat`, after the parenthesised comm (which may itself
/// hold spaces and parentheses).
fn stat_flags(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(6)?.parse().ok()
}

struct Entry {
    facts: Option<ProcFacts>,
    seen: u64,
}

/// Facts per process, learnt on announcement or first use.
#[derive(Default)]
pub struct FactsCache {
    map: HashMap<u32, Entry>,
    window: u64,
}

/// The run's one [`FactsCache`], shared by every collector of the run (triage's collectors
/// learn each process once) and aged by the engine once per window, after every collector has
/// reported it (a collector that aged it first would forget what the next still reports).
#[derive(Clone, Default)]
pub struct Facts(Arc<Mutex<FactsCache>>);

impl Facts {
    /// The cache, for the span of one statement or block (never across a call that locks it).
    pub fn lock(&self) -> MutexGuard<'_, FactsCache> {
        // A panic while holding it left at worst a half-learnt entry: keep going.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FactsCache {
    pub fn new() -> FactsCache {
        FactsCache::default()
    }

    /// Learns `pid` now if it is new (call on announcements, while the process lives).
    pub fn learn(&mut self, pid: u32) {
        let w = self.window;
        self.map
            .entry(pid)
            .and_modify(|e| e.seen = w)
            .or_insert_with(|| Entry {
                facts: ProcFacts::read(pid),
                seen: w,
            });
    }

    /// Facts of `pid`, learning them now if never learnt (the process may be gone: `None`).
    /// The name is read again while the process lives: facts are often learnt at a fork,
    /// before the child's exec or `prctl(PR_SET_NAME)` gave it the name it is known by (io-lat
    /// named a service `bash` for a whole run).
    pub fn get(&mut self, pid: u32) -> Option<&ProcFacts> {
        self.learn(pid);
        let e = self.map.get_mut(&pid)?;
        if let (Some(f), Some(comm)) = (e.facts.as_mut(), read_comm(pid)) {
            f.comm = comm;
        }
        e.facts.as_ref()
    }

    /// Facts already learnt, without touching /proc.
    pub fn known(&self, pid: u32) -> Option<&ProcFacts> {
        self.map.get(&pid).and_then(|e| e.facts.as_ref())
    }

    /// The process title now, read fresh while the process lives (a title changes: a
    /// PostgreSQL backend's says what it is doing) and remembered after it exits, so a process
    /// that ran and died inside the window keeps its title. `None` for a process never seen
    /// alive, or one without a title (a kernel thread).
    pub fn title(&mut self, pid: u32) -> Option<&[u8]> {
        let w = self.window;
        match super::proc::title(pid) {
            Some(t) => {
                let e = self.map.entry(pid).or_insert_with(|| Entry {
                    facts: ProcFacts::read(pid),
                    seen: w,
                });
                e.seen = w;
                let f = e.facts.get_or_insert_with(ProcFacts::default);
                f.cmdline = t;
                if let Some(comm) = read_comm(pid) {
                    f.comm = comm;
                }
            }
            // Gone: what was learnt stands, and is kept for the windows it is still reported in.
            None => {
                if let Some(e) = self.map.get_mut(&pid) {
                    e.seen = w;
                }
            }
        }
        self.known(pid)
            .map(|f| f.cmdline.as_slice())
            .filter(|t| !t.is_empty())
    }

    /// Ends a window: forgets processes unseen for two windows that no longer exist.
    pub fn end_window(&mut self) {
        self.window += 1;
        let w = self.window;
        self.map
            .retain(|pid, e| e.seen + 2 > w || proc_path(&pid.to_string()).exists());
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_flags_after_a_hostile_comm() {
        let stat = "42 (we) ird) S 1 42 42 0 -1 2097216 0 0";
        assert_eq!(stat_flags(stat), Some(2_097_216));
        assert_eq!(stat_flags("garbage"), None);
    }

    #[test]
    fn learns_live_processes_and_forgets_dead_ones() {
        let me = std::process::id();
        let mut c = FactsCache::new();
        let f = c.get(me).unwrap().clone();
        assert!(!f.kthread);
        assert!(!f.comm.is_empty());
        assert!(!f.cmdline.is_empty());
        let kthreadd = ProcFacts::read(2).unwrap();
        assert!(kthreadd.kthread, "{kthreadd:?}");
        // A pid that does not exist: remembered as unknown, then trimmed.
        let dead = 4_194_000;
        assert!(c.get(dead).is_none());
        assert_eq!(c.len(), 2);
        for _ in 0..3 {
            c.learn(me);
            c.end_window();
        }
        assert_eq!(c.len(), 1, "the dead pid is forgotten, the live one kept");
        assert!(c.known(me).is_some());
    }

    /// A name learnt at a fork (the shell's) is replaced by the one the process has after its
    /// exec, and kept once it exits.
    #[test]
    fn names_follow_an_exec_and_outlive_the_process() {
        use std::io::Write;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        // spawn returns while execve may still be replacing the image.
        for _ in 0..200 {
            if read_comm(pid).as_deref() == Some(b"sh") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut c = FactsCache::new();
        c.learn(pid);
        assert_eq!(c.known(pid).unwrap().comm, b"sh");
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        for _ in 0..200 {
            if read_comm(pid).as_deref() == Some(b"sleep") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(c.get(pid).unwrap().comm, b"sleep");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(c.get(pid).unwrap().comm, b"sleep");
    }

    /// A title is read fresh while the process lives, kept after it exits for as long as it is
    /// asked for, and forgotten two windows after the last time.
    #[test]
    fn titles_outlive_their_process_for_two_windows() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // spawn returns while execve may still be replacing the image (cmdline reads empty).
        for _ in 0..100 {
            if super::super::proc::title(pid).as_deref() == Some(b"sleep 30") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut c = FactsCache::new();
        assert_eq!(c.title(pid), Some(&b"sleep 30"[..]));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(c.title(pid), Some(&b"sleep 30"[..]));
        for _ in 0..2 {
            c.end_window();
        }
        assert_eq!(c.title(pid), None);
    }
}
