//! `tracekit doctor`: what every tool will do on this kernel, and why, before anyone traces.
//!
//! For each registered tool and each of its hooks (`tools::all_hooks()`): the attach mode that
//! will be used (the first of the hook's modes the kernel allows) and the reasons the cheaper ones
//! were rejected, and the tracepoint fields found or missing in the event's tracefs `format`.
//! Then the node: kernel version, BTF, tracefs (mounted here if absent, as tools do), raw_tp,
//! fentry and kprobes probes, cgroup v1/v2, NUMA nodes, THP, lockdown.
//!
//! Reads: `/proc/sys/kernel/osrelease`, `/proc/self/mountinfo`, `/sys/kernel/btf/vmlinux`,
//! `<tracefs>/events/<cat>/<name>/format`, `/proc/kallsyms` (only for kprobe hooks),
//! `/sys/devices/system/node`, `/sys/kernel/mm/transparent_hugepage/{enabled,defrag}`,
//! `/sys/kernel/security/lockdown`. Loads only the throw-away probe programs of `features`.

use std::{collections::HashSet, fs, path::Path};

use serde_json::{json, Value};

use crate::{
    error::UserError,
    host::{proc, SMALL_FILE},
    kernel::btf::Btf,
    kernel::features::{self, Probe},
    kernel::loader::AttachMode,
    kernel::tracefs::{EventFormat, Tracefs},
    report::output::Sink,
    tools::{self, Hook},
};

pub const NAME: &str = "doctor";
pub const HOOKS: &[Hook] = &[];
pub const REQUIRES_BTF: bool = false;

const EXAMPLES: &str = "  tracekit doctor                                  # what each tool will do on this kernel, and why
  tracekit doctor --json --output doctor.ndjson    # the same as NDJSON, to compare nodes";

const NEEDS: &str = "root, or CAP_BPF and CAP_PERFMON (its feature probes load programs); it \
reads tracefs with CAP_DAC_READ_SEARCH and mounts it with CAP_SYS_ADMIN. Run without them it \
says what is missing and exits 3.";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    /// NDJSON output: a `system` line, one `hook` line per tool and hook, one `tool` line per
    /// tool, and a `summary` line.
    #[arg(long)]
    pub json: bool,

    /// Write the report to FILE (as the tools do: replaced atomically when complete; a device
    /// or FIFO is written directly).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
}

/// Kernel-wide facts that decide attach modes.
#[derive(Clone, Debug)]
pub struct Env {
    /// Kernel BTF is present and parses (from `TRACEKIT_BTF` when set).
    pub btf: bool,
    pub raw_tp: Probe,
    pub fentry: Probe,
    pub kprobes: Probe,
    /// Where tracefs is, or why it is not available.
    pub tracefs: Result<String, String>,
}

/// What the kernel shows about one hook's event.
#[derive(Clone, Debug)]
pub struct HookFacts {
    /// The classic tracepoint's format, or why there is none.
    pub format: Result<EventFormat, String>,
    /// `btf_trace_<name>` is in the kernel's BTF (None: BTF absent or unreadable).
    pub btf_tp: Option<bool>,
    /// The function is in the kernel's BTF (for fentry).
    pub btf_func: Option<bool>,
    /// The function is in /proc/kallsyms (for kprobes).
    pub kallsyms: Option<bool>,
}

/// The verdict on one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookVerdict {
    pub event: String,
    pub optional: bool,
    pub mode: Option<AttachMode>,
    /// Why this mode (or why none).
    pub why: String,
    /// Cheaper modes the hook allows that this kernel does not, with the reason.
    pub rejected: Vec<(AttachMode, String)>,
    pub fields_found: Vec<String>,
    pub fields_missing: Vec<String>,
    /// (offset, size) of each field found: layouts differ between kernels.
    pub layout: Vec<(String, u32, u32)>,
    /// Why the format could not be read, if it could not.
    pub format_error: Option<String>,
}

/// `category:name` → (category, name); a bare function name has no category.
fn split_event(event: &str) -> (Option<&str>, &str) {
    match event.split_once(':') {
        Some((c, n)) => (Some(c), n),
        None => (None, event),
    }
}

