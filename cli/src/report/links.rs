//! Measured facts a collector offers so that `triage` can link findings across collectors in
//! the same window: a victim's finding names its culprit only where a number from another
//! collector shows it (issue #26: causes linked, each link measured, not guessed).
//!
//! A collector puts them in [`crate::report::render::Output::links`]; nothing is printed from
//! them directly.

use super::findings::Subject;

/// One issuer's block I/O on one whole disk in the window (io-lat's rows).
#[derive(Clone, Debug, PartialEq)]
pub struct DiskIssuer {
    /// The whole disk, kernel-internal `dev_t` (as block tracepoints report it).
    pub kdev: u32,
    pub disk: String,
    /// The issuing process (for writeback, the flusher kworker).
    pub who: Subject,
    pub kthread: bool,
    /// The cgroup the I/O is charged to (writeback: the cgroup that dirtied the pages).
    pub cgroup: Option<String>,
    pub requests: u64,
    /// Request time summed over its requests (first seen to completion).
    pub time_ns: u64,
    /// Asynchronous writes by a kernel thread: the flusher writing dirty pages back.
    pub writeback: bool,
    /// Cache flushes (`REQ_OP_FLUSH`): issued by kblockd for the fsyncs' pre-flushes, they are
    /// the syncing processes' own cost, nobody else's load on the disk.
    pub flush: bool,
}

/// One process's dirtying of one disk's pages in the window (io-lat's `dirtied` rows): whose
/// pages the flusher writes back.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskDirtier {
    pub kdev: u32,
    pub disk: String,
    pub who: Subject,
    pub kthread: bool,
    pub folios: u64,
    /// `None` where the kernel does not account task I/O (then only folios are known).
    pub bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Link {
    Disk(DiskIssuer),
    Dirtied(DiskDirtier),
}
