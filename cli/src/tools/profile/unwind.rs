//! `--unwind dwarf`: user stacks of code without frame pointers, unwound in userspace from the
//! registers and stack bytes each sample carries ([`DwarfSample`]) with the mapped binaries'
//! `.eh_frame` CFI (`framehop`, as samply does; sections read with `object`).
//!
//! Per process, an unwinder holds one module per executable file mapping (from
//! `/proc/<pid>/maps`); the maps are read when a process is first seen and again (once per poll)
//! when a sample's instruction pointer is outside every known module (a new `dlopen`). The
//! unwind sections of each file are read once and shared, keyed by (device, inode); both caches
//! are bounded ([`MAX_FILES`], [`MAX_PROCS`]: cleared when full).
//!
//! A mapped file is never read whole: only its headers and unwind sections are read
//! (`object::ReadCache`), and only from a regular file of at most [`MAX_BINARY_BYTES`] (a mapping
//! may name a device, a FIFO or a file of any size), opened without blocking
//! ([`crate::host::open_regular`]). An unwind section is read only if its header places it inside
//! the file and it is at most [`MAX_SECTION_BYTES`]: a sparse file's headers can claim a
//! gigabyte of zeros that a read would allocate. A binary over a cap is not unwound, and the
//! report says so ([`Unwinder::skipped`], [`skipped_notes`]).

use std::{
    collections::{BTreeMap, HashMap},
    ops::Range,
    path::Path,
    sync::Arc,
};

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
/// Skipped binaries named in the report (the rest are not listed).
const MAX_SKIPPED_NAMED: usize = 16;
/// Largest binary unwound: far above any real executable or library (Chromium's is ~250 MiB),
/// and what is read of it is only its headers and unwind sections.
pub const MAX_BINARY_BYTES: u64 = 1 << 30;
/// Largest unwind section read (`.eh_frame`, `.eh_frame_hdr`): libLLVM's 150 MB has a 6.5 MB
/// `.eh_frame` and a 1 MB `.eh_frame_hdr`; each read costs its size twice while parsed.
pub const MAX_SECTION_BYTES: u64 = 64 << 20;

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

/// Why a mapped binary was not unwound (said in the report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotUnwound {
    /// A regular file of this many bytes, over the cap.
    TooLarge(u64),
    /// A device, FIFO or socket: nothing to read unwind tables from.
    NotAFile,
    /// An unwind section whose header claims this many bytes: over [`MAX_SECTION_BYTES`] or
    /// past the end of the file (a hostile or corrupt binary).
    BadSection(&'static str, u64),
}

/// Why [`read_binary`] gave nothing.
#[derive(Debug, PartialEq, Eq)]
enum Unread {
    /// Said in the report.
    Skipped(NotUnwound),
    /// Unreadable (gone, no permission) or not an object file: no frames, nothing to say.
    Quiet,
}

/// The unwind facts of the binary at `path`: only a regular file of at most `cap` bytes, and
/// only its headers and sections are read (never the whole file).
fn read_binary(path: &Path, cap: u64) -> Result<FileInfo, Unread> {
    use crate::host::HostError;
    let f = crate::host::open_regular(path, u64::MAX).map_err(|e| match e {
        HostError::NotRegular { .. } => Unread::Skipped(NotUnwound::NotAFile),
        _ => Unread::Quiet,
    })?;
    let len = f.metadata().map_err(|_| Unread::Quiet)?.len();
    if len > cap {
        return Err(Unread::Skipped(NotUnwound::TooLarge(len)));
    }
    FileInfo::parse(&object::ReadCache::new(f), len)
}

