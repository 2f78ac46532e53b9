//! Memory-management fixtures shared by the root tests that stage memory incidents (memstall,
//! triage): sysfs/procfs settings restored on drop, memory cgroups with a limit, `/proc/vmstat`
//! and the free 2 MiB blocks that decide whether a THP fault must compact.

use std::{
    os::unix::fs::MetadataExt,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// `/proc/vmstat`'s `key` (panics when the kernel has no such counter).
pub fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("/proc/vmstat has no {key}"))
}

pub const THP_DEFRAG: &str = "/sys/kernel/mm/transparent_hugepage/defrag";
pub const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Free 2 MiB blocks of every zone (`/proc/buddyinfo`, orders 9 and up).
pub fn free_huge_blocks() -> u64 {
    let text = std::fs::read_to_string("/proc/buddyinfo").unwrap();
    text.lines()
        .map(|l| {
            // `Node 0, zone   Normal  31498 9791 … ` : counts per order from 0.
            let counts: Vec<u64> = l
                .split_whitespace()
                .skip(4)
                .filter_map(|c| c.parse().ok())
                .collect();
            counts
                .iter()
                .enumerate()
                .filter(|(order, _)| *order >= 9)
                .map(|(order, c)| c << (order - 9))
                .sum::<u64>()
        })
        .sum()
}

/// Memory staged so that a THP fault must compact directly: no free 2 MiB block in any zone
/// (beyond the lower zones' reserve), yet free memory to compact into. Put back on drop (the
/// mapping, then the pool, then proactive compaction).
///
/// A fresh machine has ~23 GiB free and compacts in the background (`kcompactd`, driven by
/// `vm.compaction_proactiveness`). Holding the free 2 MiB blocks in the hugetlb pool alone was
/// not enough there (issue #31): the pool grew from the Normal zone and left 752 free 4 MiB
/// blocks in DMA32, which `dd`'s faults then took with `compact_stall` +0. So: proactive
/// compaction off; the pool takes every free 2 MiB block the kernel gives it; then what is
/// still free (less `SLACK`) is filled with small pages of which every other one is freed —
/// 4 KiB holes whose buddies are in use, so nothing merges back into a block, and the fill
/// reaches DMA32 once Normal is full; then the pool takes whatever whole blocks are left. What
/// stays whole is DMA32's reserve against Normal allocations (`lowmem_reserve`, ~80 MB here),
/// fewer blocks than `dd`'s 256 MiB needs.
pub struct Fragmented {
    /// The small-page mapping whose odd pages were freed.
    map: (*mut libc::c_void, usize),
    _pool: Setting,
    _proactive: Option<Setting>,
}

/// Free memory the fill leaves alone, so it does not push the host into reclaim.
const SLACK: u64 = 256 << 20;

pub fn hold_free_huge_blocks() -> Fragmented {
    // Kernels before 5.9 have no proactive compaction: nothing to turn off.
    let proactive = Setting::try_set("/proc/sys/vm/compaction_proactiveness", "0").ok();
    let pool = Setting::set(NR_HUGEPAGES, &free_huge_blocks().to_string());
    grow_pool_over_free_blocks();
    let fill = meminfo_bytes("MemFree").saturating_sub(SLACK).max(64 << 20);
    let map = small_pages_half_freed(fill as usize);
    grow_pool_over_free_blocks();
    Fragmented {
        map,
        _pool: pool,
        _proactive: proactive,
    }
}

/// Grows the hugetlb pool by what is still free in 2 MiB blocks until that stops shrinking
/// (one pool of the free count, on this 24 GiB host, left 752 free 4 MiB blocks in DMA32).
fn grow_pool_over_free_blocks() {
    let held = || -> u64 {
        std::fs::read_to_string(NR_HUGEPAGES)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut left = free_huge_blocks();
    for _ in 0..6 {
        if left <= 2 || std::fs::write(NR_HUGEPAGES, (held() + left).to_string()).is_err() {
            break;
        }
        let now = free_huge_blocks();
        if now >= left {
            break;
        }
        left = now;
    }
}

/// `/proc/meminfo`'s `key` in bytes (0 when absent).
fn meminfo_bytes(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib << 10)
}

/// An anonymous mapping of `len` bytes in 4 KiB pages (THP off for it), every page touched,
/// then every other page freed.
fn small_pages_half_freed(len: usize) -> (*mut libc::c_void, usize) {
    const PAGE: usize = 4096;
    let p = crate::anon_map(len);
    // SAFETY: advice and writes within the mapping made above.
    unsafe {
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        for off in (0..len).step_by(PAGE) {
            p.cast::<u8>().add(off).write_volatile(1);
        }
        for off in (PAGE..len).step_by(2 * PAGE) {
            libc::madvise(p.cast::<u8>().add(off).cast(), PAGE, libc::MADV_DONTNEED);
        }
    }
    (p, len)
}

impl Drop for Fragmented {
    fn drop(&mut self) {
        let (p, len) = self.map;
        // SAFETY: the mapping made by small_pages_half_freed, not used since.
        unsafe { libc::munmap(p, len) };
    }
}

/// A sysfs or procfs value set for the life of the guard, then restored.
///
/// A run killed with SIGKILL never drops its guards, and the host keeps the test's value (once:
/// THP `enabled=always`, which then broke the collapse tests of the next run). So each change is
/// also written to a journal under /run, and the next root test puts back what a dead process
/// left ([`restore_leftovers`], called by `require_root`).
pub struct Setting {
    path: &'static str,
    old: String,
}

