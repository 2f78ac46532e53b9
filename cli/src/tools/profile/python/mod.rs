//! CPython frames in `profile`'s stacks (on-CPU and `--off-cpu`).
//!
//! Finding the interpreter without its cooperation: a process is Python when it maps a
//! `python3.N` or `libpython3.N` binary that has a `_PyRuntime` symbol (the static symbol table,
//! else the dynamic one: Debian's stripped `/usr/bin/python3` still exports it). The version is
//! `Py_Version` read from the process (3.11+), else the binary's name (3.10). From
//! `_PyRuntime` the main interpreter and the address of its thread list are read here once; the
//! kernel (`probes-ebpf/src/python.rs`) walks that list for the sampled thread and its frames.
//! 3.13 publishes its own layout (`_Py_DebugOffsets` at the start of `_PyRuntime`): where its
//! cookie is found, the offsets it gives win over the table.
//!
//! Frames come back as code object addresses and instructions; `code.rs` decodes names, files
//! and lines from the process's memory (`/proc/<pid>/mem`) while it runs, cached per code object.
//! The Python stack is then spliced into the native one at the evaluator's frames
//! ([`merge`]): each `_PyEval_EvalFrameDefault` call runs the Python frames from one entry frame
//! inward, so the flame graph reads `main → handler (app.py:41) → save (app.py:30) → dumps
//! (json/__init__.py:231) → encoder_call`.

mod code;
mod layout;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::unix::fs::FileExt,
    rc::Rc,
    time::Instant,
};

use aya::maps::{HashMap as BpfHash, MapData, PerCpuArray};
use probes_common::python::{
    PyFrame, PyProc, PyStack, PY_ENTRY, PY_NSTATS, PY_STAT_MAP_FULL, PY_STAT_NO_FRAME,
    PY_STAT_NO_THREAD, PY_STAT_STACKS, PY_STAT_TRUNCATED, PY_TID_FSBASE,
};

use super::symbols::Frame;
use crate::{
    engine::Scope,
    error::{Context, Result},
    kernel::loader::Session,
};
use code::{CodeCache, Mem};
use layout::{apply_debug_offsets, layout};

/// The maps each profile object declares for Python (see `probes-ebpf/src/python.rs`).
pub const PROCS_MAP: &str = "PY_PROCS";
pub const STACKS_MAP: &str = "PY_STACKS";
/// Python stacks the kernel keeps until the next poll moves them here.
pub const STACKS_CAP: u32 = 4096;
/// Python processes set up at most (the kernel map's size).
pub const PROCS_CAP: u32 = 1024;
/// Stacks kept here (raw and decoded) before the caches are cleared.
const CACHE_CAP: usize = 100_000;
/// Binaries larger than this are not searched for `_PyRuntime`.
const MAX_BINARY: u64 = 512 << 20;

/// `/proc/<pid>/mem`, opened once per process.
struct ProcMem(std::fs::File);

impl Mem for ProcMem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact_at(buf, addr)
    }
}

/// Why a process that maps a Python binary is not unwound.
#[derive(Debug, thiserror::Error)]
pub enum NotUnwound {
    #[error("CPython {0}.{1}: Python frames are read for 3.10 to 3.13")]
    Version(u8, u8),
    #[error("{0}: no _PyRuntime symbol")]
    NoRuntime(String),
    #[error("{0}: {1}")]
    Binary(String, String),
    #[error("reading its memory: {0}")]
    Memory(std::io::Error),
    #[error("3.10 matches threads by their TLS base, which needs task_struct.thread.fsbase from the kernel's BTF")]
    NoFsbase,
    #[error("the kernel's map of Python processes is full ({PROCS_CAP})")]
    Full,
}

/// A Python binary mapped by a process: `python3.N` or `libpython3.N…so…`, with the minor
/// version its name says (None: `python3`, the version comes from `Py_Version`).
fn python_binary(path: &str) -> Option<Option<u8>> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython3")
        .or_else(|| name.strip_prefix("python3"))?;
    if rest.is_empty() {
        return Some(None);
    }
    let rest = rest.strip_prefix('.')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    if !(after.is_empty() || after.starts_with('.') || after.starts_with('d')) {
        return None;
    }
    Some(digits.parse().ok())
}

/// One Python process being unwound.
struct PyProcess {
    minor: u8,
    mem: ProcMem,
    codes: CodeCache,
}

