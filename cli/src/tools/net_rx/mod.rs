//! `tracekit net-rx`: who loses received packets, why, and which CPU drowns in NET_RX softirq.
//!
//! Hooks (kernel side: `probes-ebpf/src/bin/net_rx.rs`): `skb:kfree_skb` (drops by reason and
//! place; the socket and its receive buffer at socket-level drops), `irq:softirq_entry/exit`
//! (NET_RX time per CPU), `napi:napi_poll` (polls that used their whole budget), and with
//! `--consume`, `skb:consume_skb` (normal frees, counted). Everything is aggregated in per-CPU
//! kernel maps: no per-packet ring-buffer traffic. Host counters (`/proc/net/snmp`, softnet_stat,
//! device statistics, ring sizes, conntrack, interrupts) come from `crate::host::net`.
//!
//! Drops and normal frees: since 5.17 the kernel reports normal frees with reason
//! `SKB_CONSUMED` (6.x on `consume_skb` instead of `kfree_skb`); the drop program tests that
//! reason first and counts such events apart (`consumed_via_kfree`). `NOT_SPECIFIED` is a plain
//! `kfree_skb()`: kept as its own reason, with a note. Kernels without reasons (5.10) count
//! every `kfree_skb` by place, and the cause is inferred from the dropping function and the
//! kernel's counters. Kernels without the `rx_sk` argument (before 6.12) find the socket of a
//! socket-level drop from the packet's destination port.

use crate::report::findings::Cause;
use aya::maps::{MapData, PerCpuArray};
use probes_common::net_rx::{
    CpuVal, DropKey, DropVal, SkbOffsets, SockKey, SockVal, NET_RX_SOFTIRQ, STAT_CONSUMED,
    STAT_NO_INODE, STAT_SOCK_MAP_FULL,
};

use crate::{
    engine::{Collector, Meta, Output, Scope, Stats, Window},
    error::{Context as _, Error, Result},
    host::{kallsyms::Symbolizer, net},
    kernel::{
        btf::{self, Btf},
        hooks::{AttachMode, ForceMode, Hook},
        loader::{self, Filter, LoadSpec, Object, Session},
        maps::PerCpuGenMap,
        proginfo,
        tracefs::EventFormat,
    },
    options::Common,
    report::{
        render::fmt_ns,
        rows::{Ctx, Section},
    },
    tools::{self, OpenCtx, ToolInfo},
};

mod devices;
mod findings;
mod listen;
mod owners;
mod reasons;
mod rows;
mod snapshot;

use owners::Owners;
use reasons::Reasons;
use rows::{CpuHooks, Names};
use snapshot::Snapshot;

pub const INFO: ToolInfo = ToolInfo {
    name: "net-rx",
    summary: "Who loses received packets and why: drops by reason (count, rate, protocol, destination, device, CPU), the receiving process and its socket buffer at socket-level drops, closed ports (\"nobody listens on udp/9999\"), NET_RX softirq time per CPU with NAPI budget exhaustion and softnet_stat backlog drops, device drops with ring sizes and IRQ affinity, conntrack fill; findings name the culprit and the fix.",
    hooks: HOOKS,
    triage: true,
    hidden: false,
    // sk_buff, sock, socket, file and inode members at BTF offsets, in every attach mode.
    needs_btf: true,
    rows: &[&rows::DROP_ROWS, &rows::SOCKET_ROWS, &listen::LISTEN_ROWS, &rows::CPU_ROWS, &devices::DEVICE_ROWS, &devices::CONNTRACK_ROWS],
    causes: &[NET_DROPS, LISTEN_OVERFLOW, NET_BACKLOG, SOFTIRQ_IMBALANCE, CONNTRACK_FULL],
    by_container: false,
    joins: &[],
};

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const NET_DROPS: Cause = Cause::new(
    "net-drops",
    "Received packets are dropped, by the kernel's reason and place.",
);
pub const LISTEN_OVERFLOW: Cause = Cause::new(
    "listen-overflow",
    "A listening socket's accept queue is full: new connections are dropped (TcpExt ListenOverflows).",
);
pub const NET_BACKLOG: Cause = Cause::new(
    "net-backlog",
    "A CPU's receive backlog overflows (net.core.netdev_max_backlog).",
);
pub const SOFTIRQ_IMBALANCE: Cause = Cause::new(
    "softirq-imbalance",
    "One CPU does the receive work (NET_RX softirq) for all of the node.",
);
pub const CONNTRACK_FULL: Cause = Cause::new(
    "conntrack-full",
    "The conntrack table is full: new connections are dropped.",
);

