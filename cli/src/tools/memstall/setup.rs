//! What memstall's programs need to know about this kernel before they load: the attach plan
//! (with BTF-tracepoint groups whose arguments do not look as expected moved to classic
//! tracepoints), tracepoint field offsets and value names, and the BTF offsets with which the
//! kernel reads a task's memory cgroup and start time.

use std::collections::BTreeMap;

use probes_common::memstall::NOUTCOMES;

use crate::{
    error::{Error, Result},
    host::cgroup::Layout,
    kernel::{
        btf::{self, Btf},
        hooks::{AttachMode, Choice, Hook},
        loader::{self, LoadSpec},
        tracefs::Tracefs,
    },
    tools::OpenCtx,
};

use super::{GROUPS, HOOKS};

/// The plan, and everything it implies for the programs' globals.
pub struct Setup {
    /// The hooks as planned (a group may have lost its BTF mode, see [`plan`]).
    pub hooks: Vec<Hook>,
    pub plan: Vec<Choice>,
    pub spec: LoadSpec,
    /// Names of `mm_compaction_end.status` values.
    pub outcome_names: BTreeMap<usize, String>,
    /// The kernel reads the memory cgroup itself; else (no BTF offsets on a v1 host) it is read
    /// from /proc while the process lives.
    pub cgroup_in_kernel: bool,
    /// This kernel has `MADV_COLLAPSE` (6.1+).
    pub madv_collapse: bool,
}

/// The mode each group attaches in (`None`: skipped).
pub fn group_modes(hooks: &[Hook], plan: &[Choice]) -> BTreeMap<&'static str, Option<AttachMode>> {
    let mut m = BTreeMap::new();
    for (h, c) in hooks.iter().zip(plan) {
        let e = m.entry(h.group).or_insert(None);
        if e.is_none() {
            *e = c.mode.map(|x| x.0);
        }
    }
    m
}

/// Plans every hook, checks the BTF-tracepoint groups against the kernel's prototypes (moving a
/// group to classic tracepoints when its arguments are not as expected), and computes the
/// globals of the chosen modes.
pub fn plan(ctx: &OpenCtx) -> Result<Setup> {
    let mut hooks: Vec<Hook> = HOOKS.to_vec();
    loop {
        let plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
        let modes = group_modes(&hooks, &plan);
        let mut g = Globals::default();
        let mut demoted = None;
        for (group, mode) in &modes {
            match mode {
                Some(AttachMode::TpBtf) => {
                    if let Err(why) = g.btf_group(group) {
                        tracing::info!("memstall {group}: BTF tracepoints not usable ({why})");
                        demoted = Some(*group);
                        break;
                    }
                }
                Some(AttachMode::Tracepoint) => {
                    let t = ctx.env.tracefs().as_ref().map_err(|e| {
                        Error::KernelFeature(format!("memstall {group}: tracefs: {e}"))
                    })?;
                    g.classic_group(t, group)?;
                }
                _ => {}
            }
        }
        if let Some(group) = demoted {
            for h in hooks.iter_mut().filter(|h| h.group == group) {
                h.programs = &h.programs[1..];
            }
            continue;
        }
        if !modes.iter().any(|(g, m)| GROUPS.contains(g) && m.is_some()) {
            return Err(Error::KernelFeature(
                "no compaction, vmscan or huge_memory tracepoints on this kernel (CONFIG_COMPACTION, CONFIG_TRANSPARENT_HUGEPAGE and tracepoints missing)".into(),
            ));
        }
        let layout = Layout::detect();
        let cgroup_in_kernel = g.cgroups(&layout);
        g.tasks();
        let madv_collapse = has_madv_collapse();
        let outcome_names = std::mem::take(&mut g.outcome_names);
        let spec = g.spec(ctx).tp_btf_planned(&hooks, &plan);
        return Ok(Setup {
            hooks,
            plan,
            spec,
            outcome_names,
            cgroup_in_kernel,
            madv_collapse,
        });
    }
}

