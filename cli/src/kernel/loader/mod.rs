//! Loading a tool's kernel object, attaching its programs the way the attach policy
//! ([`super::hooks`]) chose, and reading back its shared maps (stats, interval generation).
//!
//! Nothing is pinned: every program, link and map lives on a file descriptor of this process,
//! so the kernel frees them on any exit, SIGKILL included.

use std::{collections::BTreeMap, path::Path};

use aya::{
    maps::{Array, HashMap, Map, PerCpuArray},
    programs::ProgramError,
    Ebpf, EbpfLoader,
};
use probes_common::stats::{Control, NSTATS};

pub use super::hooks::AttachMode;
use super::hooks::{Choice, Hook};

mod attach;
#[cfg(test)]
mod tunables;

pub use attach::plan;

/// A tool's embedded kernel object (built from `probes-ebpf/src/bin/<name>.rs` by
/// `cli/build.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Object {
    pub name: &'static str,
    pub bytes: &'static [u8],
}

/// The kernel object `probes-ebpf/src/bin/<name>.rs`, embedded in the binary:
/// `const OBJECT: Object = tracekit::object!("fsync_lat");`
#[macro_export]
macro_rules! object {
    ($name:literal) => {
        $crate::kernel::loader::Object {
            name: $name,
            bytes: aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/", $name)),
        }
    };
}

/// What every program filters on (read-only globals and the `FILTER_PIDS` map of
/// `probes-ebpf/src/lib.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Filter<'a> {
    /// Process ids (tgids) to trace; empty: all.
    pub pids: &'a [u32],
    /// `comm` to trace, as the kernel stores it.
    pub comm: Option<[u8; 16]>,
    /// `--children`: processes the traced ones fork join the filter in the kernel.
    pub children: bool,
}

impl Filter<'_> {
    /// The one process of `--pid N` without `--children`: a set that never changes, which the
    /// programs test with a compare (`FILTER_ONE_PID`); 0 for none or several.
    pub fn one_pid(&self) -> u32 {
        match self.pids {
            [p] if !self.children => *p,
            _ => 0,
        }
    }
}

/// The event `--children` follows forks on: it runs in the parent, before the child can run,
/// and carries `clone_flags` (to skip new threads); present since Linux 3.x.
static FOLLOW_FORKS: Hook = Hook::event("task:task_newtask");

/// Offsets of `pid` and `clone_flags` in `task:task_newtask`, from its format file.
fn follow_offsets() -> Result<(u32, u32), String> {
    let tfs = super::tracefs::Tracefs::open().map_err(|e| e.to_string())?;
    let f = tfs
        .format("task", "task_newtask")
        .map_err(|e| e.to_string())?;
    Ok((
        f.offset_of("pid", &[4]).map_err(|e| e.to_string())?,
        f.offset_of("clone_flags", &[8])
            .map_err(|e| e.to_string())?,
    ))
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the {object} kernel object: {source}")]
    Object {
        object: &'static str,
        source: aya::EbpfError,
    },
    #[error("{object} has no program {program}")]
    NoProgram {
        object: &'static str,
        program: String,
    },
    #[error("{object} has no map {map}")]
    NoMap { object: &'static str, map: String },
    #[error("loading program {program}: {msg}")]
    Program { program: String, msg: String },
    #[error("attaching {program} to {target}: {source}")]
    Attach {
        program: String,
        target: String,
        source: Box<ProgramError>,
    },
    #[error("map {map}: {source}")]
    Map {
        map: String,
        source: aya::maps::MapError,
    },
    #[error(
        "the kernel refused to load {object} (EPERM): run as root, or with CAP_BPF and CAP_PERFMON"
    )]
    Permission { object: &'static str },
    #[error("no attach mode for {event}: {why}")]
    NoMode {
        event: String,
        why: String,
        /// Tracefs was unreadable for lack of a capability (exit 3, not 4).
        permission: bool,
    },
}

impl LoadError {
    /// The kernel said EPERM: a missing capability, not a bug.
    pub fn is_permission(&self) -> bool {
        matches!(self, LoadError::Permission { .. })
    }
}

/// One attached program, for the report header and for tests that check cleanup.
#[derive(Clone, Debug)]
pub struct Attached {
    pub program: String,
    pub id: u32,
    pub mode: AttachMode,
    pub targets: Vec<String>,
}

