//! NUMA layout and memory placement: nodes with their CPUs, memory and distances
//! (`/sys/devices/system/node/node*/{cpulist,meminfo,distance,numastat}`), and where a process's
//! pages are (`/proc/<pid>/numa_maps`). A kernel without NUMA has no node directory: it is one
//! node 0 holding every CPU.

use std::{collections::BTreeMap, path::Path};

use serde::Serialize;

use super::{parse_cpu_list, proc_path, read_text, read_trim, sys_path, HostError};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Node {
    pub id: u32,
    pub cpus: Vec<u32>,
    pub mem_total_kib: Option<u64>,
    pub mem_free_kib: Option<u64>,
    /// `distance` row: relative access cost to each node, by node order (10 = local).
    pub distance: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

impl Topology {
    pub fn read() -> Topology {
        Topology::read_from(&sys_path("devices/system/node"), crate_possible_cpus())
    }

    /// Reads a node directory tree; `ncpus` fills node 0 when the tree is absent.
    pub fn read_from(dir: &Path, ncpus: u32) -> Topology {
        let mut nodes: Vec<Node> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name();
                        let id: u32 = name.to_str()?.strip_prefix("node")?.parse().ok()?;
                        Some(read_node(&e.path(), id))
                    })
                    .collect()
            })
            .unwrap_or_default();
        nodes.sort_by_key(|n| n.id);
        if nodes.is_empty() {
            nodes.push(Node {
                id: 0,
                cpus: (0..ncpus).collect(),
                distance: vec![10],
                ..Default::default()
            });
        }
        Topology { nodes }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node of each CPU, indexed by CPU number (`u32::MAX` for a CPU in no node).
    pub fn cpu_to_node(&self) -> Vec<u32> {
        let max = self
            .nodes
            .iter()
            .flat_map(|n| n.cpus.iter())
            .max()
            .copied()
            .unwrap_or(0);
        let mut v = vec![u32::MAX; max as usize + 1];
        for n in &self.nodes {
            for &c in &n.cpus {
                v[c as usize] = n.id;
            }
        }
        v
    }

    /// Index of node `id` in [`Self::nodes`] (node ids may have holes).
    pub fn index_of(&self, id: u32) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }
}

fn crate_possible_cpus() -> u32 {
    read_trim(&sys_path("devices/system/cpu/possible"))
        .and_then(|s| parse_cpu_list(&s))
        .map(|v| v.len() as u32)
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

fn read_node(dir: &Path, id: u32) -> Node {
    let meminfo = read_text(&dir.join("meminfo")).unwrap_or_default();
    let kib = |key: &str| {
        meminfo.lines().find_map(|l| {
            // `Node 0 MemTotal:        6645536 kB`
            let rest = l.split_once(&format!(" {key}:"))?.1;
            rest.split_whitespace().next()?.parse().ok()
        })
    };
    Node {
        id,
        cpus: read_trim(&dir.join("cpulist"))
            .and_then(|s| parse_cpu_list(&s))
            .unwrap_or_default(),
        mem_total_kib: kib("MemTotal"),
        mem_free_kib: kib("MemFree"),
        distance: read_trim(&dir.join("distance"))
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Per-node allocation counters (`nodeN/numastat`): numa_hit, numa_miss, numa_foreign,
/// interleave_hit, local_node, other_node.
pub fn numastat(node: u32) -> BTreeMap<String, u64> {
    read_text(&sys_path(&format!(
        "devices/system/node/node{node}/numastat"
    )))
    .map(|t| parse_key_values(&t))
    .unwrap_or_default()
}

/// `key value` lines.
pub fn parse_key_values(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.parse().ok()?))
        })
        .collect()
}

/// Where a process's memory is, from `/proc/<pid>/numa_maps`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// KiB resident per node id.
    pub kib_by_node: BTreeMap<u32, u64>,
    /// Memory policies seen, with the KiB under each (`default`, `bind:1`, `interleave:0-1`,
    /// `prefer:1`, `local`).
    pub policies: BTreeMap<String, u64>,
}

impl Placement {
    pub fn total_kib(&self) -> u64 {
        self.kib_by_node.values().sum()
    }

