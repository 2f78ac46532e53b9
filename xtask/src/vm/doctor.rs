//! `tracekit doctor` on the host and on every guest kernel, side by side: what differs is
//! printed as one table, and what must hold (facts the VM setup guarantees, the host's answers
//! against its own sysfs) becomes failures.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// What the host's sysfs shows directly, to check the host's doctor against.
#[derive(Clone, Copy, Debug)]
pub struct HostTruth {
    pub kprobe_pmu: bool,
    pub numa_nodes: usize,
}

impl HostTruth {
    pub fn read() -> HostTruth {
        let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_prefix("node")
                            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count()
            })
            .unwrap_or(1)
            .max(1);
        HostTruth {
            kprobe_pmu: std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
            numa_nodes,
        }
    }
}

/// The comparison: a table of what differs, and what failed.
#[derive(Debug, Default)]
pub struct Comparison {
    pub table: Vec<String>,
    pub failures: Vec<String>,
}

/// System facts compared: (label, JSON pointer into the `system` line).
const FACTS: &[(&str, &str)] = &[
    ("kernel", "/kernel"),
    ("BTF", "/btf"),
    ("kprobes", "/kprobes/available"),
    ("fentry", "/fentry/available"),
    ("raw_tp", "/raw_tp/available"),
    ("NUMA nodes", "/numa_nodes"),
    ("cgroup", "/cgroup"),
    ("THP enabled", "/thp/enabled"),
    ("THP defrag", "/thp/defrag"),
    ("lockdown", "/lockdown"),
];

/// What every guest must report: the qemu line gives it two NUMA nodes, and Debian's kernels
/// (5.10 and later) enable kprobes and BPF trampolines, which this host's kernel lacks.
/// (label, JSON pointer, value as JSON text).
const GUEST_MUST: &[(&str, &str, &str)] = &[
    ("kprobes", "/kprobes/available", "true"),
    ("fentry", "/fentry/available", "true"),
    ("NUMA nodes", "/numa_nodes", "2"),
];

fn system(lines: &[Value]) -> Option<&Value> {
    lines.iter().find(|l| l["type"] == "system")
}

/// The kernel release a doctor reported, `?` without a system line.
pub fn kernel(lines: &[Value]) -> String {
    system(lines)
        .and_then(|s| s["kernel"].as_str())
        .unwrap_or("?")
        .to_string()
}

fn hook_key(l: &Value) -> String {
    format!(
        "{} {}",
        l["for"].as_str().unwrap_or(""),
        l["event"].as_str().unwrap_or("")
    )
}

/// `hook` lines by "tool event", mapped through `f`.
fn hooks<T>(lines: &[Value], f: impl Fn(&Value) -> T) -> BTreeMap<String, T> {
    lines
        .iter()
        .filter(|l| l["type"] == "hook")
        .map(|l| (hook_key(l), f(l)))
        .collect()
}

/// `{"status":{"offset":44,"size":4}}` → `status@44/4`.
fn layout_text(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, x)| format!("{k}@{}/{}", x["offset"], x["size"]))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".into(),
    }
}