fn try_mode(mode: AttachMode, hook: &Hook, env: &Env, f: &HookFacts) -> Result<String, String> {
    let (cat, name) = split_event(hook.event);
    let raw = hook.raw.unwrap_or(name);
    match mode {
        AttachMode::TpBtf => {
            if !env.btf {
                return Err("no usable kernel BTF".into());
            }
            if !env.raw_tp.available {
                return Err(format!("raw tracepoints unavailable: {}", env.raw_tp.why));
            }
            match f.btf_tp {
                Some(true) if raw != name => Ok(format!(
                    "kernel BTF has btf_trace_{raw} (one program on {raw} filters by syscall number)"
                )),
                Some(true) => Ok(format!("kernel BTF has btf_trace_{raw}")),
                Some(false) => Err(format!("kernel BTF has no btf_trace_{raw}")),
                None => Err("kernel BTF could not be read".into()),
            }
        }
        AttachMode::RawTp => {
            if !env.raw_tp.available {
                return Err(format!("raw tracepoints unavailable: {}", env.raw_tp.why));
            }
            if cat == Some("syscalls") && hook.raw.is_none() {
                // Per-syscall events are built by ftrace on top of raw_syscalls:sys_enter/exit.
                return Err("syscalls:* events are not raw tracepoints".into());
            }
            if f.format.is_ok() || f.btf_tp == Some(true) {
                Ok(format!("raw tracepoint {raw} exists"))
            } else {
                Err(format!("no tracepoint {raw} in this kernel"))
            }
        }
        AttachMode::Tracepoint => {
            if let Err(e) = &env.tracefs {
                return Err(format!("tracefs unavailable: {e}"));
            }
            let fmt = f.format.as_ref().map_err(Clone::clone)?;
            let missing: Vec<&str> = hook
                .fields
                .iter()
                .copied()
                .filter(|x| fmt.field(x).is_err())
                .collect();
            if missing.is_empty() {
                Ok(if hook.fields.is_empty() {
                    "tracefs has the event".to_string()
                } else {
                    format!("tracefs format has {}", hook.fields.join(", "))
                })
            } else {
                Err(format!("format lacks field(s) {}", missing.join(", ")))
            }
        }
        AttachMode::Fentry => {
            if !env.fentry.available {
                return Err(format!("fentry unavailable: {}", env.fentry.why));
            }
            match f.btf_func {
                Some(true) => Ok(format!("kernel BTF has function {name}")),
                Some(false) => Err(format!(
                    "no function {name} in kernel BTF (renamed, or inlined on this kernel)"
                )),
                None => Err("kernel BTF could not be read".into()),
            }
        }
        AttachMode::Kprobe => {
            if !env.kprobes.available {
                return Err(format!("kprobes unavailable: {}", env.kprobes.why));
            }
            match f.kallsyms {
                Some(true) => Ok(format!("{name} is in /proc/kallsyms")),
                Some(false) => Err(format!(
                    "{name} is not in /proc/kallsyms (renamed, or inlined on this kernel)"
                )),
                None => Err("/proc/kallsyms could not be read".into()),
            }
        }
    }
}

/// The first of the hook's modes this kernel allows, with the reasons for the ones before it.
pub fn resolve(hook: &Hook, env: &Env, f: &HookFacts) -> HookVerdict {
    let mut rejected = Vec::new();
    let mut chosen = None;
    for &m in hook.modes {
        match try_mode(m, hook, env, f) {
            Ok(why) => {
                chosen = Some((m, why));
                break;
            }
            Err(why) => rejected.push((m, why)),
        }
    }
    let (fields_found, fields_missing, format_error) = match &f.format {
        Ok(fmt) => {
            let (found, missing): (Vec<&str>, Vec<&str>) =
                hook.fields.iter().partition(|x| fmt.field(x).is_ok());
            (
                found.into_iter().map(String::from).collect(),
                missing.into_iter().map(String::from).collect(),
                None,
            )
        }
        Err(e) => (Vec::new(), Vec::new(), Some(e.clone())),
    };
    let layout = match &f.format {
        Ok(fmt) => hook
            .fields
            .iter()
            .filter_map(|x| fmt.field(x).ok())
            .map(|x| (x.name.clone(), x.offset, x.size))
            .collect(),
        Err(_) => Vec::new(),
    };
    let (mode, why) = match chosen {
        Some((m, why)) => (Some(m), why),
        None if hook.modes.is_empty() => (None, "the hook declares no attach mode".into()),
        None => (None, "no attach mode works on this kernel".into()),
    };
    HookVerdict {
        event: hook.event.to_string(),
        optional: hook.optional,
        mode,
        why,
        rejected,
        fields_found,
        fields_missing,
        layout,
        format_error,
    }
}