/// Whether this kernel has `MADV_COLLAPSE` (Linux 6.1, commit 7d8faaf15545): its
/// `madvise_collapse` function in BTF, else in kallsyms, else the release number.
fn has_madv_collapse() -> bool {
    if let Ok(b) = btf::vmlinux() {
        return b.find_func("madvise_collapse").is_some();
    }
    if let Ok(f) = crate::host::kallsyms::functions() {
        return f.contains("madvise_collapse");
    }
    let rel = crate::host::read_trim(&crate::host::proc_path("sys/kernel/osrelease"));
    release_at_least(rel.as_deref().unwrap_or(""), 6, 1)
}

/// `6.1.0-57-amd64` >= 6.1.
pub fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut it = release.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    match (it.next().flatten(), it.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// memstall's default cap on keys (processes x kinds, both generations): its maps are
/// preallocated (about 2.7 KiB a key) so that no key is allocated inside a traced stall.
pub const DEFAULT_KEYS: u32 = 2048;

/// The event that ends a stall of group `reclaim` (direct) or `memcg_reclaim`.
fn reclaim_end(group: &str) -> &'static str {
    if group == "reclaim" {
        "mm_vmscan_direct_reclaim_end"
    } else {
        "mm_vmscan_memcg_reclaim_end"
    }
}

fn key_cap(scope: &crate::engine::Scope) -> u32 {
    scope.max_keys.unwrap_or(DEFAULT_KEYS)
}

/// The programs' globals, as far as known.
#[derive(Default)]
struct Globals {
    vals: BTreeMap<&'static str, u32>,
    flags: BTreeMap<&'static str, u8>,
    fault_fallback: Option<u64>,
    outcome_names: BTreeMap<usize, String>,
    reclaimed: Option<u32>,
}

impl Globals {
    fn set(&mut self, k: &'static str, v: u32) {
        self.vals.insert(k, v);
    }

    fn spec(self, ctx: &OpenCtx) -> LoadSpec {
        let scope = &ctx.scope;
        let mut s = LoadSpec::new()
            .global("MS_NR_MADVISE", &(libc::SYS_madvise as u64))
            .global("MS_PER_THREAD", &u8::from(scope.threads))
            .max_entries("MS_HIST", key_cap(scope))
            .max_entries("MS_LIFE", key_cap(scope))
            .max_entries("MS_START", scope.inflight_cap())
            .max_entries("MS_ATTEMPT", scope.inflight_cap());
        if let Some(f) = self.fault_fallback {
            s = s.global("MS_FAULT_FALLBACK", &f);
        }
        for (k, v) in &self.vals {
            s = s.global(k, v);
        }
        for (k, v) in &self.flags {
            s = s.global(k, v);
        }
        s
    }

