//! The mapped binaries of the processes profiled, opened while each process lives, so that its
//! stacks still resolve to the files it ran after it exits — also inside a container, where the
//! path in `/proc/<pid>/maps` names a file of the container's root, not the host's (the host may
//! have no file there, or another one: resolved by path, the frames would be unknown or
//! misnamed).
//!
//! Each executable file mapping is opened through `/proc/<pid>/map_files/` (the very file
//! mapped, also deleted or in another mount namespace; it needs CAP_SYS_ADMIN) or else through
//! `/proc/<pid>/root`, once per file (device and inode) for all processes that map it. The
//! open file is read later through `/proc/self/fd/<fd>`. Bounded: at most [`MAX_FILES`] files
//! open and [`MAX_PROCS`] processes; what is past the bound resolves as before (by path).

use std::{collections::HashMap, fs::File, os::fd::AsRawFd, path::PathBuf, rc::Rc};

use super::symbols::MapInfo;
use crate::host::{maps, open_regular, proc_path};

/// Files kept open at most (one descriptor each).
pub const MAX_FILES: usize = 256;
/// Processes whose mappings are kept at most.
pub const MAX_PROCS: usize = 4096;

/// One executable mapping of a process, with the file mapped, opened.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    /// The path as the process saw it (for the module name).
    path: Rc<str>,
    file: Rc<File>,
    /// The same for pprof, with the file's build id.
    info: Rc<MapInfo>,
}

/// Where an address of an exited process is: the open file (a path this process can read it
/// by), the offset in that file, and the path the process mapped it from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileAddr {
    pub file: PathBuf,
    pub offset: u64,
    pub mapped_as: Rc<str>,
}

/// An open file by (device, inode), with its build id.
type OpenFiles = HashMap<(i32, i32, u64), (Rc<File>, Rc<str>)>;

#[derive(Default)]
pub struct Captured {
    files: OpenFiles,
    procs: HashMap<u32, Vec<Mapping>>,
}

/// The GNU build id of an ELF file, in hex; empty when it has none or is not ELF (read from
/// its headers and notes only, through `object::ReadCache`).
fn build_id(f: &File) -> Rc<str> {
    use object::Object as _;
    let data = object::ReadCache::new(f);
    let id = object::File::parse(&data)
        .ok()
        .and_then(|elf| elf.build_id().ok().flatten().map(<[u8]>::to_vec));
    match id {
        Some(id) => Rc::from(id.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        None => Rc::from(""),
    }
}

impl Captured {
    /// Reads `tgid`'s executable mappings now and opens the files not open yet (again each time
    /// it is called: a process maps libraries as it runs).
    pub fn capture(&mut self, tgid: u32) {
        if !self.procs.contains_key(&tgid) && self.procs.len() >= MAX_PROCS {
            return;
        }
        let Ok(maps) = maps::read_exec(tgid) else {
            return;
        };
        let mut out = Vec::with_capacity(maps.len());
        for m in maps {
            let Some((file, build_id)) = self.open(tgid, &m) else {
                continue;
            };
            let path: Rc<str> = Rc::from(m.path.as_str());
            out.push(Mapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                info: Rc::new(MapInfo {
                    path: path.clone(),
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    build_id,
                }),
                path,
                file,
            });
        }
        self.procs.insert(tgid, out);
    }

    fn open(&mut self, tgid: u32, m: &maps::ExecMap) -> Option<(Rc<File>, Rc<str>)> {
        let key = (m.dev.0, m.dev.1, m.inode);
        if let Some(f) = self.files.get(&key) {
            return Some(f.clone());
        }
        if self.files.len() >= MAX_FILES {
            return None;
        }
        let by_map = proc_path(&format!("{tgid}/map_files/{:x}-{:x}", m.start, m.end));
        let by_root = proc_path(&format!("{tgid}/root{}", m.path));
        // Non-blocking, and only regular files (a device mapped executable is not an ELF file;
        // the root path may have been replaced by a FIFO since it was mapped).
        let f = open_regular(&by_map, u64::MAX)
            .or_else(|_| open_regular(&by_root, u64::MAX))
            .ok()?;
        let id = build_id(&f);
        let opened = (Rc::new(f), id);
        self.files.insert(key, opened.clone());
        Some(opened)
    }

    /// Whether `tgid`'s mappings were captured.
    pub fn has(&self, tgid: u32) -> bool {
        self.procs.contains_key(&tgid)
    }

    /// Where address `addr` of `tgid` is, if it falls in a captured file mapping.
    pub fn locate(&self, tgid: u32, addr: u64) -> Option<FileAddr> {
        let m = self
            .procs
            .get(&tgid)?
            .iter()
            .find(|m| (m.start..m.end).contains(&addr))?;
        Some(FileAddr {
            file: PathBuf::from(format!("/proc/self/fd/{}", m.file.as_raw_fd())),
            offset: addr - m.start + m.offset,
            mapped_as: m.path.clone(),
        })
    }

    /// The file mapping address `addr` of `tgid` falls in, if captured (pprof's mappings).
    pub fn map_info(&self, tgid: u32, addr: u64) -> Option<Rc<MapInfo>> {
        self.procs
            .get(&tgid)?
            .iter()
            .find(|m| (m.start..m.end).contains(&addr))
            .map(|m| m.info.clone())
    }

    /// Forgets the processes `gone`, and closes the files no process kept maps any more; returns
    /// the paths closed (for the symboliser to forget what it cached under them).
    pub fn forget(&mut self, gone: &[u32]) -> Vec<PathBuf> {
        for p in gone {
            self.procs.remove(p);
        }
        let mut closed = Vec::new();
        self.files.retain(|_, (f, _)| {
            let used = Rc::strong_count(f) > 1;
            if !used {
                closed.push(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd())));
            }
            used
        });
        closed
    }

    /// Files open now.
    #[cfg(test)]
    pub fn open_files(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's own executable mapping is captured, located by address (the offset is
    /// the address's place in the file), and its file closed once the process is forgotten.
    #[test]
    fn captures_locates_and_forgets() {
        let me = std::process::id();
        let mut c = Captured::default();
        c.capture(me);
        assert!(c.has(me));
        let here = captures_locates_and_forgets as *const () as u64;
        let at = c
            .locate(me, here)
            .expect("this function's address is mapped");
        assert!(at.file.starts_with("/proc/self/fd/"));
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(&*at.mapped_as, exe.to_str().unwrap());
        // The open file is the executable (same inode), read through /proc/self/fd.
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (
            std::fs::metadata(&at.file).unwrap(),
            std::fs::metadata(&exe).unwrap(),
        );
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
        assert!(at.offset < a.len());
        assert_eq!(c.locate(me, 0), None);
        let n = c.open_files();
        assert!(n >= 1);
        let closed = c.forget(&[me]);
        assert_eq!(closed.len(), n);
        assert_eq!(c.open_files(), 0);
        assert!(!c.has(me));
    }
}