/// Whether a tool can run: every required hook attaches, and when all are optional, at least one.
pub fn tool_verdict(hooks: &[HookVerdict]) -> (bool, String) {
    let failed_required: Vec<&HookVerdict> = hooks
        .iter()
        .filter(|h| !h.optional && h.mode.is_none())
        .collect();
    let usable = hooks.iter().filter(|h| h.mode.is_some()).count();
    let skipped: Vec<&str> = hooks
        .iter()
        .filter(|h| h.optional && h.mode.is_none())
        .map(|h| h.event.as_str())
        .collect();
    if let Some(h) = failed_required.first() {
        let last = h.rejected.last().map(|(_, w)| w.as_str()).unwrap_or(&h.why);
        return (
            false,
            format!(
                "required hook {} cannot attach ({last}){}",
                h.event,
                if failed_required.len() > 1 {
                    format!(", and {} more", failed_required.len() - 1)
                } else {
                    String::new()
                }
            ),
        );
    }
    if usable == 0 {
        return (
            false,
            format!("none of its {} optional hooks can attach", hooks.len()),
        );
    }
    let mut why = format!("{usable} of {} hooks attach", hooks.len());
    if !skipped.is_empty() {
        why.push_str(&format!("; skipped (optional): {}", skipped.join(", ")));
    }
    (true, why)
}

/// The bracketed choice of a sysfs selector such as `always [madvise] never`.
pub fn selected(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_string())
}

/// NUMA node ids from the entry names of /sys/devices/system/node.
pub fn node_ids<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
    let mut v: Vec<u32> = names
        .into_iter()
        .filter_map(|n| n.strip_prefix("node")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// cgroup layout from mountinfo: `v2` (unified at /sys/fs/cgroup), `hybrid` (v1 controllers
/// and a v2 tree), `v1`, or `none`; with a detail line.
pub fn cgroup_mode(mountinfo: &str) -> (&'static str, String) {
    let mut v1 = Vec::new();
    let mut v2 = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = pre.split_whitespace().nth(4).unwrap_or("").to_string();
        match post.split_whitespace().next() {
            Some("cgroup2") => v2.push(mount_point),
            Some("cgroup") => v1.push(mount_point),
            _ => {}
        }
    }
    match (v1.is_empty(), v2.is_empty()) {
        (true, false) => ("v2", format!("unified hierarchy at {}", v2.join(", "))),
        (false, false) => (
            "hybrid",
            format!(
                "v1 controllers ({} mounts, e.g. {}) and a v2 tree at {}",
                v1.len(),
                v1[0],
                v2.join(", ")
            ),
        ),
        (false, true) => (
            "v1",
            format!("v1 controllers only ({} mounts, e.g. {})", v1.len(), v1[0]),
        ),
        (true, true) => ("none", "no cgroup filesystem mounted".to_string()),
    }
}