    /// Checks a group can attach as BTF tracepoints here and records what its programs need.
    fn btf_group(&mut self, group: &str) -> Result<(), String> {
        let btf = btf::vmlinux().map_err(|e| e.to_string())?;
        let proto = |tp: &str| {
            btf.proto_param_sizes(&format!("btf_trace_{tp}"))
                .ok_or_else(|| format!("kernel BTF has no btf_trace_{tp}"))
        };
        // Positions in the tracepoint's arguments (the BTF prototype's first parameter is the
        // probe's data pointer, hence the - 2 for the last one).
        let last_int = |tp: &str| -> Result<u32, String> {
            let p = proto(tp)?;
            match p.last() {
                Some(4) if p.len() >= 2 && p.len() <= 8 => Ok(p.len() as u32 - 2),
                _ => Err(format!(
                    "btf_trace_{tp}: no int status as the last argument ({p:?})"
                )),
            }
        };
        match group {
            "compaction" => {
                self.set("MS_COMPACT_STATUS_ARG", last_int("mm_compaction_end")?);
                for (name, v) in btf.enum_values("COMPACT_") {
                    if v >= 0 {
                        let slot = (v as usize).min(NOUTCOMES - 1);
                        let short = name.trim_start_matches("COMPACT_").to_ascii_lowercase();
                        self.outcome_names.entry(slot).or_insert(short);
                    }
                }
            }
            "reclaim" | "memcg_reclaim" => {
                let tp = reclaim_end(group);
                let p = proto(tp)?;
                if p != [8, 8] {
                    return Err(format!(
                        "btf_trace_{tp}: expected (nr_reclaimed), found {p:?}"
                    ));
                }
            }
            "thp_collapse" => {
                self.set("MS_COLLAPSE_STATUS_ARG", last_int("mm_collapse_huge_page")?);
                let v = btf
                    .enum_value("SCAN_SUCCEED")
                    .ok_or("kernel BTF has no SCAN_SUCCEED")?;
                self.set("MS_SCAN_SUCCEED", v as u32);
            }
            "madvise_collapse_time" => {
                for tp in ["sys_enter", "sys_exit"] {
                    let p = proto(tp)?;
                    if p.len() != 3 || p[2] != 8 {
                        return Err(format!("unexpected btf_trace_{tp} prototype {p:?}"));
                    }
                }
                let reg = |m: &str| match btf.member("pt_regs", m) {
                    Ok(x) if x.size == 8 => Ok(x.offset),
                    Ok(_) => Err(format!("pt_regs.{m} is not 8 bytes")),
                    Err(e) => Err(e.to_string()),
                };
                // x86_64: the third syscall argument is in dx, the number stays in orig_ax.
                self.set("MS_REGS_ARG2_OFF", reg("dx")?);
                self.set("MS_REGS_NR_OFF", reg("orig_ax")?);
            }
            "oom" => {
                // 5.19+: (struct task_struct *task, uid_t uid); before: (int pid).
                let p = proto("mark_victim")?;
                let task = match p.get(1) {
                    Some(8) => 1,
                    Some(4) => 0,
                    _ => return Err(format!("unexpected btf_trace_mark_victim {p:?}")),
                };
                self.flags.insert("MS_OOM_TASK_ARG", task);
            }
            _ => {}
        }
        Ok(())
    }

    /// Records what a classic-tracepoint group needs from the format files.
    fn classic_group(&mut self, t: &Tracefs, group: &str) -> Result<()> {
        match group {
            "compaction" => {
                let f = t.format("compaction", "mm_compaction_end")?;
                self.set("MS_COMPACT_STATUS_OFF", f.offset_of("status", &[4])?);
                for (v, name) in f.symbols("status") {
                    let slot = (v.max(0) as usize).min(NOUTCOMES - 1);
                    self.outcome_names.entry(slot).or_insert(name);
                }
            }
            "reclaim" | "memcg_reclaim" => {
                // Both end programs read nr_reclaimed at one offset.
                let event = reclaim_end(group);
                let off = t.format("vmscan", event)?.offset_of("nr_reclaimed", &[8])?;
                match self.reclaimed {
                    Some(prev) if prev != off => {
                        return Err(Error::KernelFeature(format!(
                            "vmscan: nr_reclaimed at offset {off} in {event} but {prev} in the other reclaim end event; this layout is not supported"
                        )))
                    }
                    _ => {
                        self.reclaimed = Some(off);
                        self.set("MS_RECLAIMED_OFF", off);
                    }
                }
            }
            "madvise_collapse_time" => {
                let f = t.format("syscalls", "sys_enter_madvise")?;
                self.set("MS_MADV_BEHAVIOR_OFF", f.offset_of("behavior", &[8])?);
                let x = t.format("syscalls", "sys_exit_madvise")?;
                self.set("MS_MADV_RET_OFF", x.offset_of("ret", &[8])?);
            }
            "thp_collapse" => {
                let f = t.format("huge_memory", "mm_collapse_huge_page")?;
                self.set("MS_COLLAPSE_STATUS_OFF", f.offset_of("status", &[4])?);
                let v = f
                    .symbols("status")
                    .iter()
                    .find(|(_, n)| n == "succeeded")
                    .map(|(v, _)| *v as u32)
                    .ok_or_else(|| {
                        Error::KernelFeature(
                            "huge_memory:mm_collapse_huge_page: no \"succeeded\" value in the status names of its format".into(),
                        )
                    })?;
                self.set("MS_SCAN_SUCCEED", v);
            }
            "oom" => {
                let f = t.format("oom", "mark_victim")?;
                self.set("MS_OOM_PID_OFF", f.offset_of("pid", &[4])?);
            }
            _ => {}
        }
        Ok(())
    }