/// What a run knows about Python: the kernel's maps, the processes set up, the stacks read.
pub struct Python {
    procs_map: BpfHash<MapData, u32, PyProc>,
    stacks_map: BpfHash<MapData, u32, PyStack>,
    stats: PerCpuArray<MapData, u64>,
    procs: HashMap<u32, PyProcess>,
    /// Processes looked at (Python or not), so each is read once.
    checked: HashSet<u32>,
    /// Stacks read from the kernel, by id (innermost first, truncated).
    raw: HashMap<u32, (Vec<PyFrame>, bool)>,
    /// (tgid, id) → segments outermost first, each outer → inner.
    decoded: HashMap<(u32, u32), Rc<[Vec<Frame>]>>,
    /// Processes unwound (pid → "CPython 3.11 (/usr/bin/python3.11)") and not (→ why).
    pub unwound: BTreeMap<u32, String>,
    pub not_unwound: BTreeMap<u32, String>,
    /// `task_struct.thread.fsbase`, from the kernel's BTF when the first 3.10 needs it (parsing
    /// BTF is start-up time the other versions do not need).
    fsbase_off: Option<Option<u32>>,
    scope: Scope,
    last_scan: Option<Instant>,
    py_module: Rc<str>,
    enabled: bool,
}

impl Python {
    /// Takes the Python maps of `session` and sets up the Python processes in scope (none
    /// when not `enabled`: `--no-python`).
    pub fn new(session: &mut Session, scope: &Scope, enabled: bool) -> Result<Python> {
        let take = |s: &mut Session, n: &'static str| s.take_map(n);
        let procs_map = BpfHash::try_from(take(session, PROCS_MAP)?).context(PROCS_MAP)?;
        let stacks_map = BpfHash::try_from(take(session, STACKS_MAP)?).context(STACKS_MAP)?;
        let stats = PerCpuArray::try_from(take(session, "PY_STATS")?).context("PY_STATS")?;
        let mut p = Python {
            procs_map,
            stacks_map,
            stats,
            procs: HashMap::new(),
            checked: HashSet::new(),
            raw: HashMap::new(),
            decoded: HashMap::new(),
            unwound: BTreeMap::new(),
            not_unwound: BTreeMap::new(),
            fsbase_off: None,
            scope: scope.clone(),
            last_scan: None,
            py_module: Rc::from("python"),
            enabled,
        };
        p.scan();
        Ok(p)
    }

