//! Stack symbolisation with blazesym: user frames through the process (`/proc/<pid>/maps`, the
//! mapped files via `/proc/<pid>/map_files/` so binaries inside containers and deleted files
//! resolve, ELF symbols and DWARF where present), perf map files `/tmp/perf-<pid>.map` for JITs
//! (read by `perf_map.rs`, never by blazesym: see there), kernel frames through kallsyms.
//!
//! A process's mappings and perf map are cached the first time its stacks are seen, its mapped
//! binaries opened then (`captured.rs`), and its stacks are resolved while the window runs
//! (every poll), so a process that exits before the window ends is still named — by the files
//! it ran, also inside a container. Caches are bounded: resolved stacks and open files of
//! processes that are gone are dropped at the end of each window, and stacks past
//! [`MAX_STACKS`].

use std::{
    collections::{BTreeMap, HashMap},
    rc::Rc,
};

use super::perf_map::PerfMap;
use blazesym::{
    symbolize::{
        cache,
        source::{Elf, Kernel, Process, Source},
        Input, Symbolized, Symbolizer,
    },
    Pid,
};

/// One frame as shown: the function and the object it is in (its file name's stem); for a
/// Python frame, the function's qualified name, its source file and the line it is at.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub function: Rc<str>,
    pub module: Rc<str>,
    /// The source line (Python frames; 0: none).
    pub line: u32,
    /// Where it was (pprof only).
    pub at: At,
}

/// Where a frame was, for pprof's mappings and locations only: a sampled address in the
/// frame's function and the file mapping it fell in. It is never part of a frame's identity
/// (equal, hashed and ordered as nothing), so every table still merges a function's samples
/// taken at different instructions, and the address kept is the first one seen.
#[derive(Clone, Debug, Default)]
pub struct At {
    pub addr: u64,
    pub map: Option<Rc<MapInfo>>,
}

impl At {
    pub const NONE: At = At { addr: 0, map: None };
}

impl PartialEq for At {
    fn eq(&self, _: &At) -> bool {
        true
    }
}
impl Eq for At {}
impl std::hash::Hash for At {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}
impl PartialOrd for At {
    fn partial_cmp(&self, o: &At) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for At {
    fn cmp(&self, _: &At) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// A file mapping as pprof's `Mapping` describes it: the range a process mapped, the offset in
/// the file, the path the process mapped it from and the file's GNU build id (hex, empty when
/// the file has none), which lets a backend find its debug info.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MapInfo {
    pub path: Rc<str>,
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub build_id: Rc<str>,
}

/// Resolved stacks kept at most (user stacks per process plus kernel stacks).
pub const MAX_STACKS: usize = 200_000;
/// Refused perf maps named in the report (the rest are not listed).
const MAX_REFUSED_NAMED: usize = 16;

pub struct Resolver {
    sym: Symbolizer,
    /// (tgid, stack id) → frames, innermost first.
    user: HashMap<(u32, i32), Rc<[Frame]>>,
    kernel: HashMap<i32, Rc<[Frame]>>,
    /// Processes whose mappings were cached, with the poll that cached them last.
    cached: HashMap<u32, u64>,
    poll: u64,
    /// The mapped binaries of the processes seen, open (for those that exit).
    captured: super::captured::Captured,
    /// Perf maps of the processes seen (`None`: none, or refused).
    perf_maps: HashMap<u32, Option<Rc<PerfMap>>>,
    /// Perf maps refused in this run, by pid: the reason (for the report's notes).
    refused: BTreeMap<u32, String>,
    kernel_module: Rc<str>,
    unknown: Rc<str>,
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver {
            sym: Symbolizer::builder().enable_inlined_fns(false).build(),
            user: HashMap::new(),
            kernel: HashMap::new(),
            cached: HashMap::new(),
            poll: 0,
            captured: Default::default(),
            perf_maps: HashMap::new(),
            refused: BTreeMap::new(),
            kernel_module: Rc::from("kernel"),
            unknown: Rc::from("[unknown]"),
        }
    }
}