/// A tool's settings for its object: read-only globals (field offsets, flags) patched in before
/// load, and map sizes.
#[derive(Debug, Default)]
pub struct LoadSpec {
    globals: Vec<(&'static str, Vec<u8>)>,
    max_entries: Vec<(&'static str, u32)>,
    tp_btf: Vec<&'static str>,
}

impl LoadSpec {
    pub fn new() -> LoadSpec {
        LoadSpec::default()
    }

    /// Sets global `name`; its size must match the kernel object's (checked by aya at load).
    pub fn global<T: aya::Pod>(mut self, name: &'static str, value: &T) -> LoadSpec {
        // SAFETY: T is Pod (plain bytes, no padding that matters); we copy exactly its size.
        let bytes = unsafe {
            std::slice::from_raw_parts(value as *const T as *const u8, std::mem::size_of::<T>())
        };
        self.globals.push((name, bytes.to_vec()));
        self
    }

    pub fn max_entries(mut self, map: &'static str, n: u32) -> LoadSpec {
        self.max_entries.push((map, n));
        self
    }

    /// Raw tracepoints the tool will attach with tp_btf: their BTF stub (see
    /// `Session::prepare_tp_btf`) is built on a second thread while the object loads (map
    /// creation and aya's feature probes), which hides its ~0.5 ms on a 2-CPU machine.
    pub fn tp_btf(mut self, tps: &[&'static str]) -> LoadSpec {
        self.tp_btf.extend_from_slice(tps);
        self
    }

    /// [`LoadSpec::tp_btf`] for every hook `plan` attaches with tp_btf. Without it each such
    /// hook builds and parses a stub of its own while attaching (~1 ms each: memstall has 14).
    pub fn tp_btf_planned(self, hooks: &[Hook], plan: &[Choice]) -> LoadSpec {
        let tps: Vec<&'static str> = hooks
            .iter()
            .zip(plan)
            .filter(|(_, c)| matches!(c.mode, Some((AttachMode::TpBtf, _))))
            .map(|(h, _)| h.attach_target(AttachMode::TpBtf))
            .collect();
        self.tp_btf(&tps)
    }
}

/// A loaded tool object with its attachments. Dropping it detaches everything.
pub struct Session {
    pub object: &'static str,
    pub ebpf: Ebpf,
    pub attached: Vec<Attached>,
    /// Hooks the policy skipped (optional ones this kernel cannot attach), with the reason.
    pub skipped: Vec<(&'static str, String)>,
    /// Hooks with a [`Hook::when`] condition this run does not meet, left out by the tool
    /// before planning, with the reason (the meta line's `left_out`).
    pub left_out: Vec<(&'static str, String)>,
    /// The policy's choice for every hook, as `doctor` would print it.
    pub choices: Vec<Choice>,
    /// (program, raw target) already attached: several hooks may share one raw tracepoint.
    links: Vec<(&'static str, String)>,
    stats_prev: [u64; NSTATS as usize],
    /// A BTF stub covering the tp_btf tracepoints and fentry functions this object may use,
    /// built once (see `btf::Btf::tp_btf_stub`).
    tp_stub: Option<aya::Btf>,
    fn_stub: Option<aya::Btf>,
    /// The generation the last flip left (what the window's collection drains).
    drained: u32,
    /// When the current generation began (CLOCK_MONOTONIC ns: the load, then each flip).
    gen_since_ns: u64,
    /// When the drained generation began and ended.
    drained_span_ns: (u64, u64),
}

/// The error for an object without map `map`.
fn no_map(object: &'static str, map: &str) -> LoadError {
    LoadError::NoMap {
        object,
        map: map.to_string(),
    }
}

/// A map error, named after the map (shared with [`super::maps`]).
pub(super) fn map_err(map: &str) -> impl FnOnce(aya::maps::MapError) -> LoadError + '_ {
    move |source| LoadError::Map {
        map: map.to_string(),
        source,
    }
}

fn prog_load_err(program: &str, e: ProgramError) -> LoadError {
    let msg = match &e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            // The error is often well before the last lines; RUST_LOG=tracekit=debug shows it all.
            tracing::debug!("verifier log of {program}:\n{log}");
            format!("{io_error} (verifier: {})", verifier_reason(&log))
        }
        other => other.to_string(),
    };
    LoadError::Program {
        program: program.to_string(),
        msg,
    }
}

/// The last two lines of a verifier log that are not its statistics: the reason for a refusal
/// is printed just before them, and the statistics alone ("processed 0 insns") say nothing.
fn verifier_reason(log: &str) -> String {
    const STATS: [&str; 4] = [
        "processed ",
        "stack depth ",
        "verification time ",
        "max_states_per_insn ",
    ];
    let tail: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !STATS.iter().any(|s| l.starts_with(s)))
        .rev()
        .take(2)
        .collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

impl Session {
    /// Loads `object` with the shared filter globals plus the tool's own settings (globals, map
    /// sizes). BTF is not parsed for relocations: Rust BPF code has none, and skipping it saves
    /// a second parse of /sys/kernel/btf/vmlinux at start-up.
    pub fn load(object: Object, filter: Filter, spec: LoadSpec) -> Result<Session, LoadError> {
        let follow = (filter.children && !filter.pids.is_empty()).then(follow_offsets);
        let (pid_off, flags_off) = match &follow {
            Some(Ok(o)) => *o,
            _ => (8, 32),
        };
        let spec = spec
            .global("FOLLOW_PID_OFF", &pid_off)
            .global("FOLLOW_FLAGS_OFF", &flags_off)
            .global("FILTER_PIDS_ON", &u8::from(!filter.pids.is_empty()))
            .global("FILTER_COMM_ON", &u8::from(filter.comm.is_some()))
            .global("FILTER_ONE_PID", &filter.one_pid())
            .global("FILTER_COMM", &filter.comm.unwrap_or([0; 16]));
        let t = std::time::Instant::now();
        let mut loader = loader_without_vmlinux_btf();
        tracing::debug!("EbpfLoader::new took {:?}", t.elapsed());
        loader.btf(None);
        // Task-local storage maps (BTF-defined) have no typed wrapper in aya 0.14; the programs
        // use them, userspace never reads them.
        loader.allow_unsupported_maps();
        for (name, bytes) in &spec.globals {
            loader.override_global(name, bytes.as_slice(), true);
        }
        for (name, n) in &spec.max_entries {
            loader.map_max_entries(name, *n);
        }
        // After EbpfLoader::new: its unshare(CLONE_NEWNS) needs a single-threaded process. The
        // stub is built while aya creates the maps and probes features (~0.5 ms hidden).
        let (loaded, tp_stub) = super::with_stop_signals_blocked(|| {
            let stub_thread =
                (!spec.tp_btf.is_empty() && super::features::btf_present()).then(|| {
                    let tps = spec.tp_btf.clone();
                    std::thread::spawn(move || {
                        super::btf::vmlinux().ok().and_then(|b| b.tp_btf_stub(&tps))
                    })
                });
            let loaded = loader.load(object.bytes);
            (loaded, stub_thread.and_then(|t| t.join().ok()).flatten())
        });
        let mut ebpf = loaded.map_err(|source| {
            if is_eperm(&source) {
                LoadError::Permission {
                    object: object.name,
                }
            } else {
                LoadError::Object {
                    object: object.name,
                    source,
                }
            }
        })?;
        tracing::debug!("load of {} done at {:?}", object.name, t.elapsed());
        if !filter.pids.is_empty() {
            let mut m: HashMap<_, u32, u8> = HashMap::try_from(
                ebpf.map_mut("FILTER_PIDS")
                    .ok_or_else(|| no_map(object.name, "FILTER_PIDS"))?,
            )
            .map_err(map_err("FILTER_PIDS"))?;
            for p in filter.pids {
                m.insert(p, 1, 0).map_err(map_err("FILTER_PIDS"))?;
            }
        }
        let mut session = Session {
            object: object.name,
            ebpf,
            attached: Vec::new(),
            skipped: Vec::new(),
            left_out: Vec::new(),
            choices: Vec::new(),
            links: Vec::new(),
            stats_prev: [0; NSTATS as usize],
            tp_stub,
            fn_stub: None,
            drained: 0,
            gen_since_ns: crate::host::proc::mono_ns(),
            drained_span_ns: (0, 0),
        };
        match follow {
            Some(Ok(_)) => {
                if let Err(e) =
                    session.attach_hook(&FOLLOW_FORKS, AttachMode::Tracepoint, "tk_follow_fork")
                {
                    session.skipped.push((
                        "--children in the kernel",
                        format!("{e}; new children are added every 500 ms instead"),
                    ));
                }
            }
            Some(Err(why)) => session.skipped.push((
                "--children in the kernel",
                format!("{why}; new children are added every 500 ms instead"),
            )),
            None => {}
        }
        Ok(session)
    }

    /// Adds `pids` to the processes `--pid` traces and forgets those that exited (a process the
    /// kernel added since `pids` was read stays). Only for a session loaded with a pid filter:
    /// the filter's on/off switch is fixed at load.
    pub fn set_filter_pids(&mut self, pids: &[u32]) -> Result<(), LoadError> {
        let mut m: HashMap<_, u32, u8> =
            HashMap::try_from(self.map_mut("FILTER_PIDS")?).map_err(map_err("FILTER_PIDS"))?;
        let old: Vec<u32> = m.keys().filter_map(Result::ok).collect();
        for p in pids {
            if !old.contains(p) {
                m.insert(p, 1, 0).map_err(map_err("FILTER_PIDS"))?;
            }
        }
        for p in old.iter().filter(|p| !crate::host::proc::exists(**p)) {
            let _ = m.remove(p);
        }
        Ok(())
    }

    /// Map `name` of the loaded object (`NoMap` when it has none).
    pub fn map(&self, name: &str) -> Result<&Map, LoadError> {
        self.ebpf.map(name).ok_or_else(|| no_map(self.object, name))
    }

    /// Map `name` of the loaded object, to change in place.
    pub fn map_mut(&mut self, name: &str) -> Result<&mut Map, LoadError> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| no_map(self.object, name))
    }

    /// Map `name`, taken out of the loaded object: the caller owns it from then on.
    pub fn take_map(&mut self, name: &str) -> Result<Map, LoadError> {
        self.ebpf
            .take_map(name)
            .ok_or_else(|| no_map(self.object, name))
    }

    /// Per-CPU stats summed over CPUs, as deltas since the previous call.
    pub fn stats_delta(&mut self) -> Result<[u64; NSTATS as usize], LoadError> {
        let m: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.map("STATS")?).map_err(map_err("STATS"))?;
        let mut now = [0u64; NSTATS as usize];
        for (i, slot) in now.iter_mut().enumerate() {
            let v = m.get(&(i as u32), 0).map_err(map_err("STATS"))?;
            *slot = v.iter().sum();
        }
        let mut delta = [0u64; NSTATS as usize];
        for i in 0..now.len() {
            delta[i] = now[i].wrapping_sub(self.stats_prev[i]);
        }
        self.stats_prev = now;
        Ok(delta)
    }