    /// The node holding most of the memory, and its share in parts per million.
    pub fn main_node(&self) -> Option<(u32, u64)> {
        let total = self.total_kib();
        let (&n, &kib) = self
            .kib_by_node
            .iter()
            .max_by_key(|(n, k)| (**k, u32::MAX - **n))?;
        (total > 0).then(|| (n, kib * 1_000_000 / total))
    }
}

/// Parses numa_maps text. Lines look like
/// `7f12a4000000 bind:1 anon=512 dirty=512 active=0 N1=512 kernelpagesize_kB=4`.
pub fn parse_numa_maps(text: &str) -> Placement {
    let mut p = Placement::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(_addr), Some(policy)) = (words.next(), words.next()) else {
            continue;
        };
        let mut pages: Vec<(u32, u64)> = Vec::new();
        let mut page_kib = 4u64;
        for w in words {
            if let Some(v) = w.strip_prefix("kernelpagesize_kB=") {
                page_kib = v.parse().unwrap_or(4);
            } else if let Some(rest) = w.strip_prefix('N') {
                if let Some((n, c)) = rest.split_once('=') {
                    if let (Ok(n), Ok(c)) = (n.parse(), c.parse()) {
                        pages.push((n, c));
                    }
                }
            }
        }
        let mut line_kib = 0;
        for (n, c) in pages {
            let kib = c.saturating_mul(page_kib);
            *p.kib_by_node.entry(n).or_default() += kib;
            line_kib += kib;
        }
        *p.policies.entry(policy.to_string()).or_default() += line_kib;
    }
    p.policies.retain(|_, kib| *kib > 0);
    p
}

/// A live process's placement (reading numa_maps walks its page tables: call it for few
/// processes, and time it).
pub fn placement_of(pid: u32) -> Result<Placement, HostError> {
    Ok(parse_numa_maps(&read_text(&proc_path(&format!(
        "{pid}/numa_maps"
    )))?))
}

/// Where a process may run and allocate, from `/proc/<pid>/status` (`Cpus_allowed_list`,
/// `Mems_allowed_list`: its cpuset and affinity, as lists such as `0-15,32-47`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Allowed {
    pub cpus: String,
    pub mems: String,
}

pub fn parse_allowed(status: &str) -> Allowed {
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    Allowed {
        cpus: get("Cpus_allowed_list:"),
        mems: get("Mems_allowed_list:"),
    }
}

pub fn allowed_of(pid: u32) -> Result<Allowed, HostError> {
    Ok(parse_allowed(&read_text(&proc_path(&format!(
        "{pid}/status"
    )))?))
}

/// NUMA balancing's view of one task, from `/proc/<pid>/task/<tid>/sched` (kernels with
/// CONFIG_SCHED_DEBUG and CONFIG_NUMA_BALANCING; `None` elsewhere).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TaskNuma {
    /// Pages its hinting faults migrated, over its life (`numa_pages_migrated`).
    pub pages_migrated: u64,
    /// The node balancing wants it on (-1: none yet).
    pub preferred_nid: i64,
    /// Hinting faults in its current statistics (`total_numa_faults`, decaying).
    pub total_faults: u64,
    /// `mm->numa_scan_seq`: how many times its address space was scanned.
    pub scan_seq: Option<u64>,
    pub current_node: Option<i64>,
    pub group_id: Option<i64>,
}

/// Parses the NUMA lines of a `sched` file (`key : value` pairs, then
/// `current_node=0, numa_group_id=0`).
pub fn parse_task_numa(text: &str) -> Option<TaskNuma> {
    let mut kv: BTreeMap<&str, i64> = BTreeMap::new();
    let (mut current_node, mut group_id) = (None, None);
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            if let Ok(v) = v.trim().parse::<i64>() {
                kv.insert(k.trim(), v);
            }
        }
        for part in line.split(',') {
            match part.trim().split_once('=') {
                Some(("current_node", v)) => current_node = v.trim().parse().ok(),
                Some(("numa_group_id", v)) => group_id = v.trim().parse().ok(),
                _ => {}
            }
        }
    }
    let get = |k: &str| kv.get(k).copied();
    Some(TaskNuma {
        pages_migrated: get("numa_pages_migrated")?.max(0) as u64,
        preferred_nid: get("numa_preferred_nid")?,
        total_faults: get("total_numa_faults").unwrap_or(0).max(0) as u64,
        scan_seq: get("mm->numa_scan_seq").map(|v| v.max(0) as u64),
        current_node,
        group_id,
    })
}