const OBJECT: Object = crate::object!("net_rx");

/// Every hook, cheapest mode first. Only the drop hook is required; `consume_skb` is attached
/// only with `--consume` (it fires for every packet delivered).
pub const HOOKS: &[Hook] = &[
    crate::hook!(
        "skb:kfree_skb",
        "tk_nr_drop",
        [TpBtf, RawTp, Tracepoint],
        fields: &["skbaddr", "location"],
    ),
    crate::hook!(
        "irq:softirq_entry",
        "tk_nr_softirq_entry",
        [TpBtf, RawTp],
        optional: true,
        group: "softirq",
    ),
    crate::hook!(
        "irq:softirq_exit",
        "tk_nr_softirq_exit",
        [TpBtf, RawTp],
        optional: true,
        group: "softirq",
    ),
    crate::hook!("napi:napi_poll", "tk_nr_napi", [TpBtf, RawTp], optional: true),
    crate::hook!("skb:consume_skb", "tk_nr_consume", [TpBtf, RawTp], optional: true),
];

const EXAMPLES: &str = "  tracekit net-rx --duration 10s                   # who drops what, which CPU does the receive work
  tracekit net-rx --duration 1m --interval 10s --json --output rx.ndjson
  tracekit net-rx --duration 10s --drops-only      # the drop hook alone (cheapest)";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on a kernel with BTF \