/// Everything doctor found about the node.
struct System {
    kernel: String,
    root: bool,
    /// Capabilities the tools need that this process lacks (empty as root).
    missing_caps: Vec<proc::Cap>,
    /// Where BTF is read from, and why it is unusable if it is.
    btf_path: String,
    btf_error: Option<String>,
    env: Env,
    tracefs_mounted_by_doctor: bool,
    cgroup: (&'static str, String),
    numa: Vec<u32>,
    thp: (Option<String>, Option<String>),
    lockdown: Result<String, String>,
}

fn read_trim(p: &str) -> Option<String> {
    crate::host::read_text_capped(Path::new(p), SMALL_FILE)
        .ok()
        .map(|s| s.trim().to_string())
}

fn gather_system() -> (System, Option<Tracefs>) {
    let (tracefs, by_us) = match Tracefs::find() {
        Some(p) => (Ok(Tracefs::at(p)), false),
        None => match Tracefs::open() {
            Ok(t) => (Ok(t), true),
            Err(e) => (Err(e.to_string()), false),
        },
    };
    let numa = fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            let names: Vec<String> = d
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            node_ids(names.iter().map(String::as_str))
        })
        .unwrap_or_default();
    let lockdown = match crate::host::read_text_capped(
        Path::new("/sys/kernel/security/lockdown"),
        SMALL_FILE,
    ) {
        Ok(t) => selected(&t).ok_or_else(|| format!("unexpected content {:?}", t.trim())),
        Err(e) => Err(format!(
            "/sys/kernel/security/lockdown unreadable ({e}): securityfs not mounted or no lockdown LSM"
        )),
    };
    let btf_error = if features::btf_present() {
        crate::kernel::btf::vmlinux().err().map(|e| e.to_string())
    } else {
        Some(format!(
            "{} is missing (CONFIG_DEBUG_INFO_BTF, or point TRACEKIT_BTF at a BTF file for this kernel)",
            crate::kernel::btf::vmlinux_path().display()
        ))
    };
    let sys = System {
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
        // SAFETY: plain syscall.
        root: unsafe { libc::geteuid() } == 0,
        missing_caps: proc::missing_caps(proc::effective_caps(), proc::TOOL_CAPS),
        btf_path: crate::kernel::btf::vmlinux_path().display().to_string(),
        env: Env {
            btf: btf_error.is_none(),
            raw_tp: features::raw_tp_probe().clone(),
            fentry: features::fentry_probe().clone(),
            kprobes: features::kprobes_probe().clone(),
            tracefs: tracefs
                .as_ref()
                .map(|t| t.root().display().to_string())
                .map_err(Clone::clone),
        },
        tracefs_mounted_by_doctor: by_us,
        cgroup: cgroup_mode(
            &crate::host::read_text_capped(
                Path::new("/proc/self/mountinfo"),
                crate::host::LARGE_FILE,
            )
            .unwrap_or_default(),
        ),
        numa,
        thp: (
            read_trim("/sys/kernel/mm/transparent_hugepage/enabled").and_then(|t| selected(&t)),
            read_trim("/sys/kernel/mm/transparent_hugepage/defrag").and_then(|t| selected(&t)),
        ),
        lockdown,
        btf_error,
    };
    (sys, tracefs.ok())
}

/// Kernel symbol sources, shared by every hook: the BTF the tools use (`TRACEKIT_BTF` when
/// set; read once, also when it is unusable), and kallsyms when a hook needs it.
struct Sources {
    btf: Option<&'static Btf>,
    kallsyms: Option<Option<HashSet<String>>>,
}

impl Sources {
    fn btf(&mut self) -> Option<&'static Btf> {
        self.btf
    }

    fn kallsyms(&mut self) -> Option<&HashSet<String>> {
        self.kallsyms
            .get_or_insert_with(|| {
                let text = crate::host::read_text_capped(
                    Path::new("/proc/kallsyms"),
                    crate::host::LARGE_FILE,
                )
                .ok()?;
                // `ffffffff81000000 T _stext [module]`
                Some(
                    text.lines()
                        .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
                        .collect(),
                )
            })
            .as_ref()
    }
}

fn facts(hook: &Hook, tracefs: Option<&Tracefs>, src: &mut Sources) -> HookFacts {
    let (cat, name) = split_event(hook.event);
    let format = match (cat, tracefs) {
        (Some(c), Some(t)) => t.format(c, name).map_err(|e| e.to_string()),
        (Some(_), None) => Err("tracefs unavailable".to_string()),
        (None, _) => Err(format!("{name} is a function, not a tracepoint")),
    };
    let wants = |m: AttachMode| hook.modes.contains(&m);
    let raw = hook.raw.unwrap_or(name);
    let btf_tp = if wants(AttachMode::TpBtf) || wants(AttachMode::RawTp) {
        src.btf()
            .map(|b| b.find_typedef(&format!("btf_trace_{raw}")).is_some())
    } else {
        None
    };
    let btf_func = if wants(AttachMode::Fentry) {
        src.btf().map(|b| b.has_func(name))
    } else {
        None
    };
    let kallsyms = if wants(AttachMode::Kprobe) {
        src.kallsyms().map(|k| k.contains(name))
    } else {
        None
    };
    HookFacts {
        format,
        btf_tp,
        btf_func,
        kallsyms,
    }
}