/// The short name of a mapped object: `_json` for `/usr/lib/python3.11/lib-dynload/
/// _json.cpython-311-x86_64-linux-gnu.so`, `libc` for `libc.so.6`, `python3.11` for a binary.
pub fn module_stem(path: &str) -> &str {
    let base = path.rsplit('/').next().unwrap_or(path);
    let cut = [".cpython-", ".so"]
        .iter()
        .filter_map(|p| base.find(p))
        .min()
        .unwrap_or(base.len());
    if cut == 0 {
        base
    } else {
        &base[..cut]
    }
}

/// Addresses to look up: the interrupted instruction for the innermost frame, and one byte
/// before each return address for the others (the call itself, which may be the last
/// instruction of its function).
fn lookup_addrs(ips: &[u64]) -> Vec<u64> {
    ips.iter()
        .enumerate()
        .map(|(i, &ip)| if i == 0 { ip } else { ip.saturating_sub(1) })
        .collect()
}

impl Resolver {
    fn frames(&self, syms: Vec<Symbolized>, module: Option<&Rc<str>>) -> Rc<[Frame]> {
        syms.into_iter()
            .map(|s| match s {
                Symbolized::Sym(s) => Frame {
                    function: Rc::from(s.name.as_ref()),
                    module: match (module, &s.module) {
                        (Some(m), _) => m.clone(),
                        (None, Some(m)) => Rc::from(module_stem(&m.to_string_lossy())),
                        (None, None) => self.unknown.clone(),
                    },
                    line: 0,
                    at: At::NONE,
                },
                Symbolized::Unknown(_) => Frame {
                    function: self.unknown.clone(),
                    module: module.cloned().unwrap_or_else(|| self.unknown.clone()),
                    line: 0,
                    at: At::NONE,
                },
            })
            .collect()
    }

    /// Starts a poll: mappings are read again (at most once per poll and process), since a
    /// process maps libraries as it runs (Python imports `_json` when first asked to).
    pub fn begin_poll(&mut self) {
        self.poll += 1;
    }

    /// Remembers `tgid`'s mappings and perf map now, and opens the binaries it maps, so its
    /// stacks resolve after it exits (at most once per poll).
    pub fn note_process(&mut self, tgid: u32) {
        if self.cached.insert(tgid, self.poll) != Some(self.poll) {
            let mut c = cache::Process::new(Pid::from(tgid));
            c.cache_perf_map = false;
            // A process gone already is resolved as unknown.
            let _ = self.sym.cache(&cache::Cache::Process(c));
            self.captured.capture(tgid);
            let old = self.perf_maps.get(&tgid).cloned().flatten();
            let map = match PerfMap::read(tgid, old) {
                Ok(m) => m,
                Err(e) => {
                    if self.refused.len() < MAX_REFUSED_NAMED {
                        self.refused.insert(tgid, e.to_string());
                    }
                    None
                }
            };
            self.perf_maps.insert(tgid, map);
        }
    }

    /// One report note per perf map refused in this run: `perf map ignored: /proc/7/root/tmp/
    /// perf-7.map is a FIFO, not a regular file` (escaped: the path is the process's).
    pub fn refused_notes(&self) -> Vec<String> {
        self.refused
            .values()
            .map(|why| {
                format!(
                    "perf map ignored: {}",
                    crate::report::sanitize::text(why.as_bytes())
                )
            })
            .collect()
    }

    /// Whether the user stack `id` of `tgid` is resolved already.
    pub fn has_user(&self, tgid: u32, id: i32) -> bool {
        self.user.contains_key(&(tgid, id))
    }

    /// The resolved user stack `id` of `tgid`, if it was resolved.
    pub fn user_frames(&self, tgid: u32, id: i32) -> Option<Rc<[Frame]>> {
        self.user.get(&(tgid, id)).cloned()
    }

