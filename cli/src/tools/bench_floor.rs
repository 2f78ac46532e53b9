//! `tracekit bench-floor --hook …`: attaches the floor program (a per-CPU counter bump) to the
//! hook a benchmark workload exercises, so `cargo xtask bench` can measure the cost of the hook
//! itself beside each tool. Hidden from `--help`, `doctor` and the README.

use aya::maps::PerCpuArray;

use crate::tools::prelude::*;

pub const INFO: ToolInfo = ToolInfo {
    name: "bench-floor",
    summary: "Benchmark control: the cheapest program on a hook.",
    hooks: HOOKS,
    triage: false,
    hidden: true,
    needs_btf: false,
    rows: &[],
    causes: &[],
    by_container: false,
    joins: &[],
};

const OBJECT: Object = crate::object!("floor");

/// The counter as a classic tracepoint program (one program, attached to any number of events).
const TP_COUNTER: &[(AttachMode, &str)] = &[(AttachMode::Tracepoint, "tk_floor_tp")];

const SWITCH: Hook = Hook {
    programs: &[
        (AttachMode::TpBtf, "tk_floor_btf"),
        (AttachMode::RawTp, "tk_floor_raw"),
    ],
    ..Hook::event("sched:sched_switch")
};
const SWITCH_TP: Hook = Hook::on("sched:sched_switch", TP_COUNTER);
const FSYNC_ENTER: Hook = Hook::on("syscalls:sys_enter_fsync", TP_COUNTER);
const FSYNC_EXIT: Hook = Hook::on("syscalls:sys_exit_fsync", TP_COUNTER);
const SYS_ENTER: Hook = Hook {
    raw: Some("sys_enter"),
    programs: &[(AttachMode::TpBtf, "tk_floor_sys")],
    ..Hook::event("raw_syscalls:sys_enter")
};

const WAKING: Hook = Hook::on(
    "sched:sched_waking",
    &[(AttachMode::TpBtf, "tk_floor_waking")],
);
const SWITCH_WAIT: Hook = Hook::on(
    "sched:sched_switch",
    &[(AttachMode::TpBtf, "tk_floor_wwait")],
);
const SWITCH_WAIT_PROC: Hook = Hook::on(
    "sched:sched_switch",
    &[(AttachMode::TpBtf, "tk_floor_wwait_proc")],
);
const SWITCH_WAIT_CTR: Hook = Hook::on(
    "sched:sched_switch",
    &[(AttachMode::TpBtf, "tk_floor_wwait_ctr")],
);
const SWITCH_NODE: Hook = Hook::on(
    "sched:sched_switch",
    &[(AttachMode::TpBtf, "tk_floor_node")],
);
const WAKEUP_STEAL: Hook = Hook::on(
    "sched:sched_wakeup",
    &[(AttachMode::TpBtf, "tk_floor_wakeup_steal")],
);
const SWITCH_WAIT_CUL: Hook = Hook::on(
    "sched:sched_switch",
    &[(AttachMode::TpBtf, "tk_floor_wwait_cul")],
);

/// A latency's lower bound on fsync-lat's hooks: a timestamp by thread at enter, a histogram
/// bucket at exit.
const FSYNC_TS_ENTER: Hook = Hook::on(
    "syscalls:sys_enter_fsync",
    &[(AttachMode::Tracepoint, "tk_floor_ts_enter")],
);
const FSYNC_TS_EXIT: Hook = Hook::on(
    "syscalls:sys_exit_fsync",
    &[(AttachMode::Tracepoint, "tk_floor_ts_exit")],
);

/// The receive path's hooks as `net-rx` uses them, each with the counter (classic tracepoints).
const NET_RX_PATH: [Hook; 4] = [
    Hook::on("skb:kfree_skb", TP_COUNTER),
    Hook::on("napi:napi_poll", TP_COUNTER),
    Hook::on("irq:softirq_entry", TP_COUNTER),
    Hook::on("irq:softirq_exit", TP_COUNTER),
];