    /// The generation the kernel writes to now.
    pub fn generation(&self) -> Result<u32, LoadError> {
        let m: Array<_, Control> =
            Array::try_from(self.map("CONTROL")?).map_err(map_err("CONTROL"))?;
        Ok(m.get(&0, 0).map_err(map_err("CONTROL"))?.gen & 1)
    }

    /// Starts a new interval: the kernel switches to the other generation, and the one returned
    /// (also [`Session::drained`]) is quiescent once programs that read the old value have
    /// finished. The engine waits for that once for every collector of the run
    /// (`engine::FLIP_SETTLE`), not here.
    pub fn flip_generation(&mut self) -> Result<u32, LoadError> {
        let old = self.generation()?;
        let now = crate::host::proc::mono_ns();
        let mut m: Array<_, Control> =
            Array::try_from(self.map_mut("CONTROL")?).map_err(map_err("CONTROL"))?;
        m.set(
            0,
            Control {
                gen: old ^ 1,
                _pad: 0,
                since_ns: now,
            },
            0,
        )
        .map_err(map_err("CONTROL"))?;
        self.drained = old;
        self.drained_span_ns = (self.gen_since_ns, now);
        self.gen_since_ns = now;
        Ok(old)
    }

    /// When the generation the last flip left began and ended (CLOCK_MONOTONIC ns, the clock
    /// of `bpf_ktime_get_ns` and `task_struct.start_time`); the first began at the load.
    pub fn drained_span_ns(&self) -> (u64, u64) {
        self.drained_span_ns
    }