    /// Resolves the user stack `id` of `tgid` (return addresses `ips`, innermost first).
    pub fn resolve_user(&mut self, tgid: u32, id: i32, ips: &[u64]) -> Rc<[Frame]> {
        if let Some(f) = self.user.get(&(tgid, id)) {
            return f.clone();
        }
        let alive = crate::host::proc::exists(tgid);
        if alive {
            self.note_process(tgid);
        }
        let addrs = lookup_addrs(ips);
        let frames = if !alive && self.captured.has(tgid) {
            self.resolve_exited(tgid, &addrs)
        } else {
            let syms = self.by_process(tgid, alive, &addrs);
            let frames = if syms.is_empty() {
                addrs.iter().map(|_| self.unknown_frame(None)).collect()
            } else {
                self.frames(syms, None)
            };
            self.name_modules(tgid, &addrs, frames)
        };
        let frames = self.name_jit(tgid, &addrs, frames);
        let frames = self.place(tgid, &addrs, frames);
        self.bound();
        self.user.insert((tgid, id), frames.clone());
        frames
    }

    /// Each frame's address and the file mapping it is in, for pprof.
    fn place(&self, tgid: u32, addrs: &[u64], frames: Rc<[Frame]>) -> Rc<[Frame]> {
        frames
            .iter()
            .zip(addrs)
            .map(|(f, &addr)| Frame {
                at: At {
                    addr,
                    map: self.captured.map_info(tgid, addr),
                },
                ..f.clone()
            })
            .collect()
    }

    /// Frames still unknown that fall in a function of `tgid`'s perf map take its name.
    fn name_jit(&self, tgid: u32, addrs: &[u64], frames: Rc<[Frame]>) -> Rc<[Frame]> {
        let Some(Some(map)) = self.perf_maps.get(&tgid) else {
            return frames;
        };
        if !frames
            .iter()
            .any(|f| Rc::ptr_eq(&f.function, &self.unknown))
        {
            return frames;
        }
        frames
            .iter()
            .zip(addrs)
            .map(|(f, &a)| match map.lookup(a) {
                Some(name) if Rc::ptr_eq(&f.function, &self.unknown) => Frame {
                    function: name.clone(),
                    module: map.module.clone(),
                    line: 0,
                    at: At::NONE,
                },
                _ => f.clone(),
            })
            .collect()
    }

