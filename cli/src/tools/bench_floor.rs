//! `tracekit bench-floor --hook sched_switch|fsync`: attaches the floor program (a per-CPU
//! counter bump) to the hook a benchmark workload exercises, so `cargo xtask bench` can measure
//! the cost of the hook itself beside each tool. Hidden from `--help`.

use aya::maps::PerCpuArray;
use serde_json::json;

use crate::{
    engine::{self, Collector, Window},
    kernel::loader::{self, AttachMode, LoadSpec, Session},
    options::Common,
    report::render::Report,
    tools::{self, Hook},
};

pub const NAME: &str = "bench-floor";
pub const REQUIRES_BTF: bool = false;
/// Either hook is enough: each run uses the one its workload exercises.
pub const HOOKS: &[Hook] = &[
    Hook {
        event: "sched:sched_switch",
        raw: None,
        fields: &[],
        modes: &[AttachMode::TpBtf, AttachMode::RawTp, AttachMode::Tracepoint],
        optional: true,
    },
    Hook {
        event: "syscalls:sys_enter_fsync",
        raw: None,
        fields: &[],
        modes: &[AttachMode::Tracepoint],
        optional: true,
    },
    Hook {
        event: "raw_syscalls:sys_enter",
        raw: Some("sys_enter"),
        fields: &[],
        modes: &[AttachMode::TpBtf],
        optional: true,
    },
    Hook {
        event: "syscalls:sys_exit_fsync",
        fields: &[],
        modes: &[AttachMode::Tracepoint],
        raw: None,
        optional: true,
    },
];

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum FloorHook {
    /// `sched_switch`, tp_btf (raw_tp if tp_btf is refused).
    SchedSwitch,
    /// `sched_switch` as a classic tracepoint.
    SchedSwitchTp,
    /// `syscalls:sys_enter_fsync`, classic tracepoint.
    Fsync,
    /// The raw `sys_enter` tracepoint, tp_btf: what every syscall pays under `fsync-lat`.
    SysEnter,
    /// `syscalls:sys_enter_fsync` and `syscalls:sys_exit_fsync`, classic tracepoints: the
    /// same hooks as `fsync-lat`, so kernel time per call compares like for like.
    FsyncPair,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_enum)]
    pub hook: FloorHook,
}

struct Floor {
    session: Session,
    last: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let sink = tools::preflight(NAME, &args.common)?;
    let mut session = Session::load(loader::FLOOR, &args.common, LoadSpec::new())?;
    match args.hook {
        FloorHook::SchedSwitch => {
            session.attach_raw("tk_floor_btf", "tk_floor_raw", "sched_switch")?;
        }
        FloorHook::SchedSwitchTp => {
            session.attach_tracepoint("tk_floor_tp", "sched", "sched_switch")?
        }
        FloorHook::Fsync => {
            crate::kernel::tracefs::Tracefs::open()?.format("syscalls", "sys_enter_fsync")?;
            session.attach_tracepoint("tk_floor_tp", "syscalls", "sys_enter_fsync")?
        }
        FloorHook::SysEnter => {
            session
                .attach_tp_btf("tk_floor_sys", "sys_enter")
                .map_err(|e| crate::error::UserError::KernelFeature(e.to_string()))?;
        }
        FloorHook::FsyncPair => {
            for ev in ["sys_enter_fsync", "sys_exit_fsync"] {
                crate::kernel::tracefs::Tracefs::open()?.format("syscalls", ev)?;
                session.attach_tracepoint("tk_floor_tp", "syscalls", ev)?;
            }
        }
    }
    let mut f = Floor { session, last: 0 };
    engine::drive(&args.common, sink, &mut f)?;
    Ok(())
}

impl Collector for Floor {
    fn preamble(&self) -> Option<Report> {
        Some(Report {
            json: vec![
                json!({"tool": NAME, "type": "meta", "programs": self.session.programs_json()}),
            ],
            ..Default::default()
        })
    }

    fn collect(&mut self, w: &Window) -> anyhow::Result<Report> {
        let m: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.session
                .ebpf
                .map("FLOOR_COUNT")
                .ok_or_else(|| anyhow::anyhow!("FLOOR_COUNT missing"))?,
        )?;
        let total: u64 = m.get(&0, 0)?.iter().sum();
        let events = total - self.last;
        self.last = total;
        let mode = self
            .session
            .attached
            .first()
            .map(|a| a.mode)
            .unwrap_or(AttachMode::Tracepoint);
        Ok(Report {
            title: format!(
                "bench-floor: {events} events in {:.2}s ({})",
                w.secs(),
                mode.as_str()
            ),
            json: vec![
                json!({"tool": NAME, "type": "stats", "events": events, "interval_ns": w.elapsed.as_nanos() as u64}),
            ],
            ..Default::default()
        })
    }
}
