//! Opening io-lat: the globals each attach mode needs (struct offsets and prototype variants
//! from BTF, or field offsets from the format files), map sizes, and the depth sampler's timer.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use aya::maps::{Array, HashMap, RingBuf};
use probes_common::io_lat::{
    DevVal, DirtyVal, IoVal, RqOffsets, TpOffsets, BDI_NAME_LEN, NANOM, OFF_NONE,
};

use super::{depth, hooks_for, names, slots, Args, IoFrom, IoLat, OBJECT, SAMPLE_PERIOD_NS};
use crate::{
    engine::Collector,
    error::{Context as _, Error, Result},
    host::{
        cgroup::{IdResolver, Layout},
        disks, mountinfo,
    },
    kernel::{
        btf::Btf,
        hooks::{AttachMode, Hook},
        loader::{self, LoadSpec, Session},
        maps::GenMap,
        tracefs::EventFormat,
    },
    tools::OpenCtx,
};

/// `request`/`bio`/`gendisk`/`blkcg` member offsets from the running kernel's BTF.
pub fn rq_offsets(btf: &Btf) -> Result<RqOffsets> {
    let m = |s: &str, path: &str, size: u32| -> Result<u32> {
        let m = btf.member(s, path)?;
        if m.size != size {
            return Err(Error::KernelFeature(format!(
                "kernel BTF: {s}.{path} is {} bytes, expected {size}",
                m.size
            )));
        }
        Ok(m.offset)
    };
    // __REQ_SYNC moved between kernels (enum req_flag_bits follows enum req_op's bits).
    let sync_bit = btf.enum_value("__REQ_SYNC").ok_or_else(|| {
        Error::KernelFeature("kernel BTF has no enum req_flag_bits.__REQ_SYNC".into())
    })?;
    // blk-cgroup is optional (CONFIG_BLK_CGROUP): without it bio has no bi_blkg.
    let cg = (|| -> Result<[u32; 5]> {
        Ok([
            m("bio", "bi_blkg", 8)?,
            m("blkcg_gq", "blkcg", 8)?,
            m("blkcg", "css.cgroup", 8)?,
            m("cgroup", "kn", 8)?,
            m("kernfs_node", "id", 8)?,
        ])
    })()
    .unwrap_or([0; 5]);
    // The disk: rq->q->disk since 5.15, rq->rq_disk before.
    let (rq_q, q_disk) = match m("request", "rq_disk", 8) {
        Ok(d) => (d, OFF_NONE),
        Err(_) => (m("request", "q", 8)?, m("request_queue", "disk", 8)?),
    };
    Ok(RqOffsets {
        rq_q,
        rq_cmd_flags: m("request", "cmd_flags", 4)?,
        rq_data_len: m("request", "__data_len", 4)?,
        rq_bio: m("request", "bio", 8)?,
        q_disk,
        disk_major: m("gendisk", "major", 4)?,
        disk_first_minor: m("gendisk", "first_minor", 4)?,
        bio_blkg: cg[0],
        blkg_blkcg: cg[1],
        blkcg_cgroup: cg[2],
        cgroup_kn: cg[3],
        kn_id: cg[4],
        req_sync: 1u32 << (sync_bit as u32 & 31),
        _pad: 0,
        rq_tag: m("request", "tag", 4)?,
        rq_internal_tag: m("request", "internal_tag", 4)?,
        rq_mq_hctx: m("request", "mq_hctx", 8)?,
        hctx_queue_num: m("blk_mq_hw_ctx", "queue_num", 4)?,
    })
}

/// Globals of the request-keyed programs: struct offsets and the prototype variants of this
/// kernel (both from BTF). Returns whether `error` is an errno.
fn btf_globals(spec: LoadSpec) -> Result<(LoadSpec, bool)> {
    let btf = crate::kernel::btf::vmlinux()?;
    let offs = rq_offsets(btf).map_err(|e| {
        Error::KernelFeature(format!(
            "{e}: this kernel's struct request is not supported (try --attach tracepoint)"
        ))
    })?;
    // (q, rq) before 5.11, (rq) since; block_bio_queue (q, bio) before 5.11, (bio) since.
    let q_arg = btf.proto_params("btf_trace_block_rq_issue") == Some(3);
    let bio_q_arg = btf.proto_params("btf_trace_block_bio_queue") == Some(3);
    // `int error` (an errno) from 4.13 to 5.x, `blk_status_t` since.
    let errno = btf
        .proto_param_type("btf_trace_block_rq_complete", 2)
        .as_deref()
        == Some("int");
    Ok((
        spec.global("IO_OFFS", &offs)
            .global("IO_Q_ARG", &u8::from(q_arg))
            .global("IO_BIO_Q_ARG", &u8::from(bio_q_arg))
            .global("IO_ERR_ERRNO", &u8::from(errno)),
        errno,
    ))
}