impl FileInfo {
    /// The unwind facts of an object file of `len` bytes; an unwind section is read only when
    /// it lies inside the file and within [`MAX_SECTION_BYTES`].
    fn parse<'d, R: object::ReadRef<'d>>(data: R, len: u64) -> Result<FileInfo, Unread> {
        let f = object::File::parse(data).map_err(|_| Unread::Quiet)?;
        let section = |name: &'static str| -> Result<Option<(Range<u64>, Data)>, Unread> {
            let Some(s) = f.section_by_name(name) else {
                return Ok(None);
            };
            let bad = || Unread::Skipped(NotUnwound::BadSection(name, s.size()));
            if s.size() > MAX_SECTION_BYTES {
                return Err(bad());
            }
            if let Some((off, size)) = s.file_range() {
                if off.checked_add(size).is_none_or(|end| end > len) {
                    return Err(bad());
                }
            }
            let r = s.address()..s.address() + s.size();
            Ok(s.data().ok().map(|d| (r, Data::from(d))))
        };
        let range = |name: &str| {
            let s = f.section_by_name(name)?;
            Some(s.address()..s.address() + s.size())
        };
        Ok(FileInfo {
            eh_frame: section(".eh_frame")?,
            eh_frame_hdr: section(".eh_frame_hdr")?,
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
        crate::host::maps::load_bias(&self.segments, start, offset)
    }
}

/// One report note per skipped binary: `not unwound: /opt/big/bin larger than 1024 MiB (4096
/// MiB)`; the path is escaped (it comes from the traced process's maps).
pub fn skipped_notes(skipped: &BTreeMap<String, NotUnwound>) -> Vec<String> {
    const MIB: u64 = 1 << 20;
    skipped
        .iter()
        .map(|(path, why)| {
            let path = crate::report::sanitize::text(path.as_bytes());
            match why {
                NotUnwound::TooLarge(n) => format!(
                    "not unwound: {path} larger than {} MiB ({} MiB); its frames show as [unknown]",
                    MAX_BINARY_BYTES / MIB,
                    n.div_ceil(MIB)
                ),
                NotUnwound::NotAFile => format!(
                    "not unwound: {path} is not a regular file (a device or FIFO mapped executable)"
                ),
                NotUnwound::BadSection(section, n) => format!(
                    "not unwound: {path} claims a {section} of {} MiB, over {} MiB or past its end \
                     (a corrupt or hostile binary); its frames show as [unknown]",
                    n.div_ceil(MIB),
                    MAX_SECTION_BYTES / MIB
                ),
            }
        })
        .collect()
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
    /// Binaries not unwound in this run, by path (the first [`MAX_SKIPPED_NAMED`]).
    skipped: BTreeMap<String, NotUnwound>,
}

impl Unwinder {
    /// The binaries not unwound in this run, by path (for the report's notes).
    pub fn skipped(&self) -> &BTreeMap<String, NotUnwound> {
        &self.skipped
    }

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
        let read = match read_binary(&by_map, MAX_BINARY_BYTES) {
            Err(Unread::Quiet) => read_binary(&by_root, MAX_BINARY_BYTES),
            r => r,
        };
        let info = match read {
            Ok(f) => Some(Arc::new(f)),
            Err(Unread::Skipped(why)) => {
                if self.skipped.len() < MAX_SKIPPED_NAMED {
                    self.skipped.insert(m.path.clone(), why);
                }
                None
            }
            Err(Unread::Quiet) => None,
        };
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

