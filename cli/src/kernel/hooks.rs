//! One hook specification per tool, and one attach policy that both the loader and `doctor`
//! follow, so `doctor` predicts exactly what a tool will do on this kernel.
//!
//! A [`Hook`] names the kernel event (a tracepoint `category:name`, or a kernel function for
//! fentry/kprobe), the tracepoint fields the classic program reads, and the program to use for
//! each attach mode the tool ships, cheapest first. [`choose`] takes the first mode this kernel
//! allows and says why each cheaper one was rejected.

use std::{cell::OnceCell, collections::HashSet};

use crate::{
    kernel::btf,
    kernel::features::{self, Probe},
    kernel::tracefs::{EventFormat, Tracefs},
};

/// How a program attaches, cheapest first in the usual order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttachMode {
    /// BTF-typed raw tracepoint: direct loads from typed arguments, no helper calls.
    TpBtf,
    /// Raw tracepoint: untyped arguments read with `bpf_probe_read_kernel`.
    RawTp,
    /// Classic tracepoint: fields at offsets from the event's tracefs `format`.
    Tracepoint,
    /// fentry on a kernel function (BPF trampoline; needs BTF and trampoline support).
    Fentry,
    /// fexit on a kernel function (sees the return value and the arguments).
    Fexit,
    /// kprobe on a kernel function (`CONFIG_KPROBES`).
    Kprobe,
    /// kretprobe on a kernel function.
    Kretprobe,
    /// A perf event (software CPU clock sampling), for profilers.
    PerfEvent,
}

impl AttachMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::TpBtf => "tp_btf",
            AttachMode::RawTp => "raw_tp",
            AttachMode::Tracepoint => "tracepoint",
            AttachMode::Fentry => "fentry",
            AttachMode::Fexit => "fexit",
            AttachMode::Kprobe => "kprobe",
            AttachMode::Kretprobe => "kretprobe",
            AttachMode::PerfEvent => "perf_event",
        }
    }
}

/// `--attach MODE`: the tracepoint mode a tool is forced into (tests compare the modes; a
/// kernel where the cheaper mode misbehaves). The names are doctor's mode names; the
/// kebab-case spellings are accepted too.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForceMode {
    /// BTF tracepoints (cheapest).
    #[value(name = "tp_btf", alias = "tp-btf")]
    TpBtf,
    /// Raw tracepoints with probe reads.
    #[value(name = "raw_tp", alias = "raw-tp")]
    RawTp,
    /// Classic tracepoints, fields at offsets from tracefs.
    Tracepoint,
}

impl From<ForceMode> for AttachMode {
    fn from(m: ForceMode) -> AttachMode {
        match m {
            ForceMode::TpBtf => AttachMode::TpBtf,
            ForceMode::RawTp => AttachMode::RawTp,
            ForceMode::Tracepoint => AttachMode::Tracepoint,
        }
    }
}

/// One kernel hook of a tool.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    /// `category:name` of a tracepoint, or a kernel function name for fentry/kprobe modes.
    pub event: &'static str,
    /// The raw tracepoint the tp_btf and raw_tp modes attach to, when it is not the event's own
    /// name (`sys_enter` for `syscalls:sys_enter_fsync`: one program filters by syscall number),
    /// or the kernel function fentry/kprobe modes attach to (`__x64_sys_fsync`).
    pub raw: Option<&'static str>,
    /// Fields read from the event's format (classic tracepoint mode).
    pub fields: &'static [&'static str],
    /// The program for each attach mode the tool ships, cheapest first.
    pub programs: &'static [(AttachMode, &'static str)],
    /// The tool still runs without this hook (it reports what is missing).
    pub optional: bool,
    /// Hooks with the same non-empty group attach in one mode (a begin/end pair; the six
    /// sync syscalls): the first mode in which every required hook of the group and at least
    /// one hook attach; optional hooks that cannot attach that way are skipped.
    pub group: &'static str,
    /// When the tool attaches this hook, in words, if not on every run ("" = always): a hook
    /// only some runs need (`runq-lat`'s steal clock, on a node with CPU steal) is left out of
    /// the others so that they do not pay for it, and the tool's meta line lists it under
    /// `left_out` with the reason. `doctor` prints the condition beside the mode.
    pub when: &'static str,
}

