//! The node as `doctor` shows it: the kernel, tracekit's privileges, BTF, tracefs and the attach
//! features the policy asks about, then the facts that change what the tools find (cgroup
//! layout, which container layouts the processes are in and what counts as the host, NUMA nodes and distances, automatic NUMA balancing, THP, I/O schedulers, conntrack,
//! lockdown). Every fact comes from `host::*` or `kernel::*`; this file only arranges them, as
//! one [`System`] that is both the JSON `system` line and the text header.

use serde::Serialize;

use crate::{
    host::{
        self, cgroup, container,
        disks::{self, QueueFacts},
        mountinfo::{self, Mount},
        net::{self, Conntrack},
        numa::{Node, Topology},
        proc::{self, Cap},
        thp::ThpSettings,
    },
    kernel::{btf, features, features::Probe, hooks::Env, tracefs::Tracefs},
};

/// A feature probe's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProbeFacts {
    pub available: bool,
    pub why: String,
}

impl From<&Probe> for ProbeFacts {
    fn from(p: &Probe) -> ProbeFacts {
        ProbeFacts {
            available: p.available,
            why: p.why.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TracefsFacts {
    pub available: bool,
    pub path: Option<String>,
    /// It was not mounted: doctor mounted it (as a tool would), and the mount stays.
    pub mounted_by_doctor: bool,
    pub error: Option<String>,
}

/// The capabilities tracekit has, and those every tool needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Caps {
    /// Of the capabilities tracekit may use ([`Cap::ALL`]), those in effect.
    pub effective: Vec<&'static str>,
    pub needed: Vec<&'static str>,
    pub missing: Vec<&'static str>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Disk {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    #[serde(flatten)]
    pub queue: QueueFacts,
}

/// What the host layer says about the node (gathered live by [`HostFacts::read`], or built
/// from fixtures).
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    pub kernel: Option<String>,
    pub euid: u32,
    pub capeff: u64,
    pub mounts: Vec<Mount>,
    pub cgroup: cgroup::Layout,
    /// Which container layouts the live processes are in, as the tools will attribute them.
    pub containers: container::Census,
    pub topology: Topology,
    pub settings: Settings,
}

/// Node settings shown as the host layer reads them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Settings {
    /// `kernel.numa_balancing` (absent: a kernel without CONFIG_NUMA_BALANCING).
    pub numa_balancing: Option<String>,
    pub thp: ThpSettings,
    pub disks: Vec<Disk>,
    pub conntrack: Option<Conntrack>,
    /// The lockdown mode, or why it is unknown.
    pub lockdown: Option<String>,
    pub lockdown_error: Option<String>,
}

impl HostFacts {
    pub fn read() -> HostFacts {
        let mountinfo = host::read_text(&host::proc_path("self/mountinfo")).unwrap_or_default();
        let lockdown_path = host::sys_path("kernel/security/lockdown");
        let lockdown = match host::read_text_capped(&lockdown_path, host::SMALL_FILE) {
            Ok(t) => {
                host::selected(&t).ok_or_else(|| format!("{} is empty", lockdown_path.display()))
            }
            Err(e) => Err(format!("{e}: securityfs not mounted, or no lockdown LSM")),
        };
        HostFacts {
            kernel: host::sysctl("kernel.osrelease"),
            // SAFETY: plain syscall.
            euid: unsafe { libc::geteuid() },
            capeff: proc::effective_caps(),
            mounts: mountinfo::parse(&mountinfo),
            cgroup: cgroup::Layout::from_mountinfo(&mountinfo),
            containers: container::Census::read(),
            topology: Topology::read(),
            settings: Settings {
                numa_balancing: host::sysctl("kernel.numa_balancing"),
                thp: ThpSettings::read(),
                disks: disks::whole_disks()
                    .into_iter()
                    .map(|(name, major, minor)| Disk {
                        queue: QueueFacts::read(major, minor),
                        name,
                        major,
                        minor,
                    })
                    .collect(),
                conntrack: net::conntrack(),
                lockdown_error: lockdown.as_ref().err().cloned(),
                lockdown: lockdown.ok(),
            },
        }
    }
}