    /// How the kernel reads a task's memory cgroup id: on a v1 host the memory hierarchy's
    /// cgroup through `task->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id` (offsets from
    /// BTF), on v2 the unified cgroup (the helper for the current task, `cgroups->dfl_cgrp` for
    /// an OOM victim). Returns whether the cgroup of every key is read in the kernel.
    fn cgroups(&mut self, layout: &Layout) -> bool {
        let v1 = layout.v1_memory.is_some();
        let offsets = btf::vmlinux().ok().and_then(|b| cgroup_offsets(b, v1));
        match offsets {
            Some(o) => {
                self.flags.insert("MS_CG_CHASE", 1);
                self.flags.insert("MS_CG_PICK_CSS", u8::from(v1));
                for (k, v) in [
                    "MS_OFF_TASK_CGROUPS",
                    "MS_OFF_SET_PICK",
                    "MS_OFF_CSS_CGROUP",
                    "MS_OFF_CGROUP_KN",
                    "MS_OFF_KN_ID",
                    "MS_OFF_KN_PARENT",
                    "MS_OFF_KN_NAME",
                ]
                .into_iter()
                .zip(o)
                {
                    self.set(k, v);
                }
                true
            }
            None => {
                tracing::info!("memstall: no BTF offsets for the cgroup chain");
                self.flags.insert("MS_CG_CHASE", 0);
                !v1
            }
        }
    }

    /// Task offsets for lifetimes and OOM victims (each optional).
    fn tasks(&mut self) {
        let Ok(b) = btf::vmlinux() else { return };
        let off = |m: &str, size: u32| {
            b.member("task_struct", m)
                .ok()
                .filter(|x| x.size == size)
                .map(|x| x.offset)
        };
        if let (Some(l), Some(s)) = (off("group_leader", 8), off("start_time", 8)) {
            self.set("MS_OFF_TASK_LEADER", l);
            self.set("MS_OFF_TASK_START", s);
        }
        if let Some(t) = off("tgid", 4) {
            self.set("MS_OFF_TASK_TGID", t);
        }
        if let Some(c) = off("comm", 16) {
            self.set("MS_OFF_TASK_COMM", c);
        }
        if let Some(v) = b.enum_value("VM_FAULT_FALLBACK") {
            self.fault_fallback = Some(v as u64);
        }
    }
}

/// `[task.cgroups, css_set pick, css.cgroup, cgroup.kn, kernfs_node.id, kernfs_node.parent,
/// kernfs_node.name]`, the pick being `subsys[memory_cgrp_id]` (v1) or `dfl_cgrp` (v2).
fn cgroup_offsets(b: &Btf, v1: bool) -> Option<[u32; 7]> {
    let m = |s: &str, f: &str, size: u32| {
        b.member(s, f)
            .ok()
            .filter(|x| size == 0 || x.size == size)
            .map(|x| x.offset)
    };
    let pick = if v1 {
        let id = b.enum_value("memory_cgrp_id")?;
        m("css_set", "subsys", 0)? + 8 * u32::try_from(id).ok()?
    } else {
        m("css_set", "dfl_cgrp", 8)?
    };
    Some([
        m("task_struct", "cgroups", 8)?,
        pick,
        m("cgroup_subsys_state", "cgroup", 8)?,
        m("cgroup", "kn", 8)?,
        m("kernfs_node", "id", 8)?,
        m("kernfs_node", "parent", 8).or_else(|| m("kernfs_node", "__parent", 8))?,
        m("kernfs_node", "name", 8)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert!(release_at_least("6.1.0-57-amd64", 6, 1));
        assert!(release_at_least("6.18.44-fc", 6, 1));
        assert!(!release_at_least("5.10.0-30-amd64", 6, 1));
        assert!(!release_at_least("6.0.9", 6, 1));
        assert!(!release_at_least("garbage", 6, 1));
    }

    #[test]
    fn cgroup_chain_offsets_from_this_kernel() {
        let Ok(b) = btf::vmlinux() else { return };
        let v1 = cgroup_offsets(b, true).expect("v1 chain");
        let v2 = cgroup_offsets(b, false).expect("v2 chain");
        assert_eq!(v1[0], v2[0]);
        assert_ne!(v1[1], v2[1]);
    }
}