impl Hook {
    /// A hook with every field defaulted but the event (for `const` tables:
    /// `Hook { programs: &[...], ..Hook::event("sched:sched_switch") }`).
    pub const fn event(event: &'static str) -> Hook {
        Hook {
            event,
            raw: None,
            fields: &[],
            programs: &[],
            optional: false,
            group: "",
            when: "",
        }
    }

    /// A hook on `event` run by `programs` (one per attach mode), every other field defaulted.
    pub const fn on(event: &'static str, programs: &'static [(AttachMode, &'static str)]) -> Hook {
        Hook {
            programs,
            ..Hook::event(event)
        }
    }

    /// This hook with only `mode`'s program (`--attach`), or with none where it ships none in
    /// that mode (the policy then skips it, or fails the tool if it is required).
    pub fn only(&self, mode: AttachMode) -> Hook {
        Hook {
            programs: match self.programs.iter().position(|p| p.0 == mode) {
                Some(i) => &self.programs[i..=i],
                None => &[],
            },
            ..*self
        }
    }

    /// Where a program in `mode` attaches: the tracepoint event, the raw tracepoint, or the
    /// kernel function.
    pub fn attach_target(&self, mode: AttachMode) -> &'static str {
        match mode {
            AttachMode::Tracepoint => self.event,
            _ => self.raw.unwrap_or_else(|| self.name()),
        }
    }
}

impl Hook {
    /// `(category, name)` of a tracepoint event; `None` for a bare function name.
    pub fn tracepoint_name(&self) -> Option<(&'static str, &'static str)> {
        self.event.split_once(':')
    }

    /// The function or tracepoint name without its category.
    pub fn name(&self) -> &'static str {
        self.tracepoint_name().map_or(self.event, |(_, n)| n)
    }

    pub fn modes(&self) -> impl Iterator<Item = AttachMode> + '_ {
        self.programs.iter().map(|(m, _)| *m)
    }
}

/// The program of attach mode `$mode` for a hook whose programs are named after `$base`: the
/// one naming scheme of every tool's programs (`tk_x` for tp_btf, fentry, fexit and perf
/// events; `tk_x_raw` for raw_tp, `tk_x_tp` for a classic tracepoint, `tk_x_kp` for a kprobe,
/// `tk_x_krp` for a kretprobe). No hook has two modes of the bare name.
#[macro_export]
macro_rules! hook_program {
    (TpBtf, $base:literal) => {
        ($crate::kernel::hooks::AttachMode::TpBtf, $base)
    };
    (RawTp, $base:literal) => {
        (
            $crate::kernel::hooks::AttachMode::RawTp,
            concat!($base, "_raw"),
        )
    };
    (Tracepoint, $base:literal) => {
        (
            $crate::kernel::hooks::AttachMode::Tracepoint,
            concat!($base, "_tp"),
        )
    };
    (Fentry, $base:literal) => {
        ($crate::kernel::hooks::AttachMode::Fentry, $base)
    };
    (Fexit, $base:literal) => {
        ($crate::kernel::hooks::AttachMode::Fexit, $base)
    };
    (Kprobe, $base:literal) => {
        (
            $crate::kernel::hooks::AttachMode::Kprobe,
            concat!($base, "_kp"),
        )
    };
    (Kretprobe, $base:literal) => {
        (
            $crate::kernel::hooks::AttachMode::Kretprobe,
            concat!($base, "_krp"),
        )
    };
    (PerfEvent, $base:literal) => {
        ($crate::kernel::hooks::AttachMode::PerfEvent, $base)
    };
}