pub fn task_numa_of(pid: u32, tid: u32) -> Option<TaskNuma> {
    parse_task_numa(&read_text(&proc_path(&format!("{pid}/task/{tid}/sched"))).ok()?)
}

/// `kernel.numa_balancing`: 0 off, 1 on, 2 memory tiering, 3 both; `None` on kernels without
/// CONFIG_NUMA_BALANCING.
pub fn numa_balancing() -> Option<u32> {
    super::sysctl("kernel.numa_balancing")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_maps_sums_pages_per_node_and_policy() {
        let text = "\
7f0000000000 bind:1 anon=512 dirty=512 N1=512 kernelpagesize_kB=4
7f0000200000 default anon=1 dirty=1 N0=1 kernelpagesize_kB=2048
559612c4b000 default file=/usr/bin/head mapped=2 N0=2 kernelpagesize_kB=4
7fff00000000 default stack anon=3 dirty=3 N0=1 N1=2 kernelpagesize_kB=4
7fff10000000 default
garbage
";
        let p = parse_numa_maps(text);
        assert_eq!(p.kib_by_node[&0], 2048 + 8 + 4);
        assert_eq!(p.kib_by_node[&1], 2048 + 8);
        assert_eq!(p.policies["bind:1"], 2048);
        assert_eq!(p.total_kib(), 2048 * 2 + 20);
        let (node, ppm) = p.main_node().unwrap();
        assert_eq!(node, 0);
        assert!(ppm > 500_000, "{ppm}");
        assert_eq!(parse_numa_maps("").main_node(), None);
    }

    #[test]
    fn topology_from_a_fixture_tree_and_without_one() {
        let d = std::env::temp_dir().join(format!("tk-numa-{}", std::process::id()));
        for (n, cpus, dist) in [(0, "0-1", "10 20"), (1, "2-3", "20 10")] {
            let nd = d.join(format!("node{n}"));
            std::fs::create_dir_all(&nd).unwrap();
            std::fs::write(nd.join("cpulist"), cpus).unwrap();
            std::fs::write(nd.join("distance"), dist).unwrap();
            std::fs::write(
                nd.join("meminfo"),
                format!("Node {n} MemTotal:  1000 kB\nNode {n} MemFree:   400 kB\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(d.join("power")).unwrap();
        let t = Topology::read_from(&d, 4);
        assert_eq!(t.len(), 2);
        assert_eq!(t.nodes[1].cpus, [2, 3]);
        assert_eq!(t.nodes[1].distance, [20, 10]);
        assert_eq!(t.nodes[0].mem_free_kib, Some(400));
        assert_eq!(t.cpu_to_node(), [0, 0, 1, 1]);
        let _ = std::fs::remove_dir_all(&d);
        let flat = Topology::read_from(Path::new("/nonexistent"), 3);
        assert_eq!(flat.len(), 1);
        assert_eq!(flat.cpu_to_node(), [0, 0, 0]);
    }

    #[test]
    fn allowed_lists_and_task_numa_from_fixtures() {
        let a = parse_allowed(&crate::host::fixture("numa/status"));
        assert_eq!(a.cpus, "0-15,32-47");
        assert_eq!(a.mems, "0-1");
        assert_eq!(parse_allowed("Name: x\n"), Allowed::default());
        let t = parse_task_numa(&crate::host::fixture("numa/sched")).unwrap();
        assert_eq!(t.pages_migrated, 8190);
        assert_eq!(t.preferred_nid, 0);
        assert_eq!(t.total_faults, 16374);
        assert_eq!(t.scan_seq, Some(3));
        assert_eq!(t.current_node, Some(0));
        assert_eq!(t.group_id, Some(4711));
        // A kernel without NUMA balancing prints none of these lines.
        assert_eq!(
            parse_task_numa("se.exec_start : 1.5\nnr_switches : 3\n"),
            None
        );
    }

    #[test]
    fn reads_this_machine() {
        let t = Topology::read();
        assert!(!t.is_empty());
        assert!(!t.nodes[0].cpus.is_empty());
        let me = placement_of(std::process::id()).unwrap();
        assert!(me.total_kib() > 0);
        assert!(parse_key_values("numa_hit 5\nbad\n")["numa_hit"] == 5);
    }
}