/// Globals of the classic programs: [`tp_offsets`] from the format files of the events that
/// attach.
fn classic_globals(spec: LoadSpec, ctx: &OpenCtx, hooks: &[&Hook]) -> Result<LoadSpec> {
    let tracefs = ctx
        .env
        .tracefs()
        .as_ref()
        .map_err(|e| Error::KernelFeature(e.clone()))?;
    let names: Vec<&str> = hooks
        .iter()
        .filter(|h| h.group == "block_rq")
        .map(|h| h.name())
        .collect();
    let offs = tp_offsets(|e| Ok(tracefs.format("block", e)?), &names)?;
    Ok(spec.global("IO_TP", &offs))
}

/// Field offsets of the classic records ([`TpOffsets`]) from `format(event)`; `events` are
/// the ones that attach. `dev` and `sector` must sit at one offset in all of them, `bytes` and
/// `rwbs` at one offset in insert and issue (the programs read one global field each).
pub(super) fn tp_offsets(
    format: impl Fn(&str) -> Result<EventFormat>,
    events: &[&str],
) -> Result<TpOffsets> {
    let cpl = format("block_rq_complete")?;
    // The offset of `field` in `first`'s format, checked against every event of `others`.
    let agreed = |first: &str, others: &[&str], field: &str, sizes: &[u32]| -> Result<u32> {
        let at = format(first)?.offset_of(field, sizes)?;
        for e in others {
            if format(e)?.offset_of(field, sizes)? != at {
                return Err(Error::KernelFeature(format!(
                    "block:{e}: `{field}` is not where block:{first} has it: unsupported layout"
                )));
            }
        }
        Ok(at)
    };
    let inserts: Vec<&str> = events
        .iter()
        .copied()
        .filter(|n| *n == "block_rq_insert")
        .collect();
    Ok(TpOffsets {
        dev: agreed("block_rq_complete", events, "dev", &[4])?,
        sector: agreed("block_rq_complete", events, "sector", &[8])?,
        bytes: agreed("block_rq_issue", &inserts, "bytes", &[4])?,
        rwbs: agreed("block_rq_issue", &inserts, "rwbs", &[8, 10])?,
        error: cpl.offset_of("error", &[4])?,
        cpl_nr_sector: cpl.offset_of("nr_sector", &[4])?,
        cpl_rwbs: cpl.offset_of("rwbs", &[8, 10])?,
        _pad: 0,
    })
}

/// The dirtying event this kernel has (`writeback_dirty_folio` since 6.0, `writeback_dirty_page`
/// before), and the globals of its program: the record's `name` offset and, from BTF,
/// `task_struct.ioac.write_bytes` (absent without `CONFIG_TASK_IO_ACCOUNTING`: pages are then
/// counted, bytes are not). `Err` says why the hook cannot run.
fn dirty_globals(ctx: &OpenCtx) -> (&'static str, std::result::Result<(u32, u32), String>) {
    const EVENTS: [&str; 2] = ["writeback_dirty_folio", "writeback_dirty_page"];
    let tracefs = match ctx.env.tracefs() {
        Ok(t) => t,
        Err(e) => return (EVENTS[0], Err(e.clone())),
    };
    let found = EVENTS
        .iter()
        .find_map(|e| tracefs.format("writeback", e).ok().map(|f| (*e, f)));
    let Some((event, format)) = found else {
        return (EVENTS[0], Err("no writeback dirtying tracepoint".into()));
    };
    let name = match format.offset_of("name", &[BDI_NAME_LEN as u32]) {
        Ok(o) => o,
        Err(e) => return (event, Err(e.to_string())),
    };
    let write_bytes = crate::kernel::btf::vmlinux()
        .ok()
        .and_then(|b| b.member_offset("task_struct", "ioac.write_bytes", 8).ok())
        .unwrap_or(0);
    (event, Ok((name, write_bytes)))
}