    /// [`Session::drained_span_ns`] in seconds, never 0: the denominator of the drained
    /// generation's shares and rates. The first generation counts from the load, not from the
    /// run's first window: under triage the other collectors open after this one, and what
    /// ended meanwhile is in the first window (over the window alone a one-thread fsync loop
    /// came to 104 % of its time).
    pub fn drained_secs(&self) -> f64 {
        span_secs(self.drained_span_ns)
    }

    /// The generation the last [`Session::flip_generation`] left: the window to drain.
    pub fn drained(&self) -> u32 {
        self.drained
    }

    /// Runs the kernel skipped, summed over the attached programs (`recursion_misses` of each
    /// program's fdinfo, 5.12+): a raw/BTF tracepoint program firing while it already runs on
    /// that CPU, or a classic tracepoint/kprobe program while any such program (or a `bpf()`
    /// map update) holds that CPU's `bpf_prog_active`. Such losses are invisible otherwise.
    pub fn recursion_misses(&self) -> u64 {
        use std::os::fd::{AsFd, AsRawFd};
        let of = |fd: i32| -> Option<u64> {
            let t = crate::host::read_text(Path::new(&format!("/proc/self/fdinfo/{fd}")));
            let misses = |l: &str| l.strip_prefix("recursion_misses:")?.trim().parse().ok();
            t.ok()?.lines().find_map(misses)
        };
        self.attached
            .iter()
            .filter_map(|a| self.ebpf.program(&a.program)?.fd().ok())
            .filter_map(|fd| of(fd.as_fd().as_raw_fd()))
            .sum()
    }