/// A [`Hook`] on `$event` with one program per listed mode, cheapest first, named by
/// [`hook_program!`]; any other field of `Hook` follows:
/// `hook!("sched:sched_switch", "tk_sched_switch", [TpBtf, RawTp], optional: true)`.
#[macro_export]
macro_rules! hook {
    ($event:expr, $base:literal, [$($mode:ident),+ $(,)?] $(, $field:ident: $value:expr)* $(,)?) => {
        $crate::kernel::hooks::Hook {
            programs: &[$($crate::hook_program!($mode, $base)),+],
            $($field: $value,)*
            ..$crate::kernel::hooks::Hook::event($event)
        }
    };
}

/// The enter and exit hooks of each syscall of a family, one program pair for all of them,
/// named by [`hook_program!`] after `$enter` and `$exit`: classic events
/// `syscalls:sys_{enter,exit}_<name>` (each optional: a kernel lacks some), or the raw
/// `sys_enter`/`sys_exit` every syscall passes, where the program filters by number. All of
/// them attach in one mode (`$group`).
#[macro_export]
macro_rules! syscall_hooks {
    ($enter:literal, $exit:literal, $group:literal, [$($name:literal),* $(,)?]) => {
        &[$(
            $crate::hook!(
                concat!("syscalls:sys_enter_", $name),
                $enter,
                [Tracepoint, TpBtf],
                raw: Some("sys_enter"),
                fields: &["__syscall_nr"],
                optional: true,
                group: $group,
            ),
            $crate::hook!(
                concat!("syscalls:sys_exit_", $name),
                $exit,
                [Tracepoint, TpBtf],
                raw: Some("sys_exit"),
                fields: &["ret"],
                optional: true,
                group: $group,
            ),
        )*]
    };
}

/// Kernel-wide facts that decide attach modes. Probes run on first use and are cached, so a
/// tool whose hooks are all classic tracepoints never loads a probe program.
pub struct Env {
    btf: OnceCell<bool>,
    raw_tp: OnceCell<Probe>,
    fentry: OnceCell<Probe>,
    kprobes: OnceCell<Probe>,
    /// The mounted tracefs (mounted on first need, as `mount -t tracefs` would), or why there
    /// is none.
    tracefs: OnceCell<Result<Tracefs, String>>,
    /// Tracefs could not be read for lack of a capability (so a tool that needed it exits 3).
    tracefs_permission: std::cell::Cell<bool>,
}

impl Env {
    /// Probes this kernel on demand (tracefs too: found or mounted on first need).
    pub fn detect() -> Env {
        Env {
            btf: OnceCell::new(),
            raw_tp: OnceCell::new(),
            fentry: OnceCell::new(),
            kprobes: OnceCell::new(),
            tracefs: OnceCell::new(),
            tracefs_permission: std::cell::Cell::new(false),
        }
    }

    /// The mounted tracefs, or why there is none.
    pub fn tracefs(&self) -> &Result<Tracefs, String> {
        self.tracefs.get_or_init(|| {
            Tracefs::open().map_err(|e| {
                use super::tracefs::TracefsError as T;
                if matches!(e, T::Permission { .. } | T::MountPermission { .. }) {
                    self.tracefs_permission.set(true);
                }
                e.to_string()
            })
        })
    }

    /// Whether tracefs was unusable for lack of a capability.
    pub fn tracefs_denied(&self) -> bool {
        self.tracefs_permission.get()
    }

    /// Fixed answers (tests, and replaying another kernel's doctor report).
    pub fn fixed(
        btf: bool,
        raw_tp: Probe,
        fentry: Probe,
        kprobes: Probe,
        tracefs: Result<Tracefs, String>,
    ) -> Env {
        let e = Env::detect();
        let _ = e.tracefs.set(tracefs);
        let _ = e.btf.set(btf);
        let _ = e.raw_tp.set(raw_tp);
        let _ = e.fentry.set(fentry);
        let _ = e.kprobes.set(kprobes);
        e
    }