    /// Sets up the processes in scope not looked at yet (at most once a second).
    fn scan(&mut self) {
        if !self.enabled
            || self
                .last_scan
                .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1))
        {
            return;
        }
        self.last_scan = Some(Instant::now());
        let pids: Vec<u32> = if !self.scope.pids.is_empty() && !self.scope.children {
            self.scope.pids.clone()
        } else {
            crate::host::proc::pids()
        };
        for pid in pids {
            if self.checked.insert(pid) {
                self.set_up(pid);
            }
        }
    }

    fn set_up(&mut self, pid: u32) {
        let Ok(maps) = crate::host::maps::read_exec(pid) else {
            return;
        };
        // libpython first: with a shared interpreter the executable has no _PyRuntime.
        let mut cands: Vec<&crate::host::maps::ExecMap> = maps
            .iter()
            .filter(|m| python_binary(&m.path).is_some())
            .collect();
        if cands.is_empty() {
            return;
        }
        cands.sort_by_key(|m| !m.path.contains("libpython"));
        let mut why = None;
        for m in cands {
            match self.try_binary(pid, m) {
                Ok(()) => return,
                Err(e) => why = Some(e),
            }
        }
        if let Some(e) = why {
            self.not_unwound.insert(pid, e.to_string());
        }
    }

    fn try_binary(&mut self, pid: u32, m: &crate::host::maps::ExecMap) -> Result<(), NotUnwound> {
        let by_name = python_binary(&m.path).flatten();
        let shown = crate::report::sanitize::text(m.path.as_bytes());
        let path = crate::host::proc_path(&format!("{pid}/map_files/{:x}-{:x}", m.start, m.end));
        let f = crate::host::open_regular(&path, MAX_BINARY)
            .map_err(|e| NotUnwound::Binary(shown.clone(), e.to_string()))?;
        let data = object::ReadCache::new(f);
        let elf = object::File::parse(&data)
            .map_err(|e| NotUnwound::Binary(shown.clone(), e.to_string()))?;
        use object::{Object, ObjectSegment, ObjectSymbol};
        let find = |name: &str| {
            elf.symbols()
                .chain(elf.dynamic_symbols())
                .find(|s| s.name() == Ok(name) && s.address() != 0)
                .map(|s| s.address())
        };
        let runtime = find("_PyRuntime").ok_or_else(|| NotUnwound::NoRuntime(shown.clone()))?;
        let version = find("Py_Version");
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|s| {
                let (o, sz) = s.file_range();
                (o, sz, s.address())
            })
            .collect();
        let bias = crate::host::maps::load_bias(&segments, m.start, m.offset).ok_or_else(|| {
            NotUnwound::Binary(shown.clone(), "no segment for its mapping".into())
        })?;
        let mem = std::fs::File::open(crate::host::proc_path(&format!("{pid}/mem")))
            .map(ProcMem)
            .map_err(NotUnwound::Memory)?;
        let minor = match version {
            Some(v) => {
                let mut b = [0u8; 4];
                mem.read(v.wrapping_add(bias), &mut b)
                    .map_err(NotUnwound::Memory)?;
                let hex = u32::from_le_bytes(b);
                let (major, minor) = ((hex >> 24) as u8, (hex >> 16) as u8);
                if major != 3 {
                    return Err(NotUnwound::Version(major, minor));
                }
                minor
            }
            None => by_name.ok_or_else(|| NotUnwound::NoRuntime(shown.clone()))?,
        };
        let runtime = runtime.wrapping_add(bias);
        let mut l = layout(minor).ok_or(NotUnwound::Version(3, minor))?;
        let codes = code::layout(minor).ok_or(NotUnwound::Version(3, minor))?;
        if minor >= 13 {
            apply_debug_offsets(&mem, runtime, &mut l);
        }
        if l.proc.tid_kind == PY_TID_FSBASE {
            let off = *self.fsbase_off.get_or_insert_with(|| {
                let btf = crate::kernel::btf::vmlinux().ok()?;
                let thread = btf.member("task_struct", "thread").ok()?.offset;
                let fsbase = btf.member("thread_struct", "fsbase").ok()?.offset;
                Some(thread + fsbase)
            });
            l.proc.fsbase_off = off.ok_or(NotUnwound::NoFsbase)?;
        }
        let mut b = [0u8; 8];
        mem.read(runtime + l.runtime_interpreters_head, &mut b)
            .map_err(NotUnwound::Memory)?;
        let interp = u64::from_le_bytes(b);
        if interp == 0 {
            return Err(NotUnwound::Memory(std::io::Error::other(
                "no interpreter yet (_PyRuntime.interpreters.head is NULL)",
            )));
        }
        let proc = PyProc {
            threads_head: interp + l.interp_threads_head,
            ..l.proc
        };
        self.procs_map
            .insert(pid, proc, 0)
            .map_err(|_| NotUnwound::Full)?;
        self.unwound
            .insert(pid, format!("CPython 3.{minor} ({shown})"));
        self.procs.insert(
            pid,
            PyProcess {
                minor,
                mem,
                codes: CodeCache::new(codes),
            },
        );
        Ok(())
    }

    /// A poll: sets up new processes, moves the kernel's new stacks here (freeing their slots)
    /// and decodes those of `seen` (tgid, stack id) while their processes run.
    pub fn poll(&mut self, seen: impl IntoIterator<Item = (u32, u32)>) {
        self.scan();
        let ids: Vec<u32> = self.stacks_map.keys().filter_map(|k| k.ok()).collect();
        if self.raw.len() + ids.len() > CACHE_CAP {
            self.raw.clear();
            self.decoded.clear();
        }
        for id in ids {
            if let Ok(s) = self.stacks_map.get(&id, 0) {
                let n = (s.len as usize).min(s.frames.len());
                self.raw
                    .insert(id, (s.frames[..n].to_vec(), s.truncated != 0));
            }
            let _ = self.stacks_map.remove(&id);
        }
        for (tgid, id) in seen {
            if id != 0 {
                self.segments(tgid, id);
            }
        }
    }

    /// The Python stack `id` of process `tgid`: segments outermost first (one per evaluator
    /// call), each outer → inner. None: no such stack (or not read in time).
    pub fn segments(&mut self, tgid: u32, id: u32) -> Option<Rc<[Vec<Frame>]>> {
        if id == 0 {
            return None;
        }
        if let Some(d) = self.decoded.get(&(tgid, id)) {
            return Some(d.clone());
        }
        if !self.raw.contains_key(&id) {
            let s = self.stacks_map.get(&id, 0).ok()?;
            let n = (s.len as usize).min(s.frames.len());
            self.raw
                .insert(id, (s.frames[..n].to_vec(), s.truncated != 0));
        }
        let (frames, truncated) = self.raw.get(&id)?;
        let p = self.procs.get_mut(&tgid)?;
        let mut segs: Vec<Vec<Frame>> = vec![Vec::new()];
        for f in frames {
            // A 3.12+ entry shim: the frames before it (inner) ran in one evaluator call.
            if f.code == 0 {
                if segs.last().is_some_and(|s| !s.is_empty()) {
                    segs.push(Vec::new());
                }
                continue;
            }
            let frame = match p.codes.frame(&p.mem, f.code, f.instr & !PY_ENTRY) {
                Ok(i) if i.incomplete => None,
                Ok(i) => Some(Frame {
                    function: i.function,
                    module: i.file,
                    line: i.line,
                    at: crate::tools::profile::symbols::At::NONE,
                }),
                Err(_) => Some(Frame {
                    function: Rc::from("[unreadable Python frame]"),
                    module: self.py_module.clone(),
                    line: 0,
                    at: crate::tools::profile::symbols::At::NONE,
                }),
            };
            if let (Some(fr), Some(seg)) = (frame, segs.last_mut()) {
                seg.push(fr);
            }
            // 3.10: every frame runs in an evaluator call of its own.
            if (f.instr & PY_ENTRY != 0 || p.minor == 10)
                && segs.last().is_some_and(|s| !s.is_empty())
            {
                segs.push(Vec::new());
            }
        }
        if *truncated {
            if let Some(seg) = segs.last_mut() {
                seg.push(Frame {
                    function: Rc::from("[deeper Python frames]"),
                    module: self.py_module.clone(),
                    line: 0,
                    at: crate::tools::profile::symbols::At::NONE,
                });
            }
        }
        segs.retain(|s| !s.is_empty());
        for s in &mut segs {
            s.reverse();
        }
        segs.reverse();
        let out: Rc<[Vec<Frame>]> = Rc::from(segs);
        self.decoded.insert((tgid, id), out.clone());
        Some(out)
    }

    /// The walk's counters summed over CPUs (`PY_STAT_*`).
    pub fn stats(&self) -> [u64; PY_NSTATS as usize] {
        let mut out = [0u64; PY_NSTATS as usize];
        for (i, o) in out.iter_mut().enumerate() {
            if let Ok(v) = self.stats.get(&(i as u32), 0) {
                *o = v.iter().sum();
            }
        }
        out
    }

    /// The report's notes: which processes were unwound, which not and why, and what the
    /// kernel could not record.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let list = |m: &BTreeMap<u32, String>| {
            let mut v: Vec<String> = m.iter().take(8).map(|(p, s)| format!("{p} {s}")).collect();
            if m.len() > 8 {
                v.push(format!("and {} more", m.len() - 8));
            }
            v.join(", ")
        };
        if !self.unwound.is_empty() {
            let st = self.stats();
            out.push(format!(
                "Python frames read for pid {}; stacks {}, deeper than 64 frames {}, lost to a full map {}, threads without a thread state {}, thread states with no frame {}",
                list(&self.unwound),
                st[PY_STAT_STACKS as usize],
                st[PY_STAT_TRUNCATED as usize],
                st[PY_STAT_MAP_FULL as usize],
                st[PY_STAT_NO_THREAD as usize],
                st[PY_STAT_NO_FRAME as usize],
            ));
        }
        if !self.not_unwound.is_empty() {
            out.push(format!(
                "Python frames not read for pid {}",
                list(&self.not_unwound)
            ));
        }
        out
    }

    /// Ends a window: forgets processes that are gone (a pid reused later is looked at again),
    /// and the decoded names of the others: a code object freed in a long run may leave its
    /// address to another, so names are read again each window.
    pub fn end_window(&mut self) {
        self.decoded.clear();
        for p in self.procs.values_mut() {
            p.codes.clear();
        }
        let gone: Vec<u32> = self
            .procs
            .keys()
            .copied()
            .filter(|&p| !crate::host::proc::exists(p))
            .collect();
        for p in gone {
            self.procs.remove(&p);
            let _ = self.procs_map.remove(&p);
            self.checked.remove(&p);
        }
        self.checked.retain(|&p| crate::host::proc::exists(p));
    }
}