    /// `addrs` of `tgid` through the process (its maps, live or cached, and its perf map); one
    /// result per address, or none.
    fn by_process(&self, tgid: u32, alive: bool, addrs: &[u64]) -> Vec<Symbolized<'_>> {
        let mut p = Process::new(Pid::from(tgid));
        // Cached mappings of a process that has exited can only be used by path.
        p.map_files = alive;
        p.perf_map = false;
        match self
            .sym
            .symbolize(&Source::Process(p), Input::AbsAddr(addrs))
        {
            Ok(s) if s.len() == addrs.len() => s,
            _ => Vec::new(),
        }
    }

    /// The frames of an exited process whose binaries were opened while it ran: addresses in
    /// them are looked up in those very files (by file offset), the others (JIT code of a perf
    /// map, anonymous memory) through the cached process.
    fn resolve_exited(&mut self, tgid: u32, addrs: &[u64]) -> Rc<[Frame]> {
        let rest: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| self.captured.locate(tgid, *a).is_none())
            .collect();
        let by_proc = self.by_process(tgid, false, &rest);
        let mut by_proc = self.frames(by_proc, None).to_vec().into_iter();
        let mut out = Vec::with_capacity(addrs.len());
        for &a in addrs {
            let Some(at) = self.captured.locate(tgid, a) else {
                out.push(by_proc.next().unwrap_or_else(|| self.unknown_frame(None)));
                continue;
            };
            let module: Rc<str> = Rc::from(module_stem(&at.mapped_as));
            let src = Source::Elf(Elf::new(at.file));
            let sym = self
                .sym
                .symbolize_single(&src, Input::FileOffset(at.offset))
                .ok();
            out.push(match sym {
                Some(s) => self.frames(vec![s], Some(&module))[0].clone(),
                None => self.unknown_frame(Some(&module)),
            });
        }
        out.into()
    }

    /// Frames with no symbol keep the object they are in (`[unknown]` in `python3.11` rather
    /// than nowhere): a stripped binary (Debian's /usr/bin/python3) is then still told from
    /// JIT code or anonymous memory, from the mappings captured while the process ran.
    fn name_modules(&self, tgid: u32, addrs: &[u64], frames: Rc<[Frame]>) -> Rc<[Frame]> {
        if !frames.iter().any(|f| Rc::ptr_eq(&f.module, &self.unknown)) {
            return frames;
        }
        frames
            .iter()
            .zip(addrs)
            .map(|(f, &a)| match self.captured.locate(tgid, a) {
                Some(at) if Rc::ptr_eq(&f.module, &self.unknown) => Frame {
                    function: f.function.clone(),
                    module: Rc::from(module_stem(&at.mapped_as)),
                    line: 0,
                    at: At::NONE,
                },
                _ => f.clone(),
            })
            .collect()
    }

    fn unknown_frame(&self, module: Option<&Rc<str>>) -> Frame {
        Frame {
            function: self.unknown.clone(),
            module: module.cloned().unwrap_or_else(|| self.unknown.clone()),
            line: 0,
            at: At::NONE,
        }
    }

    /// Resolves kernel stack `id` (addresses `ips`, innermost first) through kallsyms.
    pub fn resolve_kernel(&mut self, id: i32, ips: &[u64]) -> Rc<[Frame]> {
        if let Some(f) = self.kernel.get(&id) {
            return f.clone();
        }
        let addrs = lookup_addrs(ips);
        let src = Source::Kernel(Kernel {
            // The running kernel's kallsyms: a vmlinux found on disk may not match it.
            vmlinux: blazesym::MaybeDefault::None,
            ..Kernel::default()
        });
        let syms = self
            .sym
            .symbolize(&src, Input::AbsAddr(&addrs))
            .unwrap_or_default();
        let km = self.kernel_module.clone();
        let frames: Rc<[Frame]> = if syms.len() == addrs.len() {
            let frames = self.frames(syms, Some(&km));
            frames
                .iter()
                .zip(&addrs)
                .map(|(f, &addr)| Frame {
                    at: At { addr, map: None },
                    ..f.clone()
                })
                .collect()
        } else {
            addrs
                .iter()
                .map(|&addr| Frame {
                    function: self.unknown.clone(),
                    module: km.clone(),
                    line: 0,
                    at: At { addr, map: None },
                })
                .collect()
        };
        self.bound();
        self.kernel.insert(id, frames.clone());
        frames
    }

    /// Ends a window: forgets processes that have exited (their stacks were resolved in it).
    pub fn end_window(&mut self) {
        let gone: Vec<u32> = self
            .cached
            .keys()
            .copied()
            .filter(|p| !crate::host::proc::exists(*p))
            .collect();
        use blazesym::symbolize::evict;
        for p in &gone {
            self.cached.remove(p);
            self.perf_maps.remove(p);
            let _ = self
                .sym
                .evict(&evict::Evict::Process(evict::Process::new(Pid::from(*p))));
        }
        // A descriptor number closed now may name another file later.
        for path in self.captured.forget(&gone) {
            let _ = self.sym.evict(&evict::Evict::Elf(evict::Elf::new(path)));
        }
        self.user.retain(|(t, _), _| !gone.contains(t));
    }

    fn bound(&mut self) {
        if self.user.len() + self.kernel.len() >= MAX_STACKS {
            self.user.clear();
            self.kernel.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_stems() {
        assert_eq!(
            module_stem("/usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so"),
            "_json"
        );
        assert_eq!(module_stem("/usr/lib/x86_64-linux-gnu/libc.so.6"), "libc");
        assert_eq!(module_stem("/usr/bin/python3.11"), "python3.11");
        assert_eq!(module_stem("hot"), "hot");
        assert_eq!(module_stem("/x/.so"), ".so");
    }

    #[test]
    fn return_addresses_are_looked_up_one_byte_back() {
        assert_eq!(lookup_addrs(&[100, 200, 0]), vec![100, 199, 0]);
    }
}