/// What the kernel layer says: BTF, tracefs, and the probes the attach policy uses.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelFacts {
    pub btf_path: String,
    /// The BTF file exists (tools then check it parses before starting).
    #[serde(skip)]
    pub btf_present: bool,
    pub btf_error: Option<String>,
    pub tracefs: TracefsFacts,
    pub raw_tp: ProbeFacts,
    pub fentry: ProbeFacts,
    pub kprobes: ProbeFacts,
}

impl KernelFacts {
    /// From the `Env` the tools share: its probes, and its tracefs (found, or mounted here as
    /// a tool would mount it).
    pub fn read(env: &Env) -> KernelFacts {
        let preexisting =
            std::env::var_os("TRACEKIT_TRACEFS").is_some() || Tracefs::find().is_some();
        let tracefs = match env.tracefs() {
            Ok(t) => TracefsFacts {
                available: true,
                path: Some(t.root().display().to_string()),
                mounted_by_doctor: !preexisting,
                error: None,
            },
            Err(e) => TracefsFacts {
                error: Some(e.clone()),
                ..Default::default()
            },
        };
        let btf_present = features::btf_present();
        let btf_error = if btf_present {
            btf::vmlinux().err().map(|e| e.to_string())
        } else {
            Some(format!(
                "{} is missing (CONFIG_DEBUG_INFO_BTF, or point TRACEKIT_BTF at a BTF file for this kernel)",
                btf::vmlinux_path().display()
            ))
        };
        KernelFacts {
            btf_path: btf::vmlinux_path().display().to_string(),
            btf_present,
            btf_error,
            tracefs,
            raw_tp: env.raw_tp().into(),
            fentry: env.fentry().into(),
            kprobes: env.kprobes().into(),
        }
    }
}

/// Everything doctor says about the node: the JSON `system` line, and the text header.
#[derive(Clone, Debug, Serialize)]
pub struct System {
    pub kernel: String,
    pub root: bool,
    /// Capabilities every tool needs that tracekit lacks (empty as root).
    pub missing_capabilities: Vec<&'static str>,
    pub capabilities: Caps,
    pub btf: bool,
    /// `btf_path`, `btf_error`, `tracefs`, `raw_tp`, `fentry`, `kprobes`.
    #[serde(flatten)]
    pub features: KernelFacts,
    /// `v2`, `hybrid`, `v1` or `none`.
    pub cgroup: &'static str,
    pub cgroup_detail: String,
    /// Where the memory controller's hierarchy is mounted (what memory cgroup paths are
    /// relative to).
    pub cgroup_memory: Option<String>,
    /// What every tool will call a container here, and what the host.
    pub containers: container::Census,
    pub numa_nodes: usize,
    pub numa_node_ids: Vec<u32>,
    pub numa: Vec<Node>,
    /// `numa_balancing`, `thp`, `disks`, `conntrack`, `lockdown`, `lockdown_error`.
    #[serde(flatten)]
    pub settings: Settings,
    /// Why every tool's start-up checks would refuse to run (an unusable BTF file): the
    /// tools' verdicts follow it.
    #[serde(skip)]
    pub preflight_refusal: Option<String>,
    #[serde(skip)]
    pub missing: Vec<Cap>,
}

impl System {
    pub fn new(h: HostFacts, k: KernelFacts) -> System {
        let missing = proc::missing_caps(h.capeff, proc::TOOL_CAPS);
        let names = |caps: &[Cap]| caps.iter().map(|c| c.name()).collect::<Vec<_>>();
        let effective: Vec<Cap> = Cap::ALL
            .iter()
            .copied()
            .filter(|&c| proc::has_cap(h.capeff, c))
            .collect();
        let (cgroup, cgroup_detail) = cgroup_mode(&h.mounts);
        let preflight_refusal = match (&k.btf_error, k.btf_present) {
            (Some(e), true) => Some(format!(
                "every tool checks the kernel BTF before starting, and it is unusable: {e}"
            )),
            _ => None,
        };
        System {
            kernel: h.kernel.unwrap_or_else(|| "unknown".into()),
            root: h.euid == 0,
            missing_capabilities: names(&missing),
            capabilities: Caps {
                effective: names(&effective),
                needed: names(proc::TOOL_CAPS),
                missing: names(&missing),
            },
            btf: k.btf_error.is_none(),
            features: k,
            cgroup,
            cgroup_detail,
            cgroup_memory: h.cgroup.v1_memory.as_ref().map_or_else(
                || {
                    h.cgroup
                        .v2_root
                        .as_ref()
                        .map(|p| format!("{} (v2)", p.display()))
                },
                |p| Some(format!("{} (v1)", p.display())),
            ),
            containers: h.containers,
            numa_nodes: h.topology.len(),
            numa_node_ids: h.topology.nodes.iter().map(|n| n.id).collect(),
            numa: h.topology.nodes,
            settings: h.settings,
            preflight_refusal,
            missing,
        }
    }