/// Whether `f` is the interpreter's evaluation loop (a native frame).
fn is_eval(f: &Frame) -> bool {
    f.line == 0 && f.function.starts_with("_PyEval_EvalFrameDefault")
}

/// Splices the Python `segs` (outermost first) into the native user stack `native`
/// (outermost first) at its evaluator frames: the innermost segment replaces the innermost
/// `_PyEval_EvalFrameDefault`, and so outward; segments left over (the native walk stopped
/// early) go to the outermost evaluator frame. Without an evaluator frame (frame pointers in a
/// binary built without them) the Python frames go first and the native ones after them.
pub fn merge(native: &[Frame], segs: &[Vec<Frame>]) -> Vec<Frame> {
    let evals: Vec<usize> = (0..native.len()).filter(|&i| is_eval(&native[i])).collect();
    if segs.is_empty() {
        return native.to_vec();
    }
    if evals.is_empty() {
        let mut out: Vec<Frame> = segs.iter().flatten().cloned().collect();
        out.extend(native.iter().cloned());
        return out;
    }
    // Segment for each evaluator frame, aligned from the inside.
    let mut at: HashMap<usize, Vec<Frame>> = HashMap::new();
    let (ne, ns) = (evals.len(), segs.len());
    for (k, &e) in evals.iter().enumerate() {
        // The k-th evaluator (outermost first) takes segment k + ns - ne when it exists; the
        // outermost one also takes every segment before that.
        let own = (k + ns).checked_sub(ne);
        let from = if k == 0 { 0 } else { own.unwrap_or(ns) };
        let to = own.map_or(0, |o| o + 1);
        if from < to {
            at.insert(e, segs[from..to].iter().flatten().cloned().collect());
        }
    }
    let mut out = Vec::with_capacity(native.len() + segs.iter().map(Vec::len).sum::<usize>());
    for (i, f) in native.iter().enumerate() {
        match at.remove(&i) {
            Some(py) => out.extend(py),
            None => out.push(f.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str) -> Frame {
        super::super::stacks::marker(name, "python3.11")
    }
    fn py(name: &str, line: u32) -> Frame {
        Frame {
            function: Rc::from(name),
            module: Rc::from("app.py"),
            line,
            at: crate::tools::profile::symbols::At::NONE,
        }
    }
    fn names(v: &[Frame]) -> Vec<String> {
        v.iter().map(|f| f.function.to_string()).collect()
    }

    #[test]
    fn binaries_are_named_with_their_version() {
        assert_eq!(python_binary("/usr/bin/python3.11"), Some(Some(11)));
        assert_eq!(python_binary("/usr/bin/python3"), Some(None));
        assert_eq!(
            python_binary("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"),
            Some(Some(12))
        );
        assert_eq!(python_binary("/usr/lib/libpython3.13d.so"), Some(Some(13)));
        assert_eq!(python_binary("/usr/bin/python3-config"), None);
        assert_eq!(python_binary("/usr/bin/python2.7"), None);
        assert_eq!(python_binary("/usr/lib/libpython3.11x.so"), None);
    }

    #[test]
    fn every_supported_version_has_both_layouts() {
        for minor in 10..=13 {
            assert!(
                layout(minor).is_some() && code::layout(minor).is_some(),
                "3.{minor}"
            );
        }
        assert!(layout(9).is_none() && layout(14).is_none());
    }

    #[test]
    fn segments_replace_the_evaluator_frames_from_the_inside() {
        let native = [
            n("main"),
            n("_PyEval_EvalFrameDefault"),
            n("PyObject_Call"),
            n("_PyEval_EvalFrameDefault"),
            n("encoder_call"),
        ];
        let segs = vec![
            vec![py("<module>", 50), py("handler", 41)],
            vec![py("dumps", 231)],
        ];
        assert_eq!(
            names(&merge(&native, &segs)),
            [
                "main",
                "<module>",
                "handler",
                "PyObject_Call",
                "dumps",
                "encoder_call"
            ]
        );
    }

    #[test]
    fn extra_segments_go_to_the_outermost_evaluator() {
        let native = [n("main"), n("_PyEval_EvalFrameDefault"), n("encoder_call")];
        let segs = vec![
            vec![py("<module>", 1)],
            vec![py("handler", 2)],
            vec![py("dumps", 3)],
        ];
        assert_eq!(
            names(&merge(&native, &segs)),
            ["main", "<module>", "handler", "dumps", "encoder_call"]
        );
        // More evaluator frames than segments: the outer ones stay as they are.
        let native = [
            n("_PyEval_EvalFrameDefault"),
            n("x"),
            n("_PyEval_EvalFrameDefault"),
        ];
        assert_eq!(
            names(&merge(&native, &[vec![py("f", 1)]])),
            ["_PyEval_EvalFrameDefault", "x", "f"]
        );
    }

    #[test]
    fn without_an_evaluator_frame_python_goes_first() {
        let native = [n("encoder_call")];
        let segs = vec![vec![py("handler", 2)], vec![py("dumps", 3)]];
        assert_eq!(
            names(&merge(&native, &segs)),
            ["handler", "dumps", "encoder_call"]
        );
        assert_eq!(names(&merge(&native, &[])), ["encoder_call"]);
    }
}