fn show(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// Formats rows as aligned columns.
fn render(rows: &[Vec<String>]) -> Vec<String> {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect()
}

/// Compares the host's doctor with each guest's (`(kernel name, lines)`), printing nothing.
pub fn compare(host: &[Value], truth: HostTruth, guests: &[(&str, &[Value])]) -> Comparison {
    let mut cmp = Comparison::default();
    let Some(h) = system(host) else {
        cmp.failures
            .push("the host's doctor printed no system line".into());
        return cmp;
    };
    let mut cols: Vec<(String, &[Value], &Value)> = vec![("host".into(), host, h)];
    for (name, lines) in guests {
        match system(lines) {
            Some(s) => cols.push((name.to_string(), lines, s)),
            None => cmp
                .failures
                .push(format!("the {name} guest's doctor printed no system line")),
        }
    }
    let mut rows: Vec<Vec<String>> = vec![std::iter::once("what".to_string())
        .chain(cols.iter().map(|c| c.0.clone()))
        .collect()];
    for (label, ptr) in FACTS {
        let vals: Vec<String> = cols.iter().map(|c| show(c.2.pointer(ptr))).collect();
        if vals.iter().collect::<BTreeSet<_>>().len() > 1 {
            rows.push(std::iter::once(label.to_string()).chain(vals).collect());
        }
    }
    let modes: Vec<BTreeMap<String, String>> = cols
        .iter()
        .map(|c| hooks(c.1, |l| l["mode"].as_str().unwrap_or("none").to_string()))
        .collect();
    let layouts: Vec<BTreeMap<String, String>> = cols
        .iter()
        .map(|c| hooks(c.1, |l| layout_text(&l["layout"])))
        .collect();
    let all_hooks: BTreeSet<&String> = modes.iter().flat_map(|m| m.keys()).collect();
    let mut same = 0;
    for hook in &all_hooks {
        let m: Vec<String> = modes
            .iter()
            .map(|x| x.get(*hook).cloned().unwrap_or_else(|| "absent".into()))
            .collect();
        if m.iter().collect::<BTreeSet<_>>().len() > 1 {
            rows.push(std::iter::once(format!("mode {hook}")).chain(m).collect());
        }
        let l: Vec<String> = layouts
            .iter()
            .map(|x| x.get(*hook).cloned().unwrap_or_else(|| "absent".into()))
            .collect();
        if l.iter().collect::<BTreeSet<_>>().len() > 1 {
            rows.push(std::iter::once(format!("fields {hook}")).chain(l).collect());
        } else {
            same += 1;
        }
    }
    cmp.table = render(&rows);
    cmp.table.push(format!(
        "({same} of {} hook(s) read the same fields at the same offsets on every kernel)",
        all_hooks.len()
    ));

    for (name, _, g) in &cols[1..] {
        for (what, ptr, want) in GUEST_MUST {
            let want: Value = serde_json::from_str(want).unwrap_or(Value::Null);
            if g.pointer(ptr) != Some(&want) {
                cmp.failures.push(format!(
                    "{name} guest doctor: {what} is {}, expected {want} (Debian kernel under qemu with two nodes)",
                    show(g.pointer(ptr))
                ));
            }
        }
    }
    if h.pointer("/kprobes/available") != Some(&Value::Bool(truth.kprobe_pmu)) {
        cmp.failures.push(format!(
            "host doctor: kprobes {} but the kprobe PMU {}",
            show(h.pointer("/kprobes/available")),
            if truth.kprobe_pmu {
                "exists"
            } else {
                "is absent"
            }
        ));
    }
    if h.pointer("/numa_nodes") != Some(&Value::from(truth.numa_nodes)) {
        cmp.failures.push(format!(
            "host doctor: numa_nodes {}, sysfs has {}",
            show(h.pointer("/numa_nodes")),
            truth.numa_nodes
        ));
    }
    cmp
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TRUTH: HostTruth = HostTruth {
        kprobe_pmu: false,
        numa_nodes: 1,
    };

    fn sys(kernel: &str, kp: bool, fentry: bool, nodes: u32) -> Value {
        json!({"type": "system", "kernel": kernel, "btf": true, "kprobes": {"available": kp},
               "fentry": {"available": fentry}, "numa_nodes": nodes})
    }

    fn hook(tool: &str, event: &str, mode: Option<&str>, layout: Value) -> Value {
        json!({"type": "hook", "for": tool, "event": event, "mode": mode, "layout": layout})
    }

    #[test]
    fn what_every_guest_must_report() {
        let host = vec![sys("6.18.0", false, false, 1)];
        let a = vec![sys("5.10.0-30-amd64", true, true, 2)];
        let b = vec![sys("6.1.0-57-amd64", true, false, 1)];
        let c = compare(&host, TRUTH, &[("5.10", &a), ("6.1", &b)]);
        assert_eq!(c.failures.len(), 2, "{:?}", c.failures);
        assert!(c.failures.iter().all(|f| f.starts_with("6.1 guest")));
        assert!(c.failures.iter().any(|f| f.contains("fentry")));
        assert!(c.failures.iter().any(|f| f.contains("NUMA nodes is 1")));
        let c = compare(&host, TRUTH, &[("5.10", &a), ("6.12", &[])]);
        assert_eq!(
            c.failures,
            vec!["the 6.12 guest's doctor printed no system line"]
        );
        assert!(!compare(&[], TRUTH, &[("5.10", &a)]).failures.is_empty());
        // The host is checked against its own sysfs, not against the guests.
        let lying = vec![sys("6.18.0", true, false, 4)];
        let c = compare(&lying, TRUTH, &[("5.10", &a)]);
        assert_eq!(c.failures.len(), 2, "{:?}", c.failures);
    }

    #[test]
    fn table_shows_only_what_differs_per_kernel() {
        // A kernel's doctor lines: its release, BTF/fentry, nodes, ctxsw's mode, a field offset.
        let kernel = |release: &str, new: bool, nodes: u32, mode: &str, off: u32| {
            vec![
                sys(release, new, new, nodes),
                hook("ctxsw", "sched:sched_switch", Some(mode), json!({})),
                hook(
                    "memstall",
                    "compaction:mm_compaction_end",
                    Some("tracepoint"),
                    json!({"status": {"offset": off, "size": 4}}),
                ),
            ]
        };
        let host = kernel("6.18.0", false, 1, "tp_btf", 44);
        let old = kernel("5.10.0-30-amd64", true, 2, "raw_tp", 40);
        let new = kernel("6.12.118+deb13-amd64", true, 2, "tp_btf", 44);
        let c = compare(&host, TRUTH, &[("5.10", &old), ("6.12", &new)]);
        assert!(c.failures.is_empty(), "{:?}", c.failures);
        let t = c.table.join("\n");
        assert!(c.table[0].starts_with("what"), "{t}");
        assert!(
            c.table[0].contains("host") && c.table[0].contains("6.12"),
            "{t}"
        );
        let row = |p: &str| c.table.iter().find(|l| l.starts_with(p)).cloned();
        let kp = row("kprobes").expect("kprobes differs");
        assert!(kp.contains("false") && kp.contains("true"), "{kp}");
        assert!(row("BTF").is_none(), "{t}");
        let mode = row("mode ctxsw sched:sched_switch").expect("mode differs");
        assert!(mode.contains("raw_tp"), "{mode}");
        let f = row("fields memstall").expect("layout differs");
        assert!(
            f.contains("status@40/4") && f.contains("status@44/4"),
            "{f}"
        );
        assert!(row("fields ctxsw").is_none(), "{t}");
        assert!(t.contains("(1 of 2 hook(s)"), "{t}");
        // Columns line up: every cell starts at the header's offsets.
        let col = c.table[0].find("5.10").unwrap();
        assert_eq!(&kp[col..col + 4], "true");
    }
}