(/sys/kernel/btf/vmlinux gives the sk_buff layout and the tp_btf hooks). With those alone, reason \
names come from BTF only (tracefs is mode 0700: CAP_DAC_READ_SEARCH adds the tracepoint's own \
table and the classic-tracepoint fallback), drop locations are addresses (CAP_SYSLOG names them), \
and sockets of other users' processes have no owner (CAP_SYS_PTRACE names them).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Attach mode of the drop hook (default: the cheapest this kernel allows, tp_btf then
    /// raw_tp then tracepoint).
    #[arg(long, value_enum, value_name = "MODE")]
    pub attach: Option<ForceMode>,

    /// Also count normal frees (`skb:consume_skb`); it fires for every packet delivered, so it
    /// is off by default.
    #[arg(long)]
    pub consume: bool,

    /// Only the drop hook: no NET_RX softirq or NAPI hooks (cheapest; no softirq time per CPU).
    #[arg(long)]
    pub drops_only: bool,

    /// Behave as on kernels without the `rx_sk` argument (before 6.12): find sockets from the
    /// packets' destination port. For testing that path.
    #[arg(long, hide = true)]
    pub no_rx_sk: bool,

    /// Rows shown in the drop table, most drops first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// `sk_buff`/`sock`/`socket`/`file`/`inode` member offsets from the running kernel's BTF.
pub(crate) fn skb_offsets(btf: &Btf) -> Result<SkbOffsets> {
    let m = |s: &str, path: &str, size: u32| btf.member_offset(s, path, size);
    Ok(SkbOffsets {
        skb_len: m("sk_buff", "len", 4)?,
        skb_truesize: m("sk_buff", "truesize", 4)?,
        skb_protocol: m("sk_buff", "protocol", 2)?,
        skb_network_header: m("sk_buff", "network_header", 2)?,
        skb_transport_header: m("sk_buff", "transport_header", 2)?,
        skb_head: m("sk_buff", "head", 8)?,
        skb_dev: m("sk_buff", "dev", 8)?,
        skb_sk: m("sk_buff", "sk", 8)?,
        dev_ifindex: m("net_device", "ifindex", 4)?,
        sk_num: m("sock", "__sk_common.skc_num", 2)?,
        sk_family: m("sock", "__sk_common.skc_family", 2)?,
        // A u16 since 5.6; a bitfield before (then the protocol is not read).
        sk_protocol: m("sock", "sk_protocol", 2).unwrap_or(0),
        sk_rcvbuf: m("sock", "sk_rcvbuf", 4)?,
        sk_rmem_alloc: m("sock", "sk_backlog.rmem_alloc", 4)?,
        sk_socket: m("sock", "sk_socket", 8)?,
        socket_file: m("socket", "file", 8)?,
        file_inode: m("file", "f_inode", 8)?,
        inode_ino: m("inode", "i_ino", 8)?,
        sk_state: m("sock", "__sk_common.skc_state", 1)?,
        _pad: 0,
    })
}

/// The hooks this run attaches: the drop hook in the mode `--attach` asks for, the softirq and
/// NAPI hooks unless `--drops-only`, `consume_skb` with `--consume`.
fn hooks_for(args: &Args) -> Vec<Hook> {
    HOOKS
        .iter()
        .filter(|h| match h.event {
            "skb:consume_skb" => args.consume,
            "skb:kfree_skb" => true,
            _ => !args.drops_only,
        })
        .map(|h| match (args.attach, h.event) {
            (Some(m), "skb:kfree_skb") => h.only(m.into()),
            _ => *h,
        })
        .collect()
}

/// What the drop hook passes on this kernel: (`reason`, `rx_sk`). BTF prototype
/// `(void *, skb, location[, reason (5.17+)[, rx_sk (6.12+)]])`, or the classic event's fields.
fn drop_args(mode: AttachMode, btf: &Btf, fmt: Option<&EventFormat>) -> (bool, bool) {
    let from_fmt = fmt.map(|f| (f.field("reason").is_ok(), f.field("rx_sk").is_ok()));
    match (mode, btf.proto_params("btf_trace_kfree_skb"), from_fmt) {
        (AttachMode::Tracepoint, _, Some(f)) => f,
        (_, Some(n), _) => (n >= 4, n >= 5),
        (_, None, Some(f)) => f,
        _ => (false, false),
    }
}

/// Loads and attaches net-rx's programs as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let scope = &ctx.scope;
    if scope.threads {
        return Err(Error::Usage(
            "net-rx: --threads does not apply (drops happen in softirq context, on behalf of no thread); sockets belong to processes".into(),
        ));
    }
    let hooks = hooks_for(args);
    let plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
    let drop_mode = plan[0]
        .mode
        .map(|m| m.0)
        .ok_or_else(|| Error::KernelFeature("no attach mode for skb:kfree_skb".into()))?;
    if !crate::kernel::features::btf_present() {
        return Err(Error::KernelFeature(format!(
            "net-rx needs the kernel's BTF ({} is missing) for the sk_buff layout",
            btf::vmlinux_path().display()
        )));
    }
    let btf = btf::vmlinux()?;
    let offs = skb_offsets(btf)?;
    let tracefs = ctx.env.tracefs().as_ref().ok();
    let fmt = tracefs.and_then(|t| t.format("skb", "kfree_skb").ok());
    let (has_reason, kernel_rx_sk) = drop_args(drop_mode, btf, fmt.as_ref());
    let has_rx_sk = kernel_rx_sk && !args.no_rx_sk;
    let table = fmt
        .as_ref()
        .map(|f| f.symbols("reason"))
        .unwrap_or_default();
    let reasons = Reasons::new(
        &table,
        &btf.enum_named("skb_drop_reason").unwrap_or_default(),
        has_reason,
    );
    let net_rx_vec = tracefs
        .and_then(|t| t.format("irq", "softirq_entry").ok())
        .and_then(|f| f.symbols("vec").into_iter().find(|(_, n)| n == "NET_RX"))
        .map_or(NET_RX_SOFTIRQ, |(v, _)| v as u32);
    let tp_off = |f: &str| {
        fmt.as_ref()
            .and_then(|x| x.field(f).ok())
            .map_or(0, |x| x.offset)
    };
    let cap = scope.key_cap();
    let spec = LoadSpec::new()
        .global("NR_OFFS", &offs)
        .global("NR_CONSUMED", &reasons.consumed())
        .global("NR_HAS_REASON", &u8::from(has_reason))
        .global("NR_HAS_RX_SK", &u8::from(has_rx_sk))
        .global("NR_NET_RX_VEC", &net_rx_vec)
        .global("NR_TP_SKBADDR", &tp_off("skbaddr"))
        .global("NR_TP_LOCATION", &tp_off("location"))
        .global("NR_TP_RX_SK", &if has_rx_sk { tp_off("rx_sk") } else { 0 })
        .global("NR_TP_REASON", &tp_off("reason"))
        .max_entries("NR_DROPS", cap * 2)
        .max_entries("NR_SOCKS", cap)
        .tp_btf_planned(&hooks, &plan);
    let mut session = Session::load(OBJECT, Filter::default(), spec)?;
    session.attach_planned(&hooks, &plan)?;
    let attached = |event: &str| {
        hooks
            .iter()
            .zip(&plan)
            .any(|(h, c)| h.event == event && c.mode.is_some())
    };
    let cpu_hooks = CpuHooks {
        softirq: attached("irq:softirq_entry") && attached("irq:softirq_exit"),
        napi: attached("napi:napi_poll"),
        consume: attached("skb:consume_skb"),
    };
    let zero_drop = DropVal::default();
    let drops = PerCpuGenMap::take(&mut session, "NR_DROPS", Some("NR_DROP_OTHER"), zero_drop)?;
    let socks = PerCpuGenMap::take(&mut session, "NR_SOCKS", None, SockVal::default())?;
    let cpu: PerCpuArray<MapData, CpuVal> = PerCpuArray::try_from(session.take_map("NR_CPU")?)?;
    let mut tool = NetRx {
        drop_mode,
        has_rx_sk,
        kernel_rx_sk,
        reasons,
        drops,
        socks,
        cpu,
        cpu_prev: Vec::new(),
        host_prev: Snapshot::take(),
        syms: None,
        cpu_hooks,
        scope: scope.clone(),
        max_rows: args.rows,
        misses_prev: 0,
        learnt: owners::Learnt::default(),
        session,
    };
    tool.cpu_prev = tool.read_cpu()?;
    tool.misses_prev = proginfo::session_counters(&tool.session).recursion_misses;
    Ok(Box::new(tool))
}

struct NetRx {
    session: Session,
    drop_mode: AttachMode,
    /// The drop hook passes `rx_sk` (and it is used), and whether the kernel has it at all.
    has_rx_sk: bool,
    kernel_rx_sk: bool,
    reasons: Reasons,
    drops: PerCpuGenMap<DropKey, DropVal>,
    socks: PerCpuGenMap<SockKey, SockVal>,
    cpu: PerCpuArray<MapData, CpuVal>,
    /// Cumulative per-CPU counters at the previous window's end.
    cpu_prev: Vec<CpuVal>,
    host_prev: Snapshot,
    /// Kernel symbols for drop locations, loaded when the first drops arrive.
    syms: Option<Symbolizer>,
    cpu_hooks: CpuHooks,
    scope: Scope,
    max_rows: usize,
    misses_prev: u64,
    /// Owners of dropping sockets, read soon after their first drop.
    learnt: owners::Learnt,
}

/// How often the socket map is looked at for sockets whose owner is not known yet.
const LEARN_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

impl NetRx {
    fn read_cpu(&self) -> Result<Vec<CpuVal>> {
        Ok(self.cpu.get(&0, 0).context("reading NR_CPU")?.to_vec())
    }

    /// This window's per-CPU program counters (`max` stays cumulative).
    fn cpu_delta(&mut self) -> Result<Vec<CpuVal>> {
        let now = self.read_cpu()?;
        let d = now
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let p = self.cpu_prev.get(i).copied().unwrap_or_default();
                CpuVal {
                    start_ns: 0,
                    softirq_count: n.softirq_count.wrapping_sub(p.softirq_count),
                    softirq_ns: n.softirq_ns.wrapping_sub(p.softirq_ns),
                    softirq_max_ns: n.softirq_max_ns,
                    polls: n.polls.wrapping_sub(p.polls),
                    poll_work: n.poll_work.wrapping_sub(p.poll_work),
                    polls_full: n.polls_full.wrapping_sub(p.polls_full),
                    consumed: n.consumed.wrapping_sub(p.consumed),
                    kfree: n.kfree.wrapping_sub(p.kfree),
                }
            })
            .collect();
        self.cpu_prev = now;
        Ok(d)
    }

    /// The processes `--pid`/`--comm` keep (with `--children`, their descendants now), or
    /// `None` without a process filter.
    fn owners(&self) -> Option<Owners> {
        if self.scope.pids.is_empty() && self.scope.comm.is_none() {
            return None;
        }
        let pids = if self.scope.children {
            crate::host::proc::with_descendants(&self.scope.pids)
        } else {
            self.scope.pids.clone()
        };
        Some(Owners {
            pids,
            comm: self.scope.comm_bytes(),
        })
    }

    fn title(&self, w: &Window, drops: u64, softirq_ns: u64) -> String {
        let secs = w.secs();
        let mut hook = format!("drop hook {}", self.drop_mode.as_str());
        if !self.reasons.has_reason {
            hook.push_str(", no drop reasons on this kernel");
        } else if !self.has_rx_sk {
            hook.push_str(", sockets found by port");
        }
        let softirq = if self.cpu_hooks.softirq {
            format!("; NET_RX softirq {}", fmt_ns(softirq_ns))
        } else {
            String::new()
        };
        format!(
            "net-rx: {drops} drops ({:.1}/s) in {}; {hook}{softirq}",
            drops as f64 / secs,
            w.span()
        )
    }
}