    pub fn btf(&self) -> bool {
        *self.btf.get_or_init(features::btf_present)
    }
    pub fn raw_tp(&self) -> &Probe {
        self.raw_tp.get_or_init(|| features::raw_tp_probe().clone())
    }
    pub fn fentry(&self) -> &Probe {
        self.fentry.get_or_init(|| features::fentry_probe().clone())
    }
    pub fn kprobes(&self) -> &Probe {
        self.kprobes
            .get_or_init(|| features::kprobes_probe().clone())
    }
}

/// Where the policy looks kernel symbols up, loaded on first use and shared by every hook.
#[derive(Default)]
pub struct Symbols {
    kallsyms: OnceCell<Option<HashSet<String>>>,
}

impl Symbols {
    fn btf(&self) -> Option<&'static btf::Btf> {
        btf::vmlinux().ok()
    }

    fn kallsyms(&self) -> Option<&HashSet<String>> {
        self.kallsyms
            .get_or_init(|| crate::host::kallsyms::functions().ok())
            .as_ref()
    }
}

/// What the kernel shows about one hook's event, computed only as far as the policy asks.
pub struct Facts<'a> {
    hook: &'a Hook,
    env: &'a Env,
    symbols: &'a Symbols,
    format: OnceCell<Result<EventFormat, String>>,
}

impl<'a> Facts<'a> {
    pub fn new(hook: &'a Hook, env: &'a Env, symbols: &'a Symbols) -> Facts<'a> {
        Facts {
            hook,
            env,
            symbols,
            format: OnceCell::new(),
        }
    }

    /// Prefilled format (tests; tools that already parsed it).
    pub fn with_format(self, f: Result<EventFormat, String>) -> Facts<'a> {
        let _ = self.format.set(f);
        self
    }

    /// The classic tracepoint's format, or why there is none.
    pub fn format(&self) -> &Result<EventFormat, String> {
        self.format
            .get_or_init(|| match (self.hook.tracepoint_name(), self.env.tracefs()) {
                (Some((c, n)), Ok(t)) => t.format(c, n).map_err(|e| {
                    if matches!(e, super::tracefs::TracefsError::Permission { .. }) {
                        self.env.tracefs_permission.set(true);
                    }
                    e.to_string()
                }),
                (Some(_), Err(e)) => Err(format!("tracefs unavailable: {e}")),
                (None, _) => Err(format!(
                    "{} is a function, not a tracepoint",
                    self.hook.event
                )),
            })
    }

    /// `btf_trace_<name>` is in the kernel's BTF (`None`: BTF unreadable).
    fn btf_tp(&self) -> Option<bool> {
        let b = self.symbols.btf()?;
        Some(
            // The raw tracepoint the program attaches to: `sys_enter` for the per-syscall events.
            b.find_typedef(&format!(
                "btf_trace_{}",
                self.hook.attach_target(AttachMode::TpBtf)
            ))
            .is_some(),
        )
    }

    fn btf_func(&self) -> Option<bool> {
        Some(
            self.symbols
                .btf()?
                .find_func(self.hook.attach_target(AttachMode::Fentry))
                .is_some(),
        )
    }

    fn kallsyms(&self) -> Option<bool> {
        Some(
            self.symbols
                .kallsyms()?
                .contains(self.hook.attach_target(AttachMode::Kprobe)),
        )
    }
}

/// The policy's answer for one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub event: &'static str,
    pub optional: bool,
    /// The mode and program to use, if any works.
    pub mode: Option<(AttachMode, &'static str)>,
    /// Why this mode (or why none).
    pub why: String,
    /// Cheaper modes the hook ships that this kernel does not allow, with the reason.
    pub rejected: Vec<(AttachMode, String)>,
}