const JOURNAL: &str = "/run/tracekit-tests/settings";

fn journal_file(path: &str) -> PathBuf {
    PathBuf::from(JOURNAL).join(path.trim_start_matches('/').replace('/', "%"))
}

/// Puts back every setting whose guard belonged to a process that no longer runs.
pub fn restore_leftovers() {
    let Ok(dir) = std::fs::read_dir(JOURNAL) else {
        return;
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let mut it = text.splitn(3, '\n');
        let (Some(pid), Some(path), Some(old)) = (it.next(), it.next(), it.next()) else {
            let _ = std::fs::remove_file(e.path());
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match std::fs::write(path, old) {
            Ok(()) => eprintln!("restored {path} to {old}, left by killed test process {pid}"),
            Err(e) => eprintln!("could not restore {path} to {old}: {e}"),
        }
        let _ = std::fs::remove_file(e.path());
    }
}

impl Setting {
    pub fn set(path: &'static str, value: &str) -> Setting {
        Setting::try_set(path, value).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_set(path: &'static str, value: &str) -> Result<Setting, String> {
        restore_leftovers();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        // `always [madvise] never` keeps its selected word; plain values stay as they are.
        let old = match (text.find('['), text.find(']')) {
            (Some(a), Some(b)) if a < b => text[a + 1..b].to_string(),
            _ => text.trim().to_string(),
        };
        // The outermost guard of a path journals the value to go back to; nested guards (one
        // test inside another's setting) find the file there and leave it.
        let _ = std::fs::create_dir_all(JOURNAL);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(journal_file(path))
        {
            use std::io::Write;
            let _ = write!(f, "{}\n{path}\n{old}", std::process::id());
        }
        std::fs::write(path, value).map_err(|e| format!("{path} <- {value}: {e}"))?;
        Ok(Setting { path, old })
    }
}

pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

impl Drop for Setting {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(self.path, &self.old) {
            eprintln!("could not restore {} to {}: {e}", self.path, self.old);
        }
        let j = journal_file(self.path);
        let mine = format!("{}\n{}\n{}", std::process::id(), self.path, self.old);
        if std::fs::read_to_string(&j).is_ok_and(|t| t == mine) {
            let _ = std::fs::remove_file(j);
        }
    }
}

/// A memory cgroup `tk-TAG-PID` with a limit, removed on drop (v1 memory hierarchy here, else
/// v2).
pub struct Cgroup {
    pub dir: PathBuf,
    pub name: String,
    pub v1: bool,
}

impl Cgroup {
    pub fn create(tag: &str, limit: u64) -> Cgroup {
        let name = format!("tk-{tag}-{}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let is_v1 = v1.join("memory.limit_in_bytes").exists();
        let dir = if is_v1 {
            let d = v1.join(&name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
            // No swap for its anonymous memory: past the limit it reclaims cache or OOMs.
            let _ = std::fs::write(d.join("memory.swappiness"), "0");
            d
        } else {
            // Pure v2: the memory controller must be enabled for children of the root.
            let root = PathBuf::from("/sys/fs/cgroup");
            let ctl = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            assert!(
                ctl.split_whitespace().any(|c| c == "memory"),
                "no memory controller on v1 or v2 here"
            );
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            let d = root.join(&name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("memory.max"), limit.to_string()).unwrap();
            let _ = std::fs::write(d.join("memory.swap.max"), "0");
            d
        };
        Cgroup {
            dir,
            name,
            v1: is_v1,
        }
    }

    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn id(&self) -> u64 {
        std::fs::metadata(&self.dir).unwrap().ino()
    }

    /// Runs `sh -c 'echo $$ > cgroup.procs; exec CMD'`: one process, in the cgroup from its
    /// first instruction of CMD on. Returns its pid, its life time and its exit status.
    pub fn run(&self, cmd: &str) -> (u32, Duration, std::process::ExitStatus) {
        let script = format!("echo $$ > {} && exec {cmd}", self.procs().display());
        let t = Instant::now();
        let mut c = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = c.id();
        let st = c.wait().unwrap();
        (pid, t.elapsed(), st)
    }

    pub fn remove(&self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

pub const DIRTY_BACKGROUND_RATIO: &str = "/proc/sys/vm/dirty_background_ratio";
pub const DIRTY_BACKGROUND_BYTES: &str = "/proc/sys/vm/dirty_background_bytes";

/// Background writeback from `bytes` of dirty page cache on, until the guard drops (a fresh
/// machine's 10 % of 23 GiB would let a test's writer dirty 2 GiB before the flusher starts).
/// Writing one of the two settings zeroes the other, and the kernel refuses a 0 byte count, so
/// the guard is on whichever of them the host uses: restoring it puts both back.
pub fn background_writeback_from(bytes: u64) -> Setting {
    let ratio = std::fs::read_to_string(DIRTY_BACKGROUND_RATIO).unwrap();
    let guard = if ratio.trim() == "0" {
        let old = std::fs::read_to_string(DIRTY_BACKGROUND_BYTES).unwrap();
        Setting::set(DIRTY_BACKGROUND_BYTES, old.trim())
    } else {
        Setting::set(DIRTY_BACKGROUND_RATIO, ratio.trim())
    };
    std::fs::write(DIRTY_BACKGROUND_BYTES, bytes.to_string())
        .unwrap_or_else(|e| panic!("{DIRTY_BACKGROUND_BYTES} <- {bytes}: {e}"));
    guard
}