/// The receive path's control: what net-rx records, at its least (tp_btf, 6.12+ `kfree_skb`).
const NET_RX_KEYED: [Hook; 4] = [
    Hook::on("skb:kfree_skb", &[(AttachMode::TpBtf, "tk_floor_drop")]),
    Hook::on("napi:napi_poll", &[(AttachMode::TpBtf, "tk_floor_napi")]),
    Hook::on(
        "irq:softirq_entry",
        &[(AttachMode::TpBtf, "tk_floor_si_entry")],
    ),
    Hook::on(
        "irq:softirq_exit",
        &[(AttachMode::TpBtf, "tk_floor_si_exit")],
    ),
];

/// A block request's lower bound for a tool splitting queue from device time per issuer: the
/// request's timestamps and issuer in a hash by request, two histogram buckets per process at
/// completion (tp_btf, 5.11+ prototypes).
const IO_SPLIT: [Hook; 3] = [
    Hook::on(
        "block:block_rq_insert",
        &[(AttachMode::TpBtf, "tk_floor_rq_insert")],
    ),
    Hook::on(
        "block:block_rq_issue",
        &[(AttachMode::TpBtf, "tk_floor_rq_issue")],
    ),
    Hook::on(
        "block:block_rq_complete",
        &[(AttachMode::TpBtf, "tk_floor_rq_complete")],
    ),
];

/// A bio's submission stamped (the clock into a per-CPU slot): with [`IO_SPLIT`], the least
/// io-lat's timing from submission adds.
const IO_BIO_STAMP: Hook = Hook::on(
    "block:block_bio_queue",
    &[(AttachMode::TpBtf, "tk_floor_bio")],
);