fn probe_json(p: &Probe) -> Value {
    json!({"available": p.available, "why": p.why})
}

fn yes_no(p: &Probe) -> String {
    format!("{}: {}", if p.available { "yes" } else { "no" }, p.why)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // The report goes where a tool's would, checked before any probing.
    let mut sink = Sink::open(args.output.as_deref(), false)?;
    let (sys, tracefs) = gather_system();
    let mut src = Sources {
        btf: if sys.env.btf {
            crate::kernel::btf::vmlinux().ok()
        } else {
            None
        },
        kallsyms: None,
    };
    let mut out: Vec<Value> = Vec::new();
    let mut text: Vec<String> = Vec::new();

    let tracefs_text = match &sys.env.tracefs {
        Ok(p) if sys.tracefs_mounted_by_doctor => {
            format!("was not mounted; doctor mounted it at {p}")
        }
        Ok(p) => format!("mounted at {p}"),
        Err(e) => format!("unavailable: {e}"),
    };
    let numa_text = if sys.numa.is_empty() {
        "1 (no /sys/devices/system/node: kernel without NUMA)".to_string()
    } else {
        let ids: Vec<String> = sys.numa.iter().map(|n| format!("node{n}")).collect();
        format!("{} ({})", sys.numa.len(), ids.join(", "))
    };
    out.push(json!({
        "tool": NAME, "type": "system",
        "kernel": sys.kernel,
        "root": sys.root,
        "missing_capabilities": sys.missing_caps.iter().map(|c| c.name()).collect::<Vec<_>>(),
        "btf": sys.env.btf,
        "btf_path": sys.btf_path,
        "btf_error": sys.btf_error,
        "tracefs": {
            "available": sys.env.tracefs.is_ok(),
            "path": sys.env.tracefs.as_ref().ok(),
            "mounted_by_doctor": sys.tracefs_mounted_by_doctor,
            "error": sys.env.tracefs.as_ref().err(),
        },
        "raw_tp": probe_json(&sys.env.raw_tp),
        "fentry": probe_json(&sys.env.fentry),
        "kprobes": probe_json(&sys.env.kprobes),
        "cgroup": sys.cgroup.0,
        "cgroup_detail": sys.cgroup.1,
        "numa_nodes": sys.numa.len().max(1),
        "numa_node_ids": sys.numa,
        "thp": {"enabled": sys.thp.0, "defrag": sys.thp.1},
        "lockdown": sys.lockdown.as_ref().ok(),
        "lockdown_error": sys.lockdown.as_ref().err(),
    }));
    let unprivileged = !sys.missing_caps.is_empty();
    text.push(format!(
        "tracekit doctor: Linux {}{}",
        sys.kernel,
        if sys.root {
            ", running as root".to_string()
        } else if unprivileged {
            format!(
                ", NOT PERMITTED: lacking {}, no tool can run and the answers below are incomplete (probes cannot load, tracefs may be unreadable)",
                proc::cap_list(&sys.missing_caps)
            )
        } else {
            ", not root but with CAP_BPF and CAP_PERFMON".to_string()
        }
    ));
    let rows = [
        (
            "BTF",
            match &sys.btf_error {
                None => format!("yes ({})", sys.btf_path),
                Some(e) => format!("no: {e}; tp_btf and fentry unavailable"),
            },
        ),
        ("tracefs", tracefs_text),
        ("raw_tp", yes_no(&sys.env.raw_tp)),
        ("fentry", yes_no(&sys.env.fentry)),
        ("kprobes", yes_no(&sys.env.kprobes)),
        ("cgroup", format!("{}: {}", sys.cgroup.0, sys.cgroup.1)),
        ("NUMA nodes", numa_text),
        (
            "THP",
            format!(
                "enabled={} defrag={}",
                sys.thp.0.as_deref().unwrap_or("absent"),
                sys.thp.1.as_deref().unwrap_or("absent")
            ),
        ),
        (
            "lockdown",
            match &sys.lockdown {
                Ok(l) => l.clone(),
                Err(e) => format!("unknown: {e}"),
            },
        ),
    ];
    for (k, v) in rows {
        text.push(format!("  {k:<11} {v}"));
    }

    let mut cannot = Vec::new();
    let mut ntools = 0;
    for (tool, hooks, requires_btf) in tools::all_hooks() {
        if tool == NAME {
            continue;
        }
        ntools += 1;
        let verdicts: Vec<HookVerdict> = hooks
            .iter()
            .map(|h| resolve(h, &sys.env, &facts(h, tracefs.as_ref(), &mut src)))
            .collect();
        let (ok, why) = if unprivileged {
            (
                false,
                format!(
                    "not permitted: tracekit lacks {}",
                    proc::cap_list(&sys.missing_caps)
                ),
            )
        } else if requires_btf && !sys.env.btf {
            (
                false,
                format!(
                    "needs the kernel's BTF for task_struct offsets whatever the attach mode: {}",
                    sys.btf_error.as_deref().unwrap_or("unusable")
                ),
            )
        } else {
            tool_verdict(&verdicts)
        };
        text.push(String::new());
        text.push(format!(
            "{tool}: {} ({why})",
            if ok { "can run" } else { "CANNOT run" }
        ));
        for v in &verdicts {
            out.push(json!({
                "tool": NAME, "type": "hook",
                "for": tool,
                "event": v.event,
                "optional": v.optional,
                "mode": v.mode.map(AttachMode::as_str),
                "why": v.why,
                "rejected": v.rejected.iter().map(|(m, w)| json!({"mode": m.as_str(), "why": w})).collect::<Vec<_>>(),
                "fields_found": v.fields_found,
                "fields_missing": v.fields_missing,
                "layout": v.layout.iter().map(|(n, o, sz)| (n.clone(), json!({"offset": o, "size": sz}))).collect::<serde_json::Map<_, _>>(),
                "format_error": v.format_error,
            }));
            let mode = v.mode.map(AttachMode::as_str).unwrap_or("NONE");
            let mut line = format!("  {:<40} {mode:<10} {}", v.event, v.why);
            if !v.fields_missing.is_empty() {
                line.push_str(&format!(
                    "; fields missing: {}",
                    v.fields_missing.join(", ")
                ));
            }
            if v.mode.is_none() && v.optional {
                line.push_str(" (optional: the tool skips it)");
            }
            text.push(line);
            for (m, w) in &v.rejected {
                text.push(format!("  {:<40}   not {}: {w}", "", m.as_str()));
            }
        }
        out.push(json!({
            "tool": NAME, "type": "tool",
            "name": tool,
            "can_run": ok,
            "why": why,
            "hooks": verdicts.len(),
            "usable": verdicts.iter().filter(|v| v.mode.is_some()).count(),
        }));
        if !ok {
            cannot.push(format!("{tool} ({why})"));
        }
    }
    out.push(json!({
        "tool": NAME, "type": "summary",
        "tools": ntools,
        "runnable": ntools - cannot.len(),
    }));
    text.push(String::new());
    if unprivileged {
        text.push(format!(
            "Not permitted: run doctor as root (or with {}) to see what this kernel allows.",
            proc::cap_list(proc::TOOL_CAPS)
        ));
    } else {
        text.push(format!(
            "{} of {ntools} tool(s) can run on this kernel.",
            ntools - cannot.len()
        ));
    }
    let rendered = if args.json {
        out.iter().map(|v| format!("{v}\n")).collect::<String>()
    } else {
        format!("{}\n", text.join("\n"))
    };
    // A reader that went away (`doctor | head -1`) ends nothing early: the verdict still
    // decides the exit code.
    match sink.write(&rendered) {
        Err(e) if !e.is_broken_pipe() => return Err(e.into()),
        _ => sink.finish()?,
    }
    if unprivileged {
        return Err(UserError::Permission(format!(
            "doctor cannot tell what this kernel allows without {} (missing: {}): run it as root",
            proc::cap_list(proc::TOOL_CAPS),
            proc::cap_list(&sys.missing_caps)
        ))
        .into());
    }
    if !cannot.is_empty() {
        return Err(UserError::ToolsUnavailable(format!(
            "{} of {ntools} tool(s) cannot run on this kernel: {}",
            cannot.len(),
            cannot.join("; ")
        ))
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::tracefs::parse_format;
    use std::path::Path;

    fn probe(ok: bool) -> Probe {
        Probe {
            available: ok,
            why: if ok { "probe ok" } else { "probe says no" }.into(),
        }
    }

    fn env(btf: bool, fentry: bool, kprobes: bool) -> Env {
        Env {
            btf,
            raw_tp: probe(true),
            fentry: probe(fentry),
            kprobes: probe(kprobes),
            tracefs: Ok("/sys/kernel/tracing".into()),
        }
    }

    fn fixture(name: &str, origin: &str) -> EventFormat {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name);
        parse_format(&fs::read_to_string(p).unwrap(), origin).unwrap()
    }

    const SWITCH: Hook = Hook {
        event: "sched:sched_switch",
        raw: None,
        fields: &["prev_pid", "next_pid", "prev_state"],
        modes: &[AttachMode::TpBtf, AttachMode::RawTp, AttachMode::Tracepoint],
        optional: false,
    };

    fn switch_facts(btf_tp: Option<bool>) -> HookFacts {
        HookFacts {
            format: Ok(fixture("sched_switch.x86_64", "sched/sched_switch/format")),
            btf_tp,
            btf_func: None,
            kallsyms: None,
        }
    }

    #[test]
    fn cheapest_mode_wins_and_fallbacks_are_explained() {
        let v = resolve(&SWITCH, &env(true, false, false), &switch_facts(Some(true)));
        assert_eq!(v.mode, Some(AttachMode::TpBtf));
        assert!(v.rejected.is_empty());
        assert_eq!(v.fields_found.len(), 3);
        assert_eq!(v.layout[0], ("prev_pid".to_string(), 24, 4));
        // No BTF: raw_tp, with the reason tp_btf was not used.
        let v = resolve(&SWITCH, &env(false, false, false), &switch_facts(None));
        assert_eq!(v.mode, Some(AttachMode::RawTp));
        assert_eq!(v.rejected[0].0, AttachMode::TpBtf);
        assert!(
            v.rejected[0].1.contains("no usable kernel BTF"),
            "{:?}",
            v.rejected
        );
        // raw tracepoints refused: the classic tracepoint, fields from the format.
        let mut e = env(false, false, false);
        e.raw_tp = probe(false);
        let v = resolve(&SWITCH, &e, &switch_facts(None));
        assert_eq!(v.mode, Some(AttachMode::Tracepoint));
        assert_eq!(v.rejected.len(), 2);
        assert!(v.why.contains("prev_pid"));
    }

    #[test]
    fn missing_field_rejects_the_classic_tracepoint() {
        let hook = Hook {
            event: "skb:kfree_skb",
            raw: None,
            fields: &["skbaddr", "reason"],
            modes: &[AttachMode::Tracepoint],
            optional: false,
        };
        let f = HookFacts {
            format: Ok(fixture("kfree_skb.no_reason", "skb/kfree_skb/format")),
            btf_tp: None,
            btf_func: None,
            kallsyms: None,
        };
        let v = resolve(&hook, &env(true, true, true), &f);
        assert_eq!(v.mode, None);
        assert_eq!(v.fields_found, vec!["skbaddr"]);
        assert_eq!(v.fields_missing, vec!["reason"]);
        assert!(v.rejected[0].1.contains("reason"));
        let (ok, why) = tool_verdict(&[v]);
        assert!(!ok);
        assert!(why.contains("skb:kfree_skb"), "{why}");
    }

    #[test]
    fn function_hooks_need_the_feature_and_the_symbol() {
        let hook = Hook {
            event: "migrate_misplaced_folio",
            raw: None,
            fields: &[],
            modes: &[AttachMode::Fentry, AttachMode::Kprobe],
            optional: true,
        };
        let f = |func: bool, sym: bool| HookFacts {
            format: Err("a function".into()),
            btf_tp: None,
            btf_func: Some(func),
            kallsyms: Some(sym),
        };
        // This host: neither fentry nor kprobes.
        let v = resolve(&hook, &env(true, false, false), &f(true, true));
        assert_eq!(v.mode, None);
        assert!(v.rejected[0].1.contains("probe says no"));
        assert!(v.rejected[1].1.starts_with("kprobes unavailable"));
        // An older kernel with the old name: fentry and kprobe both find nothing.
        let v = resolve(&hook, &env(true, true, true), &f(false, false));
        assert_eq!(v.mode, None);
        assert!(v.rejected[0].1.contains("renamed"));
        // kprobes only.
        let v = resolve(&hook, &env(true, false, true), &f(true, true));
        assert_eq!(v.mode, Some(AttachMode::Kprobe));
        let v = resolve(&hook, &env(true, true, true), &f(true, true));
        assert_eq!(v.mode, Some(AttachMode::Fentry));
    }

    #[test]
    fn syscall_events_are_not_raw_tracepoints() {
        let hook = Hook {
            event: "syscalls:sys_enter_fsync",
            raw: None,
            fields: &["__syscall_nr"],
            modes: &[AttachMode::RawTp, AttachMode::Tracepoint],
            optional: true,
        };
        let f = HookFacts {
            format: Ok(fixture(
                "sys_enter_fsync.i386",
                "syscalls/sys_enter_fsync/format",
            )),
            btf_tp: Some(false),
            btf_func: None,
            kallsyms: None,
        };
        let v = resolve(&hook, &env(true, true, true), &f);
        assert_eq!(v.mode, Some(AttachMode::Tracepoint));
        assert!(v.rejected[0].1.contains("not raw tracepoints"));
    }

    #[test]
    fn syscall_events_reach_tp_btf_through_sys_enter() {
        let hook = Hook {
            event: "syscalls:sys_enter_fsync",
            raw: Some("sys_enter"),
            fields: &["__syscall_nr"],
            modes: &[AttachMode::TpBtf, AttachMode::Tracepoint],
            optional: true,
        };
        let f = |btf_tp| HookFacts {
            format: Ok(fixture(
                "sys_enter_fsync.x86_64",
                "syscalls/sys_enter_fsync/format",
            )),
            btf_tp,
            btf_func: None,
            kallsyms: None,
        };
        let v = resolve(&hook, &env(true, false, false), &f(Some(true)));
        assert_eq!(v.mode, Some(AttachMode::TpBtf));
        assert!(v.why.contains("btf_trace_sys_enter"), "{}", v.why);
        // Without BTF: the classic per-syscall event, its field found.
        let v = resolve(&hook, &env(false, false, false), &f(None));
        assert_eq!(v.mode, Some(AttachMode::Tracepoint));
        assert_eq!(v.fields_found, vec!["__syscall_nr"]);
    }

    #[test]
    fn tool_verdicts() {
        let ok = |opt: bool| HookVerdict {
            event: "a:b".into(),
            optional: opt,
            mode: Some(AttachMode::Tracepoint),
            why: String::new(),
            rejected: vec![],
            fields_found: vec![],
            fields_missing: vec![],
            layout: vec![],
            format_error: None,
        };
        let bad = |opt: bool| HookVerdict {
            mode: None,
            event: "c:d".into(),
            rejected: vec![(AttachMode::Tracepoint, "no such event".into())],
            ..ok(opt)
        };
        assert!(tool_verdict(&[ok(false), bad(true)]).0);
        assert!(tool_verdict(&[ok(false), bad(true)])
            .1
            .contains("skipped (optional): c:d"));
        let (r, why) = tool_verdict(&[ok(true), bad(false)]);
        assert!(!r);
        assert!(
            why.contains("c:d") && why.contains("no such event"),
            "{why}"
        );
        assert!(!tool_verdict(&[bad(true), bad(true)]).0);
    }

    #[test]
    fn sysfs_selectors() {
        assert_eq!(
            selected("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            selected("[none] integrity confidentiality").as_deref(),
            Some("none")
        );
        assert_eq!(selected("always madvise never"), None);
        assert_eq!(
            node_ids(["possible", "node1", "online", "node0", "has_cpu", "nodeX"]),
            vec![0, 1]
        );
    }

    #[test]
    fn cgroup_layouts() {
        let v1 = "30 24 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let v2 = "31 24 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup_mode(&format!("{v1}{v2}")).0, "hybrid");
        assert_eq!(cgroup_mode(v1).0, "v1");
        let pure = "31 24 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let (m, d) = cgroup_mode(pure);
        assert_eq!(m, "v2");
        assert!(d.contains("/sys/fs/cgroup"));
        assert_eq!(
            cgroup_mode("22 1 0:21 / /sys rw - sysfs sysfs rw\n").0,
            "none"
        );
    }
}