    /// Attached programs for the JSON meta line.
    pub fn programs_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.attached
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "name": a.program, "id": a.id, "attach": a.mode.as_str(), "targets": a.targets,
                    })
                })
                .collect(),
        )
    }

    /// One line per program for the text header.
    pub fn programs_text(&self) -> String {
        let mut by_mode: BTreeMap<AttachMode, usize> = BTreeMap::new();
        for a in &self.attached {
            *by_mode.entry(a.mode).or_default() += a.targets.len();
        }
        let parts: Vec<String> = by_mode
            .iter()
            .map(|(m, n)| format!("{n} {} hook{}", m.as_str(), if *n == 1 { "" } else { "s" }))
            .collect();
        parts.join(", ")
    }
}

/// An `EbpfLoader` without parsing `/sys/kernel/btf/vmlinux`.
///
/// aya 0.14's `EbpfLoader::new()` always parses the kernel's BTF (about 30 ms here, most of
/// tracekit's start-up), although our objects have no CO-RE relocations and we pass
/// `.btf(None)` anyway. So while `new()` runs, the file is masked with /dev/null in a private
/// mount namespace of this process: the parse fails at once and nothing outside the process
/// sees any change. The mask is removed right after, so tp_btf attachment can read BTF later.
/// Without CAP_SYS_ADMIN (CAP_BPF + CAP_PERFMON only) this silently falls back to the slow path.
fn loader_without_vmlinux_btf() -> EbpfLoader<'static> {
    const VMLINUX: &std::ffi::CStr = c"/sys/kernel/btf/vmlinux";
    // SAFETY: plain syscalls with valid NUL-terminated paths. unshare(CLONE_NEWNS) affects only
    // this process; tracekit is single-threaded at this point (the event loop starts later).
    let masked = unsafe {
        libc::unshare(libc::CLONE_NEWNS) == 0
            && libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) == 0
            && libc::mount(
                c"/dev/null".as_ptr(),
                VMLINUX.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) == 0
    };
    let loader = EbpfLoader::new();
    if masked {
        // SAFETY: as above; unmounts only the bind mount made just before.
        unsafe { libc::umount2(VMLINUX.as_ptr(), libc::MNT_DETACH) };
    }
    loader
}

fn is_eperm(e: &aya::EbpfError) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error() == Some(libc::EPERM);
        }
        src = s.source();
    }
    false
}

/// A span of CLOCK_MONOTONIC ns in seconds, never 0 (a clock that did not move is no
/// division by zero).
fn span_secs((from, to): (u64, u64)) -> f64 {
    (to.saturating_sub(from) as f64 / 1e9).max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::{span_secs, verifier_reason, Filter};

    #[test]
    fn one_pid_only_for_a_set_that_never_changes() {
        let f = |pids: &'static [u32], children| Filter {
            pids,
            comm: None,
            children,
        };
        assert_eq!(f(&[42], false).one_pid(), 42);
        // --children adds descendants to the map while running: the compare would miss them.
        assert_eq!(f(&[42], true).one_pid(), 0);
        assert_eq!(f(&[42, 43], false).one_pid(), 0);
        assert_eq!(f(&[], false).one_pid(), 0);
    }

    #[test]
    fn spans_are_seconds_and_never_zero() {
        assert_eq!(span_secs((1_000_000_000, 5_190_000_000)), 4.19);
        assert!(span_secs((7, 7)) > 0.0);
        assert!(span_secs((9, 7)) > 0.0);
    }

    #[test]
    fn the_reason_comes_before_the_statistics() {
        // Linux 5.10 refusing a perf_event program a BPF_F_NO_PREALLOC hash map.
        let log = "perf_event programs can only use preallocated hash map\n\
                   processed 0 insns (limit 1000000) max_states_per_insn 0 total_states 0 \
                   peak_states 0 mark_read 0\n";
        assert_eq!(
            verifier_reason(log),
            "perf_event programs can only use preallocated hash map"
        );
        let log = "0: (b7) r0 = 0\n1: (95) exit\nR0 !read_ok\n\
                   verification time 12 usec\nstack depth 0+0\nprocessed 2 insns\n";
        assert_eq!(verifier_reason(log), "1: (95) exit / R0 !read_ok");
        assert_eq!(verifier_reason(""), "");
    }
}
