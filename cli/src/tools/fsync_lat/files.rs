//! fsync-lat's by-file naming: the file behind each (process, device, inode) the kernel
//! announced, resolved while the fd is open, and what became of it.

use super::*;
use crate::report::hist::Keyed;

impl FsyncLat {
    /// Names the file the kernel announced, if not named yet: what the fd points to now, if it
    /// is still the same file (device and inode), else any other fd of the process holding it.
    pub(super) fn resolve(&mut self, e: &FileEvent) {
        if self.paths.len() >= MAX_NAMES {
            self.paths.clear();
        }
        self.paths
            .entry((e.id, e.dev, e.ino, e.igen))
            .or_insert_with(|| {
                let mut n = FileName::resolve(e.tgid, e.tid, e.fd, e.dev, e.ino);
                if n.state == "unknown" {
                    // Closed before we looked: the kernel's own name for it, without directory.
                    let own = sanitize::comm_bytes(&e.name);
                    if !own.is_empty() {
                        n.path = [b"\xe2\x80\xa6/".as_slice(), own].concat();
                        n.state = "closed";
                    }
                }
                n
            });
    }

    /// The top files of each process, most total time first.
    pub(super) fn file_rows(
        &mut self,
        per_file: BTreeMap<FileKey, (u32, [u8; 16], LatHist)>,
    ) -> Vec<FileRow> {
        let threads = self.scope.threads;
        type PerId = Vec<((u32, u64, u32), LatStats, u32, [u8; 16])>;
        let mut per_id: BTreeMap<u32, PerId> = BTreeMap::new();
        for ((id, dev, ino, igen), (tgid, comm, h)) in &per_file {
            per_id.entry(*id).or_default().push((
                (*dev, *ino, *igen),
                hist::stats(h),
                *tgid,
                *comm,
            ));
        }
        let mut ids: Vec<(u32, u64)> = per_id
            .iter()
            .map(|(id, v)| (*id, v.iter().map(|x| x.1.total_ns).sum()))
            .collect();
        ids.sort_by_key(|x| std::cmp::Reverse(x.1));
        let mut out = Vec::new();
        for (id, _) in ids {
            let mut v = per_id.remove(&id).unwrap_or_default();
            v.sort_by_key(|x| std::cmp::Reverse(x.1.total_ns));
            for ((dev, ino, igen), s, tgid, kcomm) in v.into_iter().take(self.top_files) {
                let name = self
                    .paths
                    .get_mut(&(id, dev, ino, igen))
                    .map(|n| {
                        n.refresh();
                        n.clone()
                    })
                    .unwrap_or_else(|| FileName::unknown(dev, ino));
                let comm = row_comm(id, tgid, threads, &kcomm);
                let (f, fb) = sanitize::name_fields(&name.path);
                let (maj, min) = crate::host::disks::split_kdev(dev);
                out.push(FileRow {
                    who: Id::new(
                        id,
                        tgid,
                        threads,
                        comm,
                        Title::cached(&mut self.facts.lock(), tgid),
                    ),
                    fd: name.fd,
                    dev: format!("{maj}:{min}"),
                    inode: ino,
                    inode_generation: igen,
                    file_state: name.state,
                    file: f,
                    file_bytes: fb,
                    lat: Keyed::new("", s, FILE_STATS),
                    file_raw: name.path,
                });
            }
        }
        out
    }
}

/// A file of a process in the aggregation: (id, device, inode, inode generation).
pub(super) type FileKey = (u32, u32, u64, u32);

/// Names kept at most (a process syncing a new file each call must not grow the map forever).
pub(super) const MAX_NAMES: usize = 65_536;

/// The name of a file identified by (device, inode), and what became of it.
#[derive(Clone, Debug)]
pub(super) struct FileName {
    pub(super) path: Vec<u8>,
    pub(super) fd: i32,
    pub(super) dev: u32,
    pub(super) ino: u64,
    pub(super) state: &'static str,
}

/// `(major, minor)` of a userspace `st_dev`.
pub(super) fn user_dev(st_dev: u64) -> (u32, u32) {
    (libc::major(st_dev), libc::minor(st_dev))
}

impl FileName {
    pub(super) fn unknown(dev: u32, ino: u64) -> FileName {
        FileName {
            path: b"[closed before it could be named]".to_vec(),
            fd: -1,
            dev,
            ino,
            state: "unknown",
        }
    }

    /// What `fd` of `tgid` names now, if it is still the file (`dev`, `ino`); else the first fd
    /// of the process that holds it.
    pub(super) fn resolve(tgid: u32, tid: u32, fd: i32, dev: u32, ino: u64) -> FileName {
        use std::os::unix::fs::MetadataExt;
        let want = crate::host::disks::split_kdev(dev);
        let mut denied = false;
        let mut same = |link: &std::path::Path| match std::fs::metadata(link) {
            Ok(m) => m.ino() == ino && user_dev(m.dev()) == want,
            Err(e) => {
                denied |= e.kind() == std::io::ErrorKind::PermissionDenied;
                false
            }
        };
        let named = |fd: i32| {
            let raw = crate::host::proc::fd_path(tgid, tid, fd);
            let (path, state) = match raw.strip_suffix(b" (deleted)") {
                Some(p) => (p.to_vec(), "deleted"),
                None => (raw, "open"),
            };
            FileName {
                path,
                fd,
                dev,
                ino,
                state,
            }
        };
        if same(&crate::host::proc_path(&format!(
            "{tgid}/task/{tid}/fd/{fd}"
        ))) {
            return named(fd);
        }
        if let Ok(rd) = std::fs::read_dir(crate::host::proc_path(&format!("{tgid}/fd"))) {
            for e in rd.filter_map(Result::ok) {
                let Some(other) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                    continue;
                };
                if same(&e.path()) {
                    return named(other);
                }
            }
        }
        if denied {
            return FileName {
                path: b"[no access]".to_vec(),
                fd,
                dev,
                ino,
                state: "open",
            };
        }
        FileName::unknown(dev, ino)
    }

    /// A name that now names another file (or nothing) was renamed over or removed since.
    pub(super) fn refresh(&mut self) {
        use std::os::unix::{ffi::OsStrExt, fs::MetadataExt};
        if self.state != "open" || self.path.first() != Some(&b'/') {
            return;
        }
        let p = std::path::Path::new(std::ffi::OsStr::from_bytes(&self.path));
        let still = std::fs::metadata(p).is_ok_and(|m| {
            m.ino() == self.ino && user_dev(m.dev()) == crate::host::disks::split_kdev(self.dev)
        });
        if !still {
            self.state = "renamed";
        }
    }
}
