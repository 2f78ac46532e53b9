//! Who dirtied the pages that writeback sends to each disk: the flusher kworker issues the
//! writes, so the block hooks see only it (and, on cgroup v2 with memcg writeback, the cgroup
//! charged); the process that made the pages dirty is seen only here.
//!
//! Hook: classic `writeback:writeback_dirty_folio` (6.0+; `writeback_dirty_page` with the same
//! fields before), fired by `folio_account_dirtied` in the dirtying task's context, field
//! `name` (the bdi, `"MAJ:MIN"` for a block device). A classic tracepoint because the record
//! carries the bdi name already (the typed arguments, a folio and its mapping, would need a
//! walk mapping → host inode → bdi); dirtying runs at most once per folio per write-back cycle.
//!
//! Bytes: `folio_account_dirtied` adds the folio's size to `current->ioac.write_bytes` right
//! after the event, so the growth of the thread's counter since its previous event is the size
//! of the folio that event announced (the block layer's direct writes add to it too: a process
//! that mixes them with buffered writes is over-counted by those). Counts of events alone
//! mislead: ext4 on 6.18 dirties a sequential writer's 1 MiB as one large folio and a 512-byte
//! append as one page.

use aya_ebpf::{helpers::bpf_get_current_task, maps::LruHashMap};
use probes_common::io_lat::{DirtyKey, DirtyVal, BDI_NAME_LEN};

use super::*;

/// Offset of `name` in the record (from the format file).
#[no_mangle]
static IO_DIRTY_NAME: u32 = 8;
/// Offset of `ioac.write_bytes` in `task_struct` (BTF; 0 when the kernel has no task I/O
/// accounting: bytes are then not measured).
#[no_mangle]
static IO_DIRTY_WB: u32 = 0;

/// Dirtying per (bdi, process, generation), sized by userspace.
#[map]
static IO_DIRTY: HashMap<DirtyKey, DirtyVal> = HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// What did not fit `IO_DIRTY`, per generation.
#[map]
static IO_DIRTY_OTHER: Array<DirtyVal> = Array::with_max_entries(2, 0);

#[map]
static IO_DIRTY_SCRATCH: PerCpuArray<DirtyVal> = PerCpuArray::with_max_entries(1, 0);

/// Each dirtying thread's `ioac.write_bytes` at its last event. An LRU: a thread evicted
/// loses the size of one folio.
#[map]
static IO_DIRTY_LAST: LruHashMap<u32, u64> = LruHashMap::with_max_entries(8192, 0);

/// The size of the folio this thread's previous event announced (see the module).
#[inline(always)]
fn grown(tid: u32) -> u64 {
    let off = ro(&IO_DIRTY_WB);
    if off == 0 {
        return 0;
    }
    // SAFETY: plain helper call; the task is read through the checked probe helper.
    let now: u64 = Probe::read(unsafe { bpf_get_current_task() }, off);
    // In place once the thread has an entry: an LRU update takes a lock and a free node on
    // every call, a store does not.
    let Some(p) = IO_DIRTY_LAST.get_ptr_mut(tid) else {
        let _ = IO_DIRTY_LAST.insert(tid, now, 0);
        return 0;
    };
    // SAFETY: `p` points into the live map value of this thread (only it writes its own).
    let before = unsafe { core::ptr::replace(p, now) };
    now.saturating_sub(before)
}

#[inline(always)]
fn on_dirty(ctx: &TracePointContext) {
    let id = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((id >> 32) as u32, id as u32);
    if !allowed(tgid) {
        return;
    }
    let gen = generation();
    let key = DirtyKey {
        // SAFETY: the offset comes from the event's format file; read_at goes through the helper.
        bdi: unsafe { ctx.read_at::<[u8; BDI_NAME_LEN]>(ro(&IO_DIRTY_NAME) as usize) }
            .unwrap_or([0; BDI_NAME_LEN]),
        tgid,
        gen,
    };
    let bytes = grown(tid);
    let Some(s) = slot(&IO_DIRTY, &IO_DIRTY_OTHER, &IO_DIRTY_SCRATCH, &key, gen, |v| {
        // SAFETY: this CPU's scratch slot.
        unsafe { comm_into(&mut (*v).comm) };
    }) else {
        return;
    };
    if s.created {
        announce(&IO_NEW, &IoNew { tgid, dev: 0 });
    }
    // SAFETY: `s.ptr` points into a live map value.
    unsafe {
        atomic_add(&raw mut (*s.ptr).folios, 1);
        atomic_add(&raw mut (*s.ptr).bytes, bytes);
    }
}

probes_ebpf::passing! {
    /// Classic `writeback:writeback_dirty_folio` / `writeback_dirty_page` (field `name`).
    pub fn tk_io_dirty_tp(ctx: TracePointContext) -> u32 {
        on_dirty(&ctx);
        0
    }
}