/// Every hook a floor run may use (each run uses the ones its workload exercises).
pub const HOOKS: &[Hook] = &[
    SWITCH,
    FSYNC_ENTER,
    FSYNC_EXIT,
    SYS_ENTER,
    WAKING,
    SWITCH_WAIT,
    SWITCH_WAIT_PROC,
    SWITCH_WAIT_CTR,
    WAKEUP_STEAL,
    SWITCH_WAIT_CUL,
    SWITCH_NODE,
    FSYNC_TS_ENTER,
    FSYNC_TS_EXIT,
    NET_RX_PATH[0],
    NET_RX_PATH[1],
    NET_RX_PATH[2],
    NET_RX_PATH[3],
    NET_RX_KEYED[0],
    NET_RX_KEYED[1],
    NET_RX_KEYED[2],
    NET_RX_KEYED[3],
    IO_SPLIT[0],
    IO_SPLIT[1],
    IO_SPLIT[2],
    IO_BIO_STAMP,
];

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorHook {
    /// `sched_switch`, tp_btf (raw_tp if tp_btf is refused).
    SchedSwitch,
    /// `sched_switch` as a classic tracepoint.
    SchedSwitchTp,
    /// `syscalls:sys_enter_fsync`, classic tracepoint.
    Fsync,
    /// The raw `sys_enter` tracepoint, tp_btf: what every syscall pays under a tool hooked
    /// there.
    SysEnter,
    /// `syscalls:sys_enter_fsync` and `syscalls:sys_exit_fsync`, classic tracepoints: the
    /// same hooks as `fsync-lat`, so kernel time per call compares like for like.
    FsyncPair,
    /// The lower bound of a wall-clock wakeup wait: `sched_waking` stores a timestamp in an
    /// array slot, `sched_switch` turns it into a histogram bucket (tp_btf only).
    WakeWait,
    /// `wake-wait` plus a per-process switch count in a hash: the least a per-process
    /// scheduler tool does on every switch.
    WakeWaitProc,
    /// `wake-wait` plus counting from the kernel's own switch counters, as ctxsw does: the
    /// switched-out task's `nvcsw`, `nivcsw`, `run_delay` and `nr_migrations` against a
    /// baseline by tid, the deltas added to a per-process row.
    WakeWaitCounters,
    /// `wake-wait-counters` plus what runq-lat records for each wait's culprit: the woken
    /// task's run queue steal clock at `sched_wakeup` and again at its switch-in, the wait
    /// charged to the task switched out (a pair in a hash) less its stolen part, charged to
    /// the hypervisor. Needs the steal clock's members (`se.cfs_rq`, `cfs_rq.rq`,
    /// `rq.prev_steal_time_rq`), as runq-lat's steal does.
    WakeWaitCulprits,
    /// `sched_switch` doing numa's work at its least: this CPU's last switch-in (tid and
    /// `se.sum_exec_runtime`) swapped for the incoming task's, the outgoing task's run since
    /// then added to its process's row for its CPU's node (an array lookup, a hash update).
    SwitchNode,
    /// `skb:kfree_skb`, `napi:napi_poll` and `irq:softirq_entry/exit`, classic tracepoints: the
    /// hooks `net-rx` needs, each with nothing but the counter.
    NetRxPath,
    /// The same four hooks doing what net-rx records per event, at its least: each drop
    /// counted by reason, place (IPv4 destination and port, from the packet's headers) and
    /// receiving socket (its inode) in per-CPU hashes, NET_RX softirq time and NAPI polls
    /// (those that used their budget too) per CPU. tp_btf with the 6.12+ `kfree_skb`
    /// prototype (`reason`, `rx_sk`).
    NetRxKeyed,
    /// `syscalls:sys_enter_fsync`/`sys_exit_fsync` timing each call (a timestamp by thread in a
    /// hash, a histogram bucket): the least a latency tool does per call.
    FsyncTimed,
    /// `block:block_rq_insert/issue/complete`, tp_btf: per request its insert and issue times
    /// and issuer in a hash by request, queue and device time as two histogram buckets of the
    /// issuing process at completion; the least a per-process queue/device split does.
    IoSplit,
    /// `io-split` plus `block:block_bio_queue` storing the clock in a per-CPU slot: the least
    /// that timing each request from its first bio's submission adds (one more hook per bio).
    IoSplitSubmit,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_enum, default_value = "sched-switch")]
    pub hook: FloorHook,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let hooks: &[Hook] = match args.hook {
        FloorHook::SchedSwitch => &[SWITCH],
        FloorHook::SchedSwitchTp => &[SWITCH_TP],
        FloorHook::Fsync => &[FSYNC_ENTER],
        FloorHook::SysEnter => &[SYS_ENTER],
        FloorHook::FsyncPair => &[FSYNC_ENTER, FSYNC_EXIT],
        FloorHook::WakeWait => &[WAKING, SWITCH_WAIT],
        FloorHook::WakeWaitProc => &[WAKING, SWITCH_WAIT_PROC],
        FloorHook::WakeWaitCounters => &[WAKING, SWITCH_WAIT_CTR],
        FloorHook::WakeWaitCulprits => &[WAKING, WAKEUP_STEAL, SWITCH_WAIT_CUL],
        FloorHook::SwitchNode => &[SWITCH_NODE],
        FloorHook::NetRxPath => &NET_RX_PATH,
        FloorHook::NetRxKeyed => &NET_RX_KEYED,
        FloorHook::FsyncTimed => &[FSYNC_TS_ENTER, FSYNC_TS_EXIT],
        FloorHook::IoSplit => &IO_SPLIT,
        FloorHook::IoSplitSubmit => &[IO_SPLIT[0], IO_SPLIT[1], IO_SPLIT[2], IO_BIO_STAMP],
    };
    let plan = crate::kernel::loader::plan(hooks, &ctx.env, &ctx.symbols)?;
    let mut spec = LoadSpec::new();
    if matches!(
        args.hook,
        FloorHook::WakeWait
            | FloorHook::WakeWaitProc
            | FloorHook::WakeWaitCounters
            | FloorHook::WakeWaitCulprits
            | FloorHook::SwitchNode
    ) {
        let btf = crate::kernel::btf::vmlinux()
            .map_err(|e| Error::KernelFeature(format!("bench-floor: kernel BTF: {e}")))?;
        spec = spec.global("FLOOR_PID_OFF", &btf.member("task_struct", "pid")?.offset);
        if matches!(
            args.hook,
            FloorHook::WakeWaitCounters | FloorHook::WakeWaitCulprits | FloorHook::SwitchNode
        ) {
            let mut offs = crate::tools::sched::task_offsets(btf)?;
            if args.hook == FloorHook::WakeWaitCulprits {
                crate::tools::sched::steal_offsets(btf, &mut offs).map_err(|e| {
                    Error::KernelFeature(format!(
                        "bench-floor: wake-wait-culprits needs the run queue's steal clock: {e}"
                    ))
                })?;
            }
            spec = spec.global("FLOOR_TASK_OFFS", &offs);
        }
    }
    if args.hook == FloorHook::NetRxKeyed {
        spec = net_rx_globals(spec)?;
    }
    let mut session = Session::load(OBJECT, ctx.scope.filter(), spec)?;
    session.attach_planned(hooks, &plan)?;
    if session.attached.is_empty() {
        return Err(Error::KernelFeature(format!(
            "bench-floor: {:?} cannot attach on this kernel",
            args.hook
        )));
    }
    Ok(Box::new(Floor {
        session,
        scope: ctx.scope.clone(),
        last: 0,
    }))
}