fn try_mode(mode: AttachMode, f: &Facts) -> Result<String, String> {
    let (hook, env) = (f.hook, f.env);
    let name = hook.attach_target(mode);
    let is_tp = hook.tracepoint_name().is_some();
    match mode {
        AttachMode::TpBtf | AttachMode::RawTp => {
            if !is_tp {
                return Err(format!("{name} is a function, not a tracepoint"));
            }
            if hook.event.starts_with("syscalls:") && hook.raw.is_none() {
                // Per-syscall events are built by ftrace on top of raw_syscalls:sys_enter/exit.
                return Err("syscalls:* events are not raw tracepoints".into());
            }
            if !env.raw_tp().available {
                return Err(format!("raw tracepoints unavailable: {}", env.raw_tp().why));
            }
            if mode == AttachMode::TpBtf && !env.btf() {
                return Err("no kernel BTF (/sys/kernel/btf/vmlinux)".into());
            }
            match (mode, f.btf_tp()) {
                (AttachMode::TpBtf, Some(true)) => Ok(format!("kernel BTF has btf_trace_{name}")),
                (AttachMode::TpBtf, Some(false)) => {
                    Err(format!("kernel BTF has no btf_trace_{name}"))
                }
                (AttachMode::TpBtf, None) => Err("kernel BTF could not be read".into()),
                (_, Some(true)) => Ok(format!("raw tracepoint {name} exists")),
                _ if hook.raw.is_none() && f.format().is_ok() => {
                    Ok(format!("raw tracepoint {name} exists"))
                }
                _ => Err(format!("no tracepoint {name} in this kernel")),
            }
        }
        AttachMode::Tracepoint => {
            let fmt = f.format().as_ref().map_err(Clone::clone)?;
            let missing: Vec<&str> = hook
                .fields
                .iter()
                .copied()
                .filter(|x| fmt.field(x).is_err())
                .collect();
            if !missing.is_empty() {
                return Err(format!("format lacks field(s) {}", missing.join(", ")));
            }
            Ok(if hook.fields.is_empty() {
                "tracefs has the event".to_string()
            } else {
                format!("tracefs format has {}", hook.fields.join(", "))
            })
        }
        AttachMode::Fentry | AttachMode::Fexit => {
            if !env.fentry().available {
                return Err(format!("fentry unavailable: {}", env.fentry().why));
            }
            match f.btf_func() {
                Some(true) => Ok(format!("kernel BTF has function {name}")),
                Some(false) => Err(format!(
                    "no function {name} in kernel BTF (renamed, or inlined on this kernel)"
                )),
                None => Err("kernel BTF could not be read".into()),
            }
        }
        AttachMode::Kprobe | AttachMode::Kretprobe => {
            if !env.kprobes().available {
                return Err(format!("kprobes unavailable: {}", env.kprobes().why));
            }
            match f.kallsyms() {
                Some(true) => Ok(format!("{name} is in /proc/kallsyms")),
                Some(false) => Err(format!(
                    "{name} is not in /proc/kallsyms (renamed, or inlined on this kernel)"
                )),
                None => Err("/proc/kallsyms could not be read".into()),
            }
        }
        AttachMode::PerfEvent => Ok("perf events are always available to root".into()),
    }
}

/// The first of the hook's modes this kernel allows, with the reasons for the ones before it.
pub fn choose(f: &Facts) -> Choice {
    let hook = f.hook;
    let mut rejected = Vec::new();
    for &(m, program) in hook.programs {
        match try_mode(m, f) {
            Ok(why) => {
                return Choice {
                    event: hook.event,
                    optional: hook.optional,
                    mode: Some((m, program)),
                    why,
                    rejected,
                }
            }
            Err(why) => rejected.push((m, why)),
        }
    }
    let why = if hook.programs.is_empty() {
        "the hook declares no attach mode".to_string()
    } else {
        "no attach mode works on this kernel".to_string()
    };
    Choice {
        event: hook.event,
        optional: hook.optional,
        mode: None,
        why,
        rejected,
    }
}