    /// A binary over the cap is skipped by its size alone (a sparse file: nothing is read), a
    /// device is skipped without a read (`/dev/zero` would never end), and one under the cap
    /// gives its unwind sections.
    #[test]
    fn binaries_over_the_cap_or_not_files_are_skipped_unread() {
        let dir = std::env::temp_dir().join(format!("tk-unwind-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big");
        let f = std::fs::File::create(&big).unwrap();
        // 4 GiB and one byte, sparse: a read of it would take seconds and 4 GiB of memory.
        f.set_len((4 << 30) + 1).unwrap();
        drop(f);
        assert_eq!(
            read_binary(&big, MAX_BINARY_BYTES).err(),
            Some(Unread::Skipped(NotUnwound::TooLarge((4 << 30) + 1)))
        );
        // The cap is exact: a file of cap bytes is read (and is no ELF), cap+1 is not.
        let small = dir.join("small");
        std::fs::write(&small, [0u8; 64]).unwrap();
        assert_eq!(read_binary(&small, 64).err(), Some(Unread::Quiet));
        assert_eq!(
            read_binary(&small, 63).err(),
            Some(Unread::Skipped(NotUnwound::TooLarge(64)))
        );
        assert_eq!(
            read_binary(Path::new("/dev/zero"), MAX_BINARY_BYTES).err(),
            Some(Unread::Skipped(NotUnwound::NotAFile))
        );
        assert_eq!(
            read_binary(&dir.join("missing"), MAX_BINARY_BYTES).err(),
            Some(Unread::Quiet)
        );
        // This test binary itself: read through the cache, its .eh_frame found.
        let me = read_binary(Path::new("/proc/self/exe"), MAX_BINARY_BYTES).unwrap();
        assert!(me.eh_frame.as_ref().is_some_and(|e| !e.1.is_empty()));
        assert!(!me.segments.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `bin` with its `.eh_frame` and `.eh_frame_hdr` section headers claiming `claim(offset)`
    /// bytes, written to `out` and made `len` bytes long (sparse).
    fn patched_elf(bin: &Path, out: &Path, len: u64, claim: impl Fn(u64) -> u64) {
        let mut b = std::fs::read(bin).unwrap();
        let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
        let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let (shoff, shentsize) = (u64_at(&b, 0x28) as usize, u16_at(&b, 0x3a) as usize);
        let (shnum, shstrndx) = (u16_at(&b, 0x3c) as usize, u16_at(&b, 0x3e) as usize);
        let sh = |i: usize| shoff + i * shentsize;
        let strtab = u64_at(&b, sh(shstrndx) + 0x18) as usize;
        let mut patched = 0;
        for i in 0..shnum {
            let name = &b[strtab + u32_at(&b, sh(i)) as usize..];
            let name = &name[..name.iter().position(|&c| c == 0).unwrap()];
            if name == b".eh_frame" || name == b".eh_frame_hdr" {
                let size = claim(u64_at(&b, sh(i) + 0x18));
                b[sh(i) + 0x20..sh(i) + 0x28].copy_from_slice(&size.to_le_bytes());
                patched += 1;
            }
        }
        assert_eq!(patched, 2);
        std::fs::write(out, &b).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(out).unwrap();
        f.set_len(len.max(b.len() as u64)).unwrap();
    }

    /// A sparse binary whose unwind section headers claim what a read would allocate (all of a
    /// 1 GiB file, at the binary cap) is skipped unread; so is one claiming bytes past its end.
    #[test]
    fn unwind_sections_over_the_cap_or_past_the_end_are_not_read() {
        let dir = std::env::temp_dir().join(format!("tk-unwind-sect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = Path::new("/usr/bin/true");
        assert!(read_binary(real, MAX_BINARY_BYTES).is_ok_and(|f| f.eh_frame.is_some()));
        let huge = dir.join("huge");
        patched_elf(real, &huge, 1 << 30, |off| (1 << 30) - off);
        let e = read_binary(&huge, MAX_BINARY_BYTES).err();
        assert!(
            matches!(e, Some(Unread::Skipped(NotUnwound::BadSection(".eh_frame", n))) if n > MAX_SECTION_BYTES),
            "{e:?}"
        );
        let past = dir.join("past");
        patched_elf(real, &past, 0, |_| 1 << 20);
        assert_eq!(
            read_binary(&past, MAX_BINARY_BYTES).err(),
            Some(Unread::Skipped(NotUnwound::BadSection(
                ".eh_frame",
                1 << 20
            )))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn skipped_binaries_are_named_in_notes() {
        let mut m = BTreeMap::new();
        m.insert(
            "/opt/big\x1b/bin".to_string(),
            NotUnwound::TooLarge(4 << 30),
        );
        m.insert("/dev/evil".to_string(), NotUnwound::NotAFile);
        m.insert(
            "/tmp/sparse.so".to_string(),
            NotUnwound::BadSection(".eh_frame", 1 << 30),
        );
        let notes = skipped_notes(&m);
        assert_eq!(
            notes,
            [
                "not unwound: /dev/evil is not a regular file (a device or FIFO mapped executable)",
                "not unwound: /opt/big\\x1b/bin larger than 1024 MiB (4096 MiB); its frames show as [unknown]",
                "not unwound: /tmp/sparse.so claims a .eh_frame of 1024 MiB, over 64 MiB or past its end (a corrupt or hostile binary); its frames show as [unknown]",
            ]
        );
    }
}