/// The receive-path control's globals: `sk_buff`/`sock` offsets as net-rx reads them,
/// `SKB_CONSUMED` and `NET_RX_SOFTIRQ` from the kernel's BTF.
fn net_rx_globals(spec: LoadSpec) -> Result<LoadSpec> {
    let btf = crate::kernel::btf::vmlinux()
        .map_err(|e| Error::KernelFeature(format!("bench-floor: kernel BTF: {e}")))?;
    // void *__data, skb, location, reason, rx_sk.
    if btf.proto_params("btf_trace_kfree_skb") != Some(5) {
        return Err(Error::KernelFeature(
            "bench-floor: net-rx-keyed needs the 6.12+ kfree_skb prototype (reason, rx_sk)".into(),
        ));
    }
    let consumed = btf
        .enum_value("SKB_CONSUMED")
        .map_or(u32::MAX, |v| v as u32);
    let vec = btf.enum_value("NET_RX_SOFTIRQ").map_or(3, |v| v as u32);
    Ok(spec
        .global("FLOOR_SKB", &crate::tools::net_rx::skb_offsets(btf)?)
        .global("FLOOR_SKB_CONSUMED", &consumed)
        .global("FLOOR_NET_RX_VEC", &vec))
}

struct Floor {
    session: Session,
    scope: crate::engine::Scope,
    last: u64,
}

impl Collector for Floor {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        Meta::of(INFO.name, "the floor counter", &self.scope, &self.session)
    }

    fn flip(&mut self) -> Result<()> {
        Ok(())
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let m: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.session
                .ebpf
                .map("FLOOR_COUNT")
                .ok_or_else(|| Error::other("FLOOR_COUNT missing from the floor object"))?,
        )
        .context("FLOOR_COUNT")?;
        let total: u64 = m.get(&0, 0).context("reading FLOOR_COUNT")?.iter().sum();
        let events = total - self.last;
        self.last = total;
        let mode = self
            .session
            .attached
            .first()
            .map(|a| a.mode)
            .unwrap_or(AttachMode::Tracepoint);
        Ok(Output {
            title: format!(
                "bench-floor: {events} events in {:.2}s ({})",
                w.secs(),
                mode.as_str()
            ),
            stats: Some(Stats::default().with("events", events)),
            ..Default::default()
        })
    }
}