/// The protocol counters worth showing beside the drops (their nonzero window deltas).
fn counter_note(c: &std::collections::BTreeMap<String, i64>) -> Option<String> {
    const SHOWN: &[&str] = &[
        "Udp:NoPorts",
        "Udp:RcvbufErrors",
        "Udp:InErrors",
        "Udp:InCsumErrors",
        "UdpLite:RcvbufErrors",
        "Udp6:RcvbufErrors",
        "Tcp:InErrs",
        "Tcp:InCsumErrors",
        "TcpExt:ListenOverflows",
        "TcpExt:ListenDrops",
        "TcpExt:TCPBacklogDrop",
        "TcpExt:TCPRcvQDrop",
        "TcpExt:TCPOFODrop",
        "TcpExt:PFMemallocDrop",
        "Ip:InDiscards",
        "Ip:InHdrErrors",
        "Ip:InAddrErrors",
    ];
    let parts: Vec<String> = SHOWN
        .iter()
        .filter_map(|k| c.get(*k).filter(|v| **v != 0).map(|v| format!("{k} +{v}")))
        .collect();
    (!parts.is_empty()).then(|| format!("kernel counters: {}", parts.join(", ")))
}

impl Collector for NetRx {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        let mut m = Meta::of(
            INFO.name,
            "packet drops and NET_RX softirq work",
            &self.scope,
            &self.session,
        );
        m.scope = if self.scope.pids.is_empty() && self.scope.comm.is_none() {
            "the whole node".into()
        } else {
            format!(
                "the whole node, drops at sockets of {}",
                self.scope.describe()
            )
        };
        m.with("attach", self.drop_mode.as_str())
            .with("has_reason", self.reasons.has_reason)
            .with("has_rx_sk", self.kernel_rx_sk)
            .with("rx_sk_used", self.has_rx_sk)
    }

    // No pid filter is loaded (drops happen on behalf of no process, and `open` refuses
    // `--pid`), but the engine's per-collector work gets the session like any other.
    // Userspace reads the socket map's keys, not the kernel waking it: nothing is added to
    // the drop path.
    fn poll_interval(&self) -> Option<std::time::Duration> {
        Some(LEARN_EVERY)
    }

    fn on_events(&mut self) -> Result<()> {
        self.learnt
            .learn(self.socks.keys().into_iter().map(|k| k.ino));
        Ok(())
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .drops
            .drain(self.session.drained())
            .context("reading NR_DROPS")?;
        let socks = self
            .socks
            .drain(self.session.drained())
            .context("reading NR_SOCKS")?;
        let cpu = self.cpu_delta()?;
        let st = self.session.stats_delta()?;
        let misses = proginfo::session_counters(&self.session).recursion_misses;
        let host_now = Snapshot::take();
        let host = host_now.since(&self.host_prev);
        self.host_prev = host_now;
        if !drained.rows.is_empty() && self.syms.is_none() {
            self.syms = Symbolizer::load().ok();
        }
        let secs = w.secs();
        let ifnames = net::interfaces();
        let names = Names {
            reasons: &self.reasons,
            syms: self.syms.as_ref(),
            ifnames: &ifnames,
            counters: &host.counters,
        };
        let mut drops = rows::drop_rows(&drained.rows, &drained.other, &names, secs);
        let mut socks = rows::sock_rows(&socks.rows, &drops, &names, secs);
        rows::from_learnt(&mut socks, &self.learnt);
        rows::attribute(&mut drops, &socks);
        let owners = self.owners();
        if let Some(o) = &owners {
            socks.retain(|s| o.owns(&s.pids, s.owner.comm.as_deref()));
            drops.retain(|d| {
                d.owner
                    .pid
                    .is_some_and(|p| o.owns(&[p], d.owner.comm.as_deref()))
            });
        }
        let (mut listens, listens_unknown) =
            match listen::rows(&listen::Accept::of(&host.counters), &drops) {
                Ok(l) => (l, None),
                Err(e) => (Vec::new(), Some(format!("accept queues unknown: {e}"))),
            };
        if let Some(o) = &owners {
            listens.retain(|l| o.owns(&l.pids, l.owner.comm.as_deref()));
        }
        let cpus = rows::cpu_rows(&cpu, &host.softnet, &drops, &self.cpu_hooks, secs);
        let devices = rows::device_rows(&host.devices, &host.irqs);
        let conntrack = rows::conntrack_row(&host.conntrack);

        let total: u64 = drops.iter().map(|d| d.count).sum();
        let softirq_ns: u64 = cpu.iter().map(|c| c.softirq_ns).sum();
        let mut out = Output {
            title: self.title(w, total, softirq_ns),
            ..Default::default()
        };
        if let Some(top) = cpus
            .iter()
            .filter(|c| c.share_pct.is_some())
            .max_by_key(|c| c.softirq_ns)
        {
            out.notes.push(format!(
                "{:.0} % of NET_RX on CPU {} ({} of {} over {} CPU(s) that ran it)",
                top.share_pct.unwrap_or(0.0),
                top.cpu,
                fmt_ns(top.softirq_ns.unwrap_or(0)),
                fmt_ns(softirq_ns),
                cpus.iter()
                    .filter(|c| c.softirq_ns.unwrap_or(0) > 0)
                    .count()
            ));
        }
        out.notes.extend(counter_note(&host.counters));
        out.notes.extend(listens_unknown);
        out.note_skipped(&self.session.skipped);
        if drops.is_empty() {
            out.notes.push("no packet drops seen".into());
        }
        // With --pid/--comm, findings are about those processes' sockets only; the CPU, device
        // and conntrack rows stay node-wide, as context.
        let filtered = owners.is_some();
        let no_conntrack = rows::ConntrackRow::default();
        if filtered {
            out.notes.push(format!(
                "drops at sockets of {} only; CPU, device and conntrack rows are node-wide",
                self.scope.describe()
            ));
        }
        out.findings = findings::findings(&findings::Evidence {
            drops: &drops,
            socks: &socks,
            listens: &listens,
            cpus: if filtered { &[] } else { &cpus },
            devices: if filtered { &[] } else { &devices },
            conntrack: if filtered { &no_conntrack } else { &conntrack },
            counters: &host.counters,
            secs,
            ncpus: crate::host::proc::possible_cpus(),
        });
        let ctx = Ctx { secs };
        out.sections.push(
            Section::build(&rows::DROP_ROWS, &drops, rows::DROPS, &ctx, self.max_rows)
                .caption("Drops by reason and place:"),
        );
        out.sections.push(
            Section::build(
                &rows::SOCKET_ROWS,
                &socks,
                rows::SOCKETS,
                &ctx,
                self.max_rows,
            )
            .caption("Receiving processes with socket-level drops:"),
        );
        out.sections.push(
            Section::build(&listen::LISTEN_ROWS, &listens, listen::LISTENS, &ctx, 0)
                .caption("Listening sockets whose accept queue overflowed:"),
        );
        out.sections.push(
            Section::build(&rows::CPU_ROWS, &cpus, rows::CPUS, &ctx, 0)
                .caption("Receive work per CPU (NET_RX softirq, NAPI, softnet_stat):"),
        );
        out.sections.push(
            Section::build(&devices::DEVICE_ROWS, &devices, rows::DEVICES, &ctx, 0)
                .caption("Devices that received or dropped packets:"),
        );
        out.sections.push(Section::build(
            &devices::CONNTRACK_ROWS,
            std::slice::from_ref(&conntrack),
            rows::CONNTRACK,
            &ctx,
            0,
        ));
        if drops.iter().any(|d| d.reason_from.is_some()) {
            out.footnotes.push(
                "This kernel passes no drop reason: reasons marked in JSON with reason_from=location are inferred from the dropping function and /proc/net/snmp.".into(),
            );
        }
        if socks.iter().any(|s| s.found_by == "port") {
            out.footnotes.push(
                "FOUND-BY port: the kernel passed no socket with these drops; the socket bound to the destination port now is shown (QUEUED is its unread bytes at the end of the window).".into(),
            );
        }
        let delta = serde_json::to_value(
            host.counters
                .iter()
                .filter(|(k, _)| {
                    ["Ip:", "Udp", "Tcp", "Icmp"]
                        .iter()
                        .any(|p| k.starts_with(p))
                })
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
        .unwrap_or_default();
        out.extra_json
            .push(serde_json::json!({"type": "snmp", "delta": delta}));
        let other: u64 = drained.other.iter().map(|x| x.count).sum();
        out.stats = Some(
            Stats::new(st)
                .with("drops", total)
                .with("consumed_via_kfree", st[STAT_CONSUMED as usize])
                .with("no_inode", st[STAT_NO_INODE as usize])
                .with("sock_map_full", st[STAT_SOCK_MAP_FULL as usize])
                .with("other", other)
                .with("recursion_misses", misses.wrapping_sub(self.misses_prev)),
        );
        self.misses_prev = misses;
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