/// The choices for every hook of a tool, groups applied: hooks of one group attach in one mode,
/// the first of their (shared) modes in which every required hook of the group and at least one
/// hook can attach.
pub fn choose_all(hooks: &[Hook], env: &Env, symbols: &Symbols) -> Vec<Choice> {
    choose_all_with_facts(hooks, env, symbols)
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

/// [`choose_all`], with each hook's [`Facts`] as the policy read them (each read once), for
/// `doctor` to show the fields, offsets and sizes the event's format has.
pub fn choose_all_with_facts<'a>(
    hooks: &'a [Hook],
    env: &'a Env,
    symbols: &'a Symbols,
) -> Vec<(Choice, Facts<'a>)> {
    let all: Vec<Facts> = hooks.iter().map(|h| Facts::new(h, env, symbols)).collect();
    let mut out: Vec<Choice> = all.iter().map(choose).collect();
    let mut done: Vec<&str> = Vec::new();
    for h in hooks {
        let g = h.group;
        if g.is_empty() || done.contains(&g) {
            continue;
        }
        done.push(g);
        let members: Vec<usize> = (0..hooks.len()).filter(|&i| hooks[i].group == g).collect();
        let modes: Vec<AttachMode> = hooks[members[0]].modes().collect();
        let facts: Vec<&Facts> = members.iter().map(|&i| &all[i]).collect();
        let mut chosen = None;
        for m in &modes {
            let ok: Vec<bool> = facts.iter().map(|f| try_mode(*m, f).is_ok()).collect();
            let required_ok = members
                .iter()
                .zip(&ok)
                .all(|(&i, &o)| o || hooks[i].optional);
            if required_ok && ok.iter().any(|&o| o) {
                chosen = Some((*m, ok));
                break;
            }
        }
        for (k, &i) in members.iter().enumerate() {
            let c = &mut out[i];
            match &chosen {
                Some((m, ok)) if ok[k] => {
                    let program = hooks[i]
                        .programs
                        .iter()
                        .find(|(pm, _)| pm == m)
                        .map(|(_, p)| *p)
                        .unwrap_or("");
                    if c.mode != Some((*m, program)) {
                        c.rejected = hooks[i]
                            .programs
                            .iter()
                            .take_while(|(pm, _)| pm != m)
                            .map(|(pm, _)| (*pm, group_reason(*pm, facts[k], g)))
                            .collect();
                        c.why = format!("group {g} attaches as {}", m.as_str());
                        c.mode = Some((*m, program));
                    }
                }
                Some((m, _)) => {
                    c.mode = None;
                    c.why = format!(
                        "group {g} attaches as {}, which this hook cannot ({})",
                        m.as_str(),
                        try_mode(*m, facts[k]).err().unwrap_or_default()
                    );
                }
                None => {
                    c.mode = None;
                    c.why = format!("no attach mode works for every required hook of group {g}");
                }
            }
        }
    }
    out.into_iter().zip(all).collect()
}

fn group_reason(mode: AttachMode, f: &Facts, group: &str) -> String {
    match try_mode(mode, f) {
        Err(e) => e,
        Ok(_) => format!(
            "another hook of group {group} cannot attach as {}",
            mode.as_str()
        ),
    }
}

/// Whether a tool can run: every required hook attaches, and when all are optional, at least
/// one does; with a one-line reason.
pub fn tool_verdict(choices: &[Choice]) -> (bool, String) {
    let failed: Vec<&Choice> = choices
        .iter()
        .filter(|c| !c.optional && c.mode.is_none())
        .collect();
    let usable = choices.iter().filter(|c| c.mode.is_some()).count();
    if let Some(c) = failed.first() {
        let last = c.rejected.last().map(|(_, w)| w.as_str()).unwrap_or(&c.why);
        let more = if failed.len() > 1 {
            format!(", and {} more", failed.len() - 1)
        } else {
            String::new()
        };
        return (
            false,
            format!("required hook {} cannot attach ({last}){more}", c.event),
        );
    }
    if usable == 0 {
        return (
            false,
            format!("none of its {} optional hooks can attach", choices.len()),
        );
    }
    let skipped: Vec<&str> = choices
        .iter()
        .filter(|c| c.mode.is_none())
        .map(|c| c.event)
        .collect();
    let mut why = format!("{usable} of {} hooks attach", choices.len());
    if !skipped.is_empty() {
        why.push_str(&format!("; skipped (optional): {}", skipped.join(", ")));
    }
    (true, why)
}

#[cfg(test)]
mod tests;