/// Entries for the in-flight map: every request the disks can hold at once, twice (requests
/// live in preallocated tag sets, so this bounds the distinct addresses; the second half is for
/// sets a scheduler switch allocates during the run). A full map is counted, never silent.
fn inflight_cap() -> u32 {
    let per_disk: u64 = disks::whole_disks()
        .into_iter()
        .map(|(_, maj, min)| {
            let q = disks::QueueFacts::read(maj, min);
            let hwq = q.nr_hw_queues.unwrap_or(1).max(1);
            q.nr_requests.unwrap_or(128) * hwq + q.hw_queue_depth.unwrap_or(0) + hwq
        })
        .sum();
    (per_disk * 2).clamp(4096, 1 << 20) as u32
}

/// Where the cgroup ids the kernel records (the blkcg's, as `bio->bi_blkg` charges it) are
/// directories: the v1 blkio hierarchy on a v1 or hybrid host, else the v2 tree.
fn cgroup_resolver() -> IdResolver {
    let blkio = mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.has_option("blkio"))
        .map(|m| m.mount_point);
    match blkio {
        Some(root) => IdResolver::new(&Layout {
            v2_root: Some(root),
            v1_memory: None,
        }),
        None => IdResolver::new(&Layout::detect()),
    }
}

fn sample_timer() -> Result<OwnedFd> {
    let io = |what: &str| Error::Io {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: plain syscalls; the fd is owned below, the itimerspec is a local.
    unsafe {
        let fd = libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        );
        if fd < 0 {
            return Err(io("creating the queue-depth sampling timer"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let period = libc::timespec {
            tv_sec: 0,
            tv_nsec: SAMPLE_PERIOD_NS,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        if libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) != 0 {
            return Err(io("starting the queue-depth sampling timer"));
        }
        Ok(fd)
    }
}

/// Loads and attaches io-lat's programs as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let scope = &ctx.scope;
    if scope.threads {
        return Err(Error::Usage(
            "io-lat: --threads is not supported (requests are attributed to the issuing process)"
                .into(),
        ));
    }
    let dev = match &args.dev {
        Some(d) => Some(disks::disk_of(d).ok_or_else(|| {
            Error::Usage(format!(
                "--dev {d}: no such block device (see /sys/class/block)"
            ))
        })?),
        None => None,
    };
    // Without BTF there are no struct offsets: only the classic tracepoints can work.
    let force = match args.attach {
        Some(a) => Some(a.into()),
        None if !ctx.env.btf() => Some(AttachMode::Tracepoint),
        None => None,
    };
    let mut hooks = hooks_for(force);
    let (dirty_event, dirty) = dirty_globals(ctx);
    let want_bio = args.from == IoFrom::Submit;
    hooks.retain(|h| {
        h.group == "block_rq"
            || (h.name() == super::BIO_EVENT && want_bio)
            || (h.name() == dirty_event && dirty.is_ok())
    });
    let mut plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
    let mode = plan
        .iter()
        .find_map(|c| c.mode.map(|m| m.0))
        .ok_or_else(|| Error::KernelFeature("no block tracepoint can attach".into()))?;
    // The classic programs key requests by (dev, sector): a bio stamp would never be looked up.
    if mode == AttachMode::Tracepoint && hooks.iter().any(|h| h.name() == super::BIO_EVENT) {
        hooks.retain(|h| h.name() != super::BIO_EVENT);
        plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
    }
    let attached: Vec<&Hook> = hooks
        .iter()
        .zip(&plan)
        .filter(|(_, c)| c.mode.is_some())
        .map(|(h, _)| h)
        .collect();
    let cap = inflight_cap();
    let classic = mode == AttachMode::Tracepoint;
    // The bio hook is optional: requests look a submission up only when it attaches.
    let bio = attached.iter().any(|h| h.name() == super::BIO_EVENT);
    let from = if bio { IoFrom::Submit } else { IoFrom::Request };
    // Twice the requests the disks can hold, so the probes around a home find a free slot.
    let rq_slots = if classic {
        1
    } else {
        (cap * 2).next_power_of_two()
    };
    // The disks now: room for them and as many again, and their slots before attaching.
    let disks_at_load = disks::diskstats().unwrap_or_default();
    let nslots = slots::capacity(disks_at_load.len());
    let spec = LoadSpec::new()
        .global(
            "IO_DEV",
            &dev.as_ref().map(|d| disks::kdev(d.1, d.2)).unwrap_or(0),
        )
        .max_entries("IO_AGG", scope.key_cap())
        .max_entries("IO_RQ", rq_slots)
        .global("IO_RQ_MASK", &(rq_slots - 1))
        .max_entries("IO_START_TP", if classic { cap } else { 1 })
        .max_entries("IO_SLOTS", nslots)
        .max_entries("IO_LIVE", nslots)
        .max_entries("IO_DEPTH", nslots * 2)
        .max_entries("IO_DIRTY", scope.key_cap())
        .global("IO_SUBMIT", &u8::from(bio));
    let spec = match &dirty {
        Ok((name, wb)) => spec.global("IO_DIRTY_NAME", name).global("IO_DIRTY_WB", wb),
        Err(_) => spec,
    };
    let (spec, errno) = if classic {
        // The classic `error` field is always an errno (blk_status_to_errno).
        (classic_globals(spec, ctx, &attached)?, true)
    } else {
        btf_globals(spec.tp_btf_planned(&hooks, &plan))?
    };
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    // Slots before attaching: every request from the first one finds its device's slot.
    let mut slots = slots::Slots::new(
        HashMap::try_from(session.take_map("IO_SLOTS")?).context("IO_SLOTS")?,
        Array::try_from(session.take_map("IO_LIVE")?).context("IO_LIVE")?,
        Array::try_from(session.take_map("IO_DEPTH")?).context("IO_DEPTH")?,
        nslots,
    );
    slots.refresh(&disks_at_load)?;
    session.attach_planned(&hooks, &plan)?;
    if classic && want_bio {
        session.left_out.push((
            "block:block_bio_queue",
            "classic tracepoints key requests by (dev, sector): no bio to match, so a request's time starts at its insert".to_string(),
        ));
    } else if !want_bio {
        session.left_out.push((
            "block:block_bio_queue",
            "--from request: a request's time starts at its insert (or its issue without a scheduler), as biolatency -Q times it; the wait before it (plugging, a tag) is not measured".to_string(),
        ));
    }
    if let Err(why) = &dirty {
        session.skipped.push((
            "writeback:writeback_dirty_folio",
            format!("{why}: writeback is not traced to the processes that dirtied its pages"),
        ));
    }
    let dirty_bytes = matches!(dirty, Ok((_, wb)) if wb != 0);
    let agg = GenMap::take(&mut session, "IO_AGG", Some("IO_OTHER"), IoVal::ZERO)?;
    let devs = GenMap::take(&mut session, "IO_DEV_VALS", None, DevVal::ZERO)?;
    let dirtied = GenMap::take(
        &mut session,
        "IO_DIRTY",
        Some("IO_DIRTY_OTHER"),
        DirtyVal::ZERO,
    )?;
    let new = RingBuf::try_from(session.take_map("IO_NEW")?).context("IO_NEW")?;
    // Read after attaching: the diskstats deltas count from here, as the programs do.
    let disk_now = disks::diskstats().unwrap_or_default();
    let names = names::Names::new(errno);
    Ok(Box::new(IoLat {
        session,
        agg,
        devs,
        dirtied,
        dirty_bytes,
        slots,
        new,
        timer: sample_timer()?,
        sampler: depth::Sampler::default(),
        facts: ctx.facts.clone(),
        cgroups: cgroup_resolver(),
        disk_prev: disk_now,
        names,
        mode,
        dev,
        scope: scope.clone(),
        fold: crate::report::who::Folding::new(scope.by_container),
        max_rows: args.rows,
        from,
        misses_prev: 0,
        anom_prev: [0; NANOM as usize],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::tracefs::parse_format;

    fn fixture(event: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/io_lat")
            .join(format!("{event}.format.6.18"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    const ALL: [&str; 3] = ["block_rq_complete", "block_rq_issue", "block_rq_insert"];

    /// The classic records of 6.18 give the offsets the kernel object was built with, and a
    /// layout where insert and issue disagree is refused with a one-line reason.
    #[test]
    fn classic_offsets_from_format_files() {
        let fmt = |e: &str| Ok(parse_format(&fixture(e), e)?);
        assert_eq!(tp_offsets(fmt, &ALL).unwrap(), TpOffsets::INIT);
        let moved = |e: &str| {
            let text = fixture(e);
            let text = if e == "block_rq_insert" {
                text.replace("bytes;\toffset:28", "bytes;\toffset:36")
            } else {
                text
            };
            Ok(parse_format(&text, e)?)
        };
        let err = tp_offsets(moved, &ALL).unwrap_err().to_string();
        assert!(err.contains("block:block_rq_insert: `bytes`"), "{err}");
        // Without insert attached, its layout does not matter.
        assert_eq!(tp_offsets(moved, &ALL[..2]).unwrap(), TpOffsets::INIT,);
    }
}