    pub fn read(env: &Env) -> System {
        System::new(HostFacts::read(), KernelFacts::read(env))
    }

    /// tracekit lacks a capability every tool needs.
    pub fn unprivileged(&self) -> bool {
        !self.missing.is_empty()
    }

    /// The first line of the text report.
    pub fn title(&self) -> String {
        let who = if self.root {
            "running as root".to_string()
        } else if self.unprivileged() {
            format!(
                "NOT PERMITTED: lacking {}, no tool can run and the answers below are incomplete (probes cannot load, tracefs may be unreadable)",
                proc::cap_list(&self.missing)
            )
        } else {
            format!("not root but with {}", proc::cap_list(proc::TOOL_CAPS))
        };
        format!("tracekit doctor: Linux {}, {who}", self.kernel)
    }

    /// The node's facts, one `label  value` line each.
    pub fn lines(&self) -> Vec<String> {
        let yes_no =
            |p: &ProbeFacts| format!("{}: {}", if p.available { "yes" } else { "no" }, p.why);
        let t = &self.features.tracefs;
        let rows: Vec<(&str, String)> = vec![
            (
                "BTF",
                match &self.features.btf_error {
                    None => format!("yes ({})", self.features.btf_path),
                    Some(e) => format!("no: {e}; tp_btf and fentry unavailable"),
                },
            ),
            (
                "tracefs",
                match (&t.path, &t.error) {
                    (Some(p), _) if t.mounted_by_doctor => {
                        format!("was not mounted; doctor mounted it at {p}")
                    }
                    (Some(p), _) => format!("mounted at {p}"),
                    (None, e) => format!("unavailable: {}", e.as_deref().unwrap_or("?")),
                },
            ),
            ("raw_tp", yes_no(&self.features.raw_tp)),
            ("fentry", yes_no(&self.features.fentry)),
            ("kprobes", yes_no(&self.features.kprobes)),
            ("capabilities", self.caps_text()),
            ("cgroup", self.cgroup_text()),
            ("containers", self.containers.text()),
            ("NUMA nodes", numa_text(&self.numa)),
            ("NUMA distance", distance_text(&self.numa)),
            (
                "NUMA balancing",
                balancing_text(self.settings.numa_balancing.as_deref()),
            ),
            ("THP", self.settings.thp.text()),
            ("I/O scheduler", schedulers_text(&self.settings.disks)),
            (
                "conntrack",
                conntrack_text(self.settings.conntrack.as_ref()),
            ),
            (
                "lockdown",
                match (&self.settings.lockdown, &self.settings.lockdown_error) {
                    (Some(l), _) => l.clone(),
                    (None, e) => format!("unknown: {}", e.as_deref().unwrap_or("?")),
                },
            ),
        ];
        let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.into_iter()
            .map(|(k, v)| format!("  {k:<w$}  {v}"))
            .collect()
    }

    fn caps_text(&self) -> String {
        let c = &self.capabilities;
        let has = if c.effective.is_empty() {
            "none".to_string()
        } else {
            c.effective.join(", ")
        };
        if c.missing.is_empty() {
            format!("has {has}; tools need {}", c.needed.join(" and "))
        } else {
            format!(
                "LACKS {}, which every tool needs (has: {has})",
                c.missing.join(" and ")
            )
        }
    }

