//! `--unwind dwarf`: user stacks of code without frame pointers, unwound in userspace from the
//! registers and stack bytes each sample carries ([`DwarfSample`]) with the mapped binaries'
//! `.eh_frame` CFI (`framehop`, as samply does; sections read with `object`).
//!
//! Per process, an unwinder holds one module per executable file mapping (from
//! `/proc/<pid>/maps`); the maps are read when a process is first seen and again (once per poll)
//! when a sample's instruction pointer is outside every known module (a new `dlopen`). The
//! unwind sections of each file are read once and shared, keyed by (device, inode); both caches
//! are bounded ([`MAX_FILES`], [`MAX_PROCS`]: cleared when full).

use std::{collections::HashMap, ops::Range, sync::Arc};

use framehop::{
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
    ExplicitModuleSectionInfo, Module, Unwinder as _,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use probes_common::profile::DwarfSample;

use crate::host::{maps, proc_path};

/// Binaries whose unwind sections are kept.
pub const MAX_FILES: usize = 512;
/// Processes whose unwinders are kept.
pub const MAX_PROCS: usize = 4096;
/// Frames kept per stack (as `bpf_get_stackid`'s default depth).
pub const MAX_FRAMES: usize = 127;

type Data = Arc<[u8]>;

/// What framehop needs of one binary: its unwind sections and its loadable segments.
struct FileInfo {
    eh_frame: Option<(Range<u64>, Data)>,
    eh_frame_hdr: Option<(Range<u64>, Data)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    /// (file offset, size in file, virtual address) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl FileInfo {
    fn parse(data: &[u8]) -> Option<FileInfo> {
        let f = object::File::parse(data).ok()?;
        let section = |name: &str| {
            let s = f.section_by_name(name)?;
            let r = s.address()..s.address() + s.size();
            Some((r, Data::from(s.data().ok()?)))
        };
        let range = |name: &str| {
            let s = f.section_by_name(name)?;
            Some(s.address()..s.address() + s.size())
        };
        Some(FileInfo {
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            text: range(".text"),
            got: range(".got"),
            segments: f
                .segments()
                .map(|s| {
                    let (off, size) = s.file_range();
                    (off, size, s.address())
                })
                .collect(),
        })
    }

    /// Load bias of a mapping of file offset `offset` at `start`: avma = svma + bias.
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let &(off, _, vaddr) = self
            .segments
            .iter()
            .find(|&&(o, sz, _)| o & !0xfff <= offset && offset < o + sz)?;
        Some(
            start
                .wrapping_sub(offset)
                .wrapping_add(off)
                .wrapping_sub(vaddr),
        )
    }
}

struct Proc {
    unwinder: UnwinderX86_64<Data>,
    ranges: Vec<Range<u64>>,
    /// The poll whose maps the unwinder holds.
    poll: u64,
}

#[derive(Default)]
pub struct Unwinder {
    files: HashMap<(i32, i32, u64), Option<Arc<FileInfo>>>,
    procs: HashMap<u32, Proc>,
    cache: CacheX86_64,
    poll: u64,
}

impl Unwinder {
    pub fn begin_poll(&mut self) {
        self.poll += 1;
    }

    /// Forgets processes that are gone (end of window).
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.procs.retain(|&p, _| alive(p));
    }

    fn file(&mut self, pid: u32, m: &maps::ExecMap) -> Option<Arc<FileInfo>> {
        let key = (m.dev.0, m.dev.1, m.inode);
        if let Some(f) = self.files.get(&key) {
            return f.clone();
        }
        if self.files.len() >= MAX_FILES {
            self.files.clear();
        }
        // map_files opens the very file mapped (also deleted or in another mount namespace);
        // the root path is the fallback when map_files needs more privilege.
        let by_map = proc_path(&format!("{pid}/map_files/{:x}-{:x}", m.start, m.end));
        let by_root = proc_path(&format!("{pid}/root{}", m.path));
        let info = std::fs::read(by_map)
            .or_else(|_| std::fs::read(by_root))
            .ok()
            .and_then(|d| FileInfo::parse(&d))
            .map(Arc::new);
        self.files.insert(key, info.clone());
        info
    }

    fn load(&mut self, pid: u32) -> Proc {
        let mut unwinder = UnwinderX86_64::new();
        let mut ranges = Vec::new();
        for m in maps::read_exec(pid).unwrap_or_default() {
            let Some(f) = self.file(pid, &m) else {
                continue;
            };
            let Some(bias) = f.bias(m.start, m.offset) else {
                continue;
            };
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: f.text.clone(),
                got_svma: f.got.clone(),
                eh_frame_svma: f.eh_frame.as_ref().map(|e| e.0.clone()),
                eh_frame: f.eh_frame.as_ref().map(|e| e.1.clone()),
                eh_frame_hdr_svma: f.eh_frame_hdr.as_ref().map(|e| e.0.clone()),
                eh_frame_hdr: f.eh_frame_hdr.as_ref().map(|e| e.1.clone()),
                ..Default::default()
            };
            unwinder.add_module(Module::new(m.path.clone(), m.start..m.end, bias, info));
            ranges.push(m.start..m.end);
        }
        Proc {
            unwinder,
            ranges,
            poll: self.poll,
        }
    }

    /// The user stack of one sample, innermost first (the interrupted instruction, then return
    /// addresses); empty when the process's maps cannot be read.
    pub fn unwind(&mut self, s: &DwarfSample) -> Vec<u64> {
        let known = self
            .procs
            .get(&s.tgid)
            .map(|p| p.poll == self.poll || p.ranges.iter().any(|r| r.contains(&s.ip)));
        if known != Some(true) {
            if self.procs.len() >= MAX_PROCS {
                self.procs.clear();
            }
            let p = self.load(s.tgid);
            self.procs.insert(s.tgid, p);
        }
        let Some(p) = self.procs.get(&s.tgid) else {
            return Vec::new();
        };
        let len = (s.len as usize).min(s.stack.len()) as u64;
        let (sp, stack) = (s.sp, &s.stack);
        let mut read = |addr: u64| {
            let off = addr.checked_sub(sp).filter(|o| o + 8 <= len).ok_or(())? as usize;
            Ok(u64::from_le_bytes(
                stack[off..off + 8].try_into().map_err(|_| ())?,
            ))
        };
        let regs = UnwindRegsX86_64::new(s.ip, s.sp, s.bp);
        let mut it = p
            .unwinder
            .iter_frames(s.ip, regs, &mut self.cache, &mut read);
        let mut out = Vec::new();
        while let Ok(Some(f)) = it.next() {
            out.push(f.address());
            if out.len() >= MAX_FRAMES {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_of_a_pie_text_mapping() {
        let f = FileInfo {
            eh_frame: None,
            eh_frame_hdr: None,
            text: None,
            got: None,
            segments: vec![(0, 0x6e000, 0), (0x6f000, 0x2de000, 0x6f000)],
        };
        // r-xp at offset 0x6f000 mapped at 0x55d0c4a6f000: loaded at 0x55d0c4a00000.
        assert_eq!(f.bias(0x55d0c4a6f000, 0x6f000), Some(0x55d0c4a00000));
        // A non-PIE binary linked at 0x400000 and mapped there: no bias.
        let g = FileInfo {
            segments: vec![(0x1000, 0x2000, 0x401000)],
            ..f
        };
        assert_eq!(g.bias(0x401000, 0x1000), Some(0));
        assert_eq!(g.bias(0x401000, 0x9000), None);
    }
}
