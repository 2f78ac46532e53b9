//! Classic-tracepoint fallback: kernels without BTF (no struct offsets, so no request pointer
//! walk) or where neither tp_btf nor raw_tp attach. Requests are keyed by (dev, sector) from
//! the records; op and sync come from `rwbs`; the cgroup is unknown (0). Limits: two requests
//! in flight at one (dev, sector) (flushes) collide, and a partial completion cannot be told
//! from the last one (the 6.x `block_rq_complete` record has no byte count), so it ends the
//! request early.

use super::*;

/// Reads a field of a classic record at an offset from its format file.
#[inline(always)]
fn field<T: Copy + Default>(ctx: &TracePointContext, off: u32) -> T {
    // SAFETY: offsets come from the event's format file; read_at goes through the helper.
    unsafe { ctx.read_at::<T>(off as usize) }.unwrap_or_default()
}

/// The (dev, sector) key of a classic record.
#[inline(always)]
fn tp_key(ctx: &TracePointContext) -> SectorKey {
    SectorKey {
        sector: field(ctx, ro(&IO_TP.sector)),
        dev: field(ctx, ro(&IO_TP.dev)),
        _pad: 0,
    }
}

/// Writes a new entry's identity from a classic insert/issue record into `n`, issuer = current
/// task; false (nothing written) when filtered out.
#[inline(always)]
fn tp_start(ctx: &TracePointContext, dev: u32, n: &mut IoStart) -> bool {
    if !dev_wanted(dev) {
        return false;
    }
    let Some(tgid) = issuer() else {
        return false;
    };
    n.cgroup_id = 0;
    comm_into(&mut n.comm);
    n.tgid = tgid;
    n.dev = dev;
    n.bytes = field(ctx, ro(&IO_TP.bytes));
    n.op = rwbs_op(&field(ctx, ro(&IO_TP.rwbs)));
    n.submit_ns = 0;
    n.rq = 0;
    true
}

probes_ebpf::passing! {
    /// Classic `block:block_rq_insert` (fields `dev`, `sector`, `bytes`, `rwbs`).
    pub fn tk_io_insert_tp(ctx: TracePointContext) -> u32 {
        let key = tp_key(&ctx);
        on_begin(&BySector { key }, false, |n| tp_start(&ctx, key.dev, n));
        0
    }
}

probes_ebpf::passing! {
    /// Classic `block:block_rq_issue` (fields `dev`, `sector`, `bytes`, `rwbs`).
    pub fn tk_io_issue_tp(ctx: TracePointContext) -> u32 {
        let key = tp_key(&ctx);
        on_begin(&BySector { key }, true, |n| tp_start(&ctx, key.dev, n));
        0
    }
}

probes_ebpf::passing! {
    /// Classic `block:block_rq_requeue` (fields `dev`, `sector`).
    pub fn tk_io_requeue_tp(ctx: TracePointContext) -> u32 {
        on_requeue(&BySector { key: tp_key(&ctx) });
        0
    }
}

probes_ebpf::passing! {
    /// Classic `block:block_rq_merge` (fields `dev`, `sector`).
    pub fn tk_io_merge_tp(ctx: TracePointContext) -> u32 {
        on_merge(&BySector { key: tp_key(&ctx) });
        0
    }
}

probes_ebpf::passing! {
    /// Classic `block:block_rq_complete` (fields `dev`, `sector`, `error` (an errno),
    /// `nr_sector`, `rwbs`).
    pub fn tk_io_complete_tp(ctx: TracePointContext) -> u32 {
        let key = tp_key(&ctx);
        let err: i32 = field(&ctx, ro(&IO_TP.error));
        on_complete(
            &BySector { key },
            err.unsigned_abs(),
            || true,
            || {
                let sectors: u32 = field(&ctx, ro(&IO_TP.cpl_nr_sector));
                if sectors == 0 {
                    return None;
                }
                Some((key.dev, rwbs_op(&field(&ctx, ro(&IO_TP.cpl_rwbs)))))
            },
        );
        0
    }
}