    fn cgroup_text(&self) -> String {
        match &self.cgroup_memory {
            Some(m) => format!(
                "{}: {}; memory controller at {m}",
                self.cgroup, self.cgroup_detail
            ),
            None => format!("{}: {}", self.cgroup, self.cgroup_detail),
        }
    }
}

/// cgroup layout: `v2` (only the unified hierarchy), `hybrid` (v1 controllers and a v2 tree),
/// `v1`, or `none`; with a detail line.
pub fn cgroup_mode(mounts: &[Mount]) -> (&'static str, String) {
    let points = |t: &str| -> Vec<String> {
        mounts
            .iter()
            .filter(|m| m.fs_type == t)
            .map(|m| m.mount_point.display().to_string())
            .collect()
    };
    let (v1, v2) = (points("cgroup"), points("cgroup2"));
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

/// CPU numbers as a sysfs-style list: `0-3,8,10-11`.
pub fn cpu_ranges(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(",")
    }
}

fn gib(kib: u64) -> String {
    format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0))
}

fn numa_text(nodes: &[Node]) -> String {
    let each: Vec<String> = nodes
        .iter()
        .map(|n| {
            let mem = match (n.mem_total_kib, n.mem_free_kib) {
                (Some(t), Some(f)) => format!(", {} ({} free)", gib(t), gib(f)),
                (Some(t), None) => format!(", {}", gib(t)),
                _ => String::new(),
            };
            format!("node{}: CPUs {}{mem}", n.id, cpu_ranges(&n.cpus))
        })
        .collect();
    format!("{} ({})", nodes.len(), each.join("; "))
}

fn distance_text(nodes: &[Node]) -> String {
    let each: Vec<String> = nodes
        .iter()
        .map(|n| {
            let d: Vec<String> = n.distance.iter().map(u32::to_string).collect();
            format!(
                "node{}: {}",
                n.id,
                if d.is_empty() {
                    "?".into()
                } else {
                    d.join(" ")
                }
            )
        })
        .collect();
    let remote = nodes.iter().flat_map(|n| n.distance.iter()).max().copied();
    match remote {
        Some(r) if r > 10 => format!(
            "{} (remote memory up to {:.1}x the local cost)",
            each.join("; "),
            f64::from(r) / 10.0
        ),
        _ => each.join("; "),
    }
}

fn balancing_text(v: Option<&str>) -> String {
    match v {
        None => "absent (kernel without CONFIG_NUMA_BALANCING)".into(),
        Some("0") => "0 (off)".into(),
        Some("1") => "1 (on: the kernel migrates pages and tasks toward each other)".into(),
        Some("2") => "2 (memory tiering: hot pages promoted to faster nodes)".into(),
        Some("3") => "3 (on, and memory tiering)".into(),
        Some(x) => x.to_string(),
    }
}

/// Disks grouped by scheduler: `mq-deadline: vda; none: loop0, loop1`.
fn schedulers_text(disks: &[Disk]) -> String {
    if disks.is_empty() {
        return "no block devices".into();
    }
    let mut by: Vec<(String, Vec<&str>)> = Vec::new();
    for d in disks {
        let s = d
            .queue
            .scheduler
            .clone()
            .unwrap_or_else(|| "no scheduler (bio-based)".into());
        match by.iter_mut().find(|(x, _)| *x == s) {
            Some((_, v)) => v.push(&d.name),
            None => by.push((s, vec![&d.name])),
        }
    }
    by.iter()
        .map(|(s, v)| format!("{s}: {}", v.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

fn conntrack_text(c: Option<&Conntrack>) -> String {
    let Some(c) = c else {
        return "not loaded (no nf_conntrack_count)".into();
    };
    let pct = if c.max > 0 {
        format!(" ({:.1}%)", c.count as f64 * 100.0 / c.max as f64)
    } else {
        String::new()
    };
    let stat = |k: &str| c.stats.get(k).map(|v| format!(", {k}={v}"));
    let stats: String = ["drop", "insert_failed", "early_drop"]
        .iter()
        .filter_map(|k| stat(k))
        .collect();
    format!("loaded: {} of {} entries{pct}{stats}", c.count, c.max)
}

#[cfg(test)]
mod tests;
