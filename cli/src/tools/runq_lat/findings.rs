//! runq-lat's findings: who felt the waits for a CPU (the harm model is
//! [`crate::report::harm`]), who held the CPU meanwhile, and the saturation of CPUs by
//! CPU-bound work.

use std::collections::BTreeMap;

use super::{ev, RunqRow, CPU_SATURATED, INFO, RUNQ_DELAY};
use crate::report::{
    findings::{rank, Finding, FoldInto, Score, Subject, WINDOW_NS},
    render::fmt_ns,
};
use crate::{
    host::proc::SchedClass,
    report::harm::{self, Tail, MIN_PREEMPT_NS_PER_S, MIN_WAKE_NS_PER_S},
};
use probes_common::{hist::LatHist, sched::STEAL_ID};

/// Whether a wake-wait finding's waits are the process's own handoffs: it is woken as often as
/// a context-switch storm switches, and no other process held the CPU for half of the wait.
/// Fewer handoffs is then the fix before any priority change, and triage folds the wait into
/// the storm's finding.
pub fn waits_are_handoffs(f: &Finding) -> bool {
    let (Some(waits), Some(wait_ns), Some(window_ns)) = (
        f.ev(ev::WAKE_WAITS),
        f.ev(ev::WAKE_WAIT_TOTAL_NS),
        f.ev(WINDOW_NS),
    ) else {
        return false;
    };
    waits * 1e9 / window_ns.max(1.0) >= crate::tools::ctxsw::STORM_PER_S
        && f.ev(ev::CULPRIT_DELAY_NS).unwrap_or(0.0) * 2.0 < wait_ns
}

/// What the node looked like over the window, for the saturation and softirq findings.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeLoad {
    pub(super) cpus: usize,
    /// `/proc/pressure/cpu` "some" share of the window, in parts per million.
    pub(super) cpu_pressure_ppm: Option<u64>,
    /// The machine is a virtual machine (`hypervisor` in /proc/cpuinfo): the guest does not
    /// choose its CPUs' idle states.
    pub(super) virtual_machine: bool,
    /// Per CPU, its share of the window spent in softirqs (`/proc/stat`), in ppm.
    pub(super) softirq_ppm: Vec<Option<u64>>,
}

/// The kernel's softirq work on one CPU, held a victim's long waits (see
/// [`harm::MIN_SOFTIRQ_CPU_PPM`]).
#[derive(Clone, Copy, Debug)]
struct Softirq {
    cpu: u32,
    /// The part of the victim's long waits (of all its waits, for a victim judged by its total
    /// wait: `late` false) `ksoftirqd/cpu` held its CPU, and in how many.
    late: bool,
    held_ns: u64,
    waits: u64,
    /// The CPU's softirq share of the window.
    cpu_ppm: u64,
}

/// The CPU whose `ksoftirqd` held most of `held`'s waits (`long_ns` in all), when it held at
/// least [`harm::MIN_CULPRIT_SHARE_PPM`] of them on a CPU that spent at least
/// [`harm::MIN_SOFTIRQ_CPU_PPM`] of the window in softirqs.
fn softirq_holder(
    (held, long_ns, late): (&Held, u64, bool),
    node: &NodeLoad,
    class: &ClassOf,
) -> Option<Softirq> {
    let mut by: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for (pid, (comm, ns, n)) in held {
        let Some(cpu) = comm
            .strip_prefix("ksoftirqd/")
            .and_then(|c| c.parse::<u32>().ok())
        else {
            continue;
        };
        if !class(*pid).kthread {
            continue;
        }
        let e = by.entry(cpu).or_default();
        e.0 += ns;
        e.1 += n;
    }
    let (cpu, (held_ns, waits)) = by.into_iter().max_by_key(|(c, v)| (v.0, u32::MAX - c))?;
    let share = (held_ns as u128 * 1_000_000 / long_ns.max(1) as u128) as u64;
    let cpu_ppm = node.softirq_ppm.get(cpu as usize).copied().flatten()?;
    (share >= harm::MIN_CULPRIT_SHARE_PPM && cpu_ppm >= harm::MIN_SOFTIRQ_CPU_PPM).then_some(
        Softirq {
            cpu,
            late,
            held_ns,
            waits,
            cpu_ppm,
        },
    )
}

/// Per process: its waits merged over its rows, and who held the CPU meanwhile.
struct Acc {
    subject: Subject,
    wake: LatHist,
    preempt_ns: u64,
    preempt_n: u64,
    kernel_ns: u64,
    /// Holder pid → (comm, part of the waits it held the CPU, waits).
    behind: Held,
    /// The same over the long waits only (1 ms or more): whom the tail was spent behind.
    late_behind: Held,
}

/// Holder pid → (comm, part of the waits it held the CPU, waits).
type Held = BTreeMap<u32, (String, u64, u64)>;

fn hold(into: &mut Held, peers: &[super::Peer], me: u32) {
    for p in peers.iter().filter(|p| p.who.pid != me) {
        let e = into.entry(p.who.pid).or_insert((p.who.comm.clone(), 0, 0));
        e.1 += p.delay_ns.unwrap_or(0);
        e.2 += p.count;
    }
}

/// A victim: the process, its score, and the words that say what it felt.
struct Victim<'a> {
    pid: u32,
    a: &'a Acc,
    score: u64,
    tail: Tail,
    /// Judged by its tail (a latency-sensitive process), not by the share of time it waited.
    by_tail: bool,
    /// Its long waits were held by softirq work rather than by processes (a tail victim only).
    softirq: Option<Softirq>,
}

/// A holder of the CPU that a finding can name as its culprit: a process someone could change
/// (not the idle CPU, not the hypervisor's steal, not the victim itself, not a kernel thread, not a name we never learned).
fn changeable(pid: u32, comm: &str, victim: u32, class: &ClassOf) -> bool {
    pid != 0
        && pid != STEAL_ID
        && pid != victim
        && !comm.is_empty()
        && comm != "[exited]"
        && !class(pid).kthread
}

/// The share of `long_ns` (parts per million) that changeable holders held the CPU.
fn changeable_share_ppm(held: &Held, victim: u32, long_ns: u64, class: &ClassOf) -> u64 {
    let by: u64 = held
        .iter()
        .filter(|(p, (comm, _, _))| changeable(**p, comm, victim, class))
        .map(|(_, (_, ns, _))| *ns)
        .sum();
    (by as u128 * 1_000_000 / long_ns.max(1) as u128).min(u64::MAX as u128) as u64
}

/// How a process is scheduled ([`crate::host::proc::sched_class`] in a run; the default for a
/// process that has exited).
pub(super) type ClassOf<'a> = dyn Fn(u32) -> SchedClass + 'a;

/// The findings of a window (the harm model is [`crate::report::harm`]):
/// - victims: processes that waited after their wakeups, judged by their tail when they are
///   latency-sensitive (woken often, mostly asleep) and by their total wait otherwise, each
///   with the tasks that held the CPU meanwhile;
/// - one saturation finding when CPU-bound processes wait for each other after preemptions,
///   the hogs as culprits, ranked below every victim of this window.
///
/// tracekit itself is never a victim or a culprit, nor is a process that asked to wait (nice 10
/// or more, SCHED_BATCH, SCHED_IDLE).
pub(super) fn findings(
    rows: &[RunqRow],
    secs: f64,
    node: &NodeLoad,
    class: &ClassOf,
) -> Vec<Finding> {
    // Each process's class is read once per window, however many victims it held a CPU for.
    let seen = std::cell::RefCell::new(BTreeMap::new());
    let class = &|pid: u32| *seen.borrow_mut().entry(pid).or_insert_with(|| class(pid));
    let me = std::process::id();
    let mut per: BTreeMap<u32, Acc> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.id != 0 && r.who.pid != me && r.who.processes.is_none())
    {
        let a = per.entry(r.who.pid).or_insert_with(|| Acc {
            subject: r.who.subject(),
            wake: LatHist::ZERO,
            preempt_ns: 0,
            preempt_n: 0,
            kernel_ns: 0,
            behind: BTreeMap::new(),
            late_behind: BTreeMap::new(),
        });
        a.wake.merge(&r.hists.0);
        a.preempt_ns += r.preempt.s.total_ns;
        a.preempt_n += r.preempt.s.count;
        a.kernel_ns += r.kernel_run_delay_ns;
        hold(&mut a.behind, &r.waited_behind, me);
        hold(&mut a.late_behind, &r.late_waits_behind, me);
    }
    let mut victims: Vec<Victim> = Vec::new();
    let mut hogs: Vec<(u32, &Acc)> = Vec::new();
    for (pid, a) in &per {
        let c = class(*pid);
        // A process that asked to wait (nice 10 or more, SCHED_BATCH, SCHED_IDLE) is neither a
        // victim nor a hog saturating the CPUs: it yields to the others, and its own waits
        // after preemptions are what it asked for (a UDP sender at SCHED_IDLE waited 25 % of
        // the time and was named the saturation's culprit of a node whose work it never
        // delayed).
        if harm::asked_to_wait(c.nice, c.policy) {
            continue;
        }
        let sensitive = harm::latency_sensitive(a.wake.count, a.preempt_n, secs);
        // A kernel thread is no hog to renice or move: its CPU time is work the kernel does
        // for someone, told by that work's tool (a guest's DAMON thread, kdamond.0, waited
        // 84 % of a busy window after preemptions and was named the saturation's culprit
        // above the two staged hogs).
        if !sensitive && !c.kthread && (a.preempt_ns as f64 / secs) as u64 >= MIN_PREEMPT_NS_PER_S {
            hogs.push((*pid, a));
        }
        // Time spent while the CPU was idle and waking up (its exit from a sleep state, the
        // IPI) is wakeup latency, not contention: nobody held the CPU. A ping-pong whose every
        // hop wakes an idle CPU is a context-switch storm, not a starved process.
        let idle_ns = a.behind.get(&0).map_or(0, |v| v.1);
        // Nor is the time the hypervisor ran another guest's vCPU: the cpu-steal finding's.
        let steal_ns = a.behind.get(&STEAL_ID).map_or(0, |v| v.1);
        let starved = (a.wake.sum.saturating_sub(idle_ns + steal_ns) as f64 / secs) as u64;
        let tail = Tail::of(&a.wake);
        // A latency-sensitive process is told by its tail whenever its late waits are harm
        // someone who could change caused: they held its CPU for most of its long waits (not
        // of all its waits: the task a process usually follows on its CPU holds most of its
        // short waits and need not be why the long ones are long). The score is then the
        // larger of its excess wait and (when it is starved as well) its whole wait.
        // Or when the kernel's softirq work on its CPU held them (a CPU busy with a NIC's
        // receive work, say): what to change is where that work or the victim runs.
        let tail_victim = sensitive && !c.kthread && harm::tail_is_harm(&tail, secs);
        let by_holders = tail_victim
            && changeable_share_ppm(&a.late_behind, *pid, tail.long_ns, class)
                >= harm::MIN_CULPRIT_SHARE_PPM;
        let softirq = (tail_victim && !by_holders)
            .then(|| softirq_holder((&a.late_behind, tail.long_ns, true), node, class))
            .flatten();
        let by_tail = by_holders || softirq.is_some();
        let starved = (starved >= MIN_WAKE_NS_PER_S).then_some(starved);
        let score = match (by_tail, starved) {
            (true, s) => tail.excess_ns_per_s(secs).max(s.unwrap_or(0)),
            (false, Some(s)) => s,
            (false, None) => continue,
        };
        // Starved (its median wait itself long, so no wait is late) behind softirq work
        // rather than processes: beside a UDP flood steered to its CPU a sleeper's median
        // wait was 1.02 ms, ksoftirqd/1 holding 3.02 s of its 3.35 s.
        let softirq = softirq.or_else(|| {
            let by_procs = changeable_share_ppm(&a.behind, *pid, a.wake.sum, class)
                >= harm::MIN_CULPRIT_SHARE_PPM;
            (!by_tail && !by_procs)
                .then(|| softirq_holder((&a.behind, a.wake.sum, false), node, class))
                .flatten()
        });
        victims.push(Victim {
            pid: *pid,
            a,
            score,
            tail,
            by_tail,
            softirq,
        });
    }
    let mut out: Vec<Finding> = victims
        .iter()
        .map(|v| victim_finding(v, secs, node, class))
        .collect();
    if !hogs.is_empty() {
        let floor = victims.iter().map(|v| v.score).min();
        out.push(saturation_finding(
            rows,
            &hogs,
            &victims,
            (secs, node, floor),
            class,
        ));
    }
    rank(&mut out);
    out
}

/// The finding of one victim: what it felt, behind whom, and what to change.
fn victim_finding(v: &Victim, secs: f64, node: &NodeLoad, class: &ClassOf) -> Finding {
    let (pid, a, t) = (v.pid, v.a, &v.tail);
    // A tail victim is told whom its long waits were spent behind, the others whom all.
    let held_by = if v.by_tail { &a.late_behind } else { &a.behind };
    let mut behind: Vec<(u32, &(String, u64, u64))> =
        held_by.iter().map(|(p, x)| (*p, x)).collect();
    behind.sort_by(|x, y| y.1 .1.cmp(&x.1 .1).then(x.0.cmp(&y.0)));
    let held: Vec<String> = behind
        .iter()
        .take(3)
        .map(|(p, (c, ns, n))| {
            let n = if *n == 1 {
                "1 wait".to_string()
            } else {
                format!("{n} waits")
            };
            if *p == 0 {
                format!("an idle CPU waking up for {} ({n})", fmt_ns(*ns))
            } else if *p == STEAL_ID {
                format!("the hypervisor (CPU steal) for {} ({n})", fmt_ns(*ns))
            } else if *p == pid {
                format!("its own threads for {} ({n})", fmt_ns(*ns))
            } else if c.is_empty() {
                format!("pid {p} for {} ({n})", fmt_ns(*ns))
            } else {
                format!("{c} (pid {p}) for {} ({n})", fmt_ns(*ns))
            }
        })
        .collect();
    let culprit = behind
        .iter()
        .find(|(p, (c, _, _))| changeable(*p, c, pid, class))
        .filter(|_| v.softirq.is_none());
    let share = a.wake.sum as f64 / secs / 1e7;
    let mut summary = if v.by_tail {
        format!(
            "{}: 1 in {} wakeups waited over {} for a CPU, p99.9 {}, max {} (its median wait is {}): {} of excess wait per second, {:.1} % of its time waiting in all ({} waits)",
            a.subject.text(),
            t.one_in(),
            fmt_ns(t.late_ns),
            fmt_ns(t.p999_ns),
            fmt_ns(t.max_ns),
            fmt_ns(t.typical_ns),
            fmt_ns(v.score),
            share,
            t.waits,
        )
    } else {
        format!(
            "{} waited {} of {} for a CPU after its wakeups ({share:.1} % of the time): {} waits, p50 {}, p99 {}, max {}",
            a.subject.text(),
            fmt_ns(a.wake.sum),
            fmt_ns((secs * 1e9) as u64),
            t.waits,
            fmt_ns(t.typical_ns),
            fmt_ns(t.p99_ns),
            fmt_ns(t.max_ns),
        )
    };
    if !held.is_empty() && v.by_tail {
        summary.push_str(&format!(
            "; in its waits over {} the CPU was held by {}",
            fmt_ns(harm::LATE_FLOOR_NS),
            held.join(", ")
        ));
    } else if !held.is_empty() {
        summary.push_str(&format!("; the CPU was held by {}", held.join(", ")));
    }
    if let Some(s) = v.softirq {
        summary.push_str(&format!(
            "; CPU {} spent {:.1} % of the window in softirqs (/proc/stat), the deferred interrupt work ksoftirqd/{} runs",
            s.cpu,
            s.cpu_ppm as f64 / 1e4,
            s.cpu
        ));
    }
    summary.push('.');
    let advice = match (behind.first(), culprit) {
        _ if v.softirq.is_some() => "softirq work on its CPU (a NIC's receive or transmit work, block completions) held its wakeups: keep it off that CPU (taskset, cpusets) or move the work away (for NET_RX: RPS in /sys/class/net/<dev>/queues/rx-*/rps_cpus, the NIC's IRQ affinity, more queues); irq-lat names the vector",
        (Some((0, _)), _) if node.virtual_machine => "its wakeups wait for an idle vCPU to be run again by the hypervisor (a guest does not choose C-states): poll before halting in the guest (the cpuidle-haltpoll driver, guest_halt_poll_ns), or ask for dedicated vCPUs",
        (Some((STEAL_ID, _)), _) => "most of its waits were the hypervisor running other work on its vCPU (CPU steal): ask for dedicated or less contended vCPUs, or move it to a host with headroom; renicing on the node cannot help",
        (Some((0, _)), _) => "its wakeups wait for idle CPUs to wake: limit deep C-states (cpupower idle-set, the PM QoS latency target) or keep it on a busy CPU",
        (_, None) => "the CPU was held by kernel work or by tasks that are gone: see what runs there (tracekit irq-lat for softirq and interrupt time, tracekit profile --cpu) before changing priorities",
        _ => "give it the CPU first: raise its weight (nice -n -5, cpu.weight) or lower the hogs' (nice 19, SCHED_IDLE, a smaller cpu.weight or cpu.max), or keep the hogs off its CPUs (cpusets, taskset)",
    };
    let mut f = Finding {
        tool: INFO.name,
        cause: RUNQ_DELAY,
        subject: a.subject.clone(),
        culprit: match v.softirq {
            Some(s) => Some(Subject::named("cpu", format!("CPU {}", s.cpu))),
            None => culprit.map(|(p, (c, _, _))| Subject::process(*p, c.clone())),
        },
        // A kernel thread's delay is felt in the work it serves (writeback, receive, vmstat
        // updates), which that work's own tool measures: its waits rank as a rate, after any
        // time a process lost. Beside two nice-0 hogs pinned to a CPU, that CPU's kworker and
        // kdamond waited 2.5-3.7 s once each in a 7 s window (36-52 % of it) and outranked
        // the UDP receiver losing 12 % of its datagrams.
        score: if class(pid).kthread {
            Score::RatePerS(a.wake.count as f64 / secs.max(1e-9))
        } else {
            Score::NsPerS(v.score)
        },
        summary,
        evidence: vec![],
        advice: advice.into(),
        next: Some(match v.softirq {
            Some(_) => "tracekit irq-lat --duration 10s".to_string(),
            None => format!("tracekit runq-lat --pid {pid} --threads --duration 10s"),
        }),
        fold: None,
        members: Vec::new(),
    }
    .evidence(ev::WAKE_WAITS, a.wake.count)
    .evidence(ev::WAKE_WAIT_TOTAL_NS, a.wake.sum)
    .evidence(ev::WAKE_P50_NS, t.typical_ns)
    .evidence(ev::WAKE_P99_NS, t.p99_ns)
    .evidence(ev::WAKE_P999_NS, t.p999_ns)
    .evidence(ev::WAKE_MAX_NS, t.max_ns)
    .evidence(ev::WAKE_LATE, t.late)
    .evidence(ev::WAKE_LATE_OVER_NS, t.late_ns)
    .evidence(ev::WAKE_EXCESS_NS, t.excess_ns)
    .evidence(ev::WAKE_LONG_TOTAL_NS, t.long_ns)
    .evidence("kernel_run_delay_ns", a.kernel_ns);
    if let Some((p, _)) = culprit {
        // Its part of all the waits (what folds and links compare), and of the long ones.
        let (ns, n) = a.behind.get(p).map_or((0, 0), |x| (x.1, x.2));
        f = f
            .evidence(ev::CULPRIT_DELAY_NS, ns)
            .evidence("culprit_waits", n);
        if let Some(x) = a.late_behind.get(p) {
            f = f
                .evidence(ev::CULPRIT_LATE_DELAY_NS, x.1)
                .evidence("culprit_late_waits", x.2);
        }
    }
    if let Some(s) = v.softirq {
        f = f
            .evidence(ev::SOFTIRQ_CPU, s.cpu)
            .evidence(ev::CPU_SOFTIRQ_PPM, s.cpu_ppm)
            .evidence(
                if s.late {
                    ev::CULPRIT_LATE_DELAY_NS
                } else {
                    ev::CULPRIT_DELAY_NS
                },
                s.held_ns,
            )
            .evidence(
                if s.late {
                    "culprit_late_waits"
                } else {
                    "culprit_waits"
                },
                s.waits,
            );
    }
    f = f.evidence(WINDOW_NS, (secs * 1e9) as u64);
    handoffs(f)
}

/// A wake-wait finding whose waits are the process's own handoffs ([`waits_are_handoffs`])
/// says to batch them, and is the cost of the process's context-switch storm where ctxsw
/// concluded one in the window ([`FoldInto`]): told there, with the wait as the storm's
/// score, as long as the waits number at least half the storm's voluntary switches (a pipe
/// ping-pong at 25 000 switches/s beside two light jobs waited 19 % of its time, p50 2 us,
/// with no process holding the CPU for more than a quarter of it: the switching is the cause,
/// the wait its cost). A victim a hog starves is no handoff and keeps its own finding.
pub(crate) fn handoffs(mut f: Finding) -> Finding {
    if !waits_are_handoffs(&f) {
        return f;
    }
    let pid = f.subject.pid.unwrap_or(0);
    f.advice = "it is woken more than 10,000 times/s and each wakeup waits its turn: batch the handoffs that wake it (larger queue items, fewer wakeups per item) before changing priorities".into();
    f.next = Some(format!(
        "tracekit ctxsw --pid {pid} --threads --duration 10s"
    ));
    let (waits, wait_ns) = (
        f.ev(ev::WAKE_WAITS).unwrap_or(0.0),
        f.ev(ev::WAKE_WAIT_TOTAL_NS).unwrap_or(0.0),
    );
    let share = f.ev(WINDOW_NS).map_or(0.0, |win| wait_ns * 100.0 / win);
    f.fold = Some(Box::new(FoldInto {
        into: crate::tools::ctxsw::CTXSW_STORM,
        covers: storm_covers_waits,
        sentence: format!(
            " After its wakeups it waited {} for a CPU ({share:.1} % of the time, {} waits, p50 {}): the cost of switching this often.",
            fmt_ns(wait_ns as u64),
            waits as u64,
            fmt_ns(f.ev(ev::WAKE_P50_NS).unwrap_or(0.0) as u64),
        ),
        evidence: f
            .evidence
            .iter()
            .filter(|(n, _)| n.starts_with(ev::WAKE_PREFIX))
            .cloned()
            .collect(),
    }));
    f
}

/// A storm accounts for the waits when they number at least half its voluntary switches.
fn storm_covers_waits(storm: &Finding, waits: &Finding) -> bool {
    match (
        storm.ev(crate::tools::ctxsw::ev::VOLUNTARY_PER_S),
        storm.ev(WINDOW_NS),
        waits.ev(ev::WAKE_WAITS),
    ) {
        (Some(v), Some(win), Some(n)) => n * 2.0 >= v * win / 1e9,
        _ => false,
    }
}

/// The one finding for CPU-bound processes waiting for each other: the node (or the CPUs they
/// may run on) is saturated. Its score is the largest share a hog waited after preemptions,
/// kept below `floor` (the smallest victim score of the window): the victims it hurts rank
/// first, each naming the holder of its CPU.
fn saturation_finding(
    rows: &[RunqRow],
    hogs: &[(u32, &Acc)],
    victims: &[Victim],
    (secs, node, floor): (f64, &NodeLoad, Option<u64>),
    class: &ClassOf,
) -> Finding {
    let mut hogs: Vec<&(u32, &Acc)> = hogs.iter().collect();
    hogs.sort_by(|x, y| y.1.preempt_ns.cmp(&x.1.preempt_ns).then(x.0.cmp(&y.0)));
    let waiting: u64 = rows
        .iter()
        .filter(|r| r.id != 0)
        .map(|r| r.all.s.total_ns)
        .sum();
    let avg_waiting = waiting as f64 / (secs * 1e9);
    let named: Vec<String> = hogs
        .iter()
        .take(4)
        .map(|(_, a)| {
            format!(
                "{} waited {:.0} % of the time after preemptions",
                a.subject.text(),
                a.preempt_ns as f64 / secs / 1e7
            )
        })
        .collect();
    let psi = node
        .cpu_pressure_ppm
        .map(|p| format!(", CPU pressure {:.0} %", p as f64 / 1e4))
        .unwrap_or_default();
    let suffer = if victims.is_empty() {
        "no latency-sensitive process suffered in this window: the CPU-bound work slows only itself"
            .to_string()
    } else {
        let v: Vec<String> = victims.iter().take(3).map(|v| v.a.subject.text()).collect();
        format!("the work that suffers is {} (findings above)", v.join(", "))
    };
    // Hogs pinned to fewer CPUs than the node has saturate those CPUs, not the node.
    let mask = hogs
        .iter()
        .try_fold(0u64, |m, h| Some(m | class(h.0).cpus_allowed?));
    let all = if node.cpus >= 64 {
        u64::MAX
    } else {
        (1u64 << node.cpus) - 1
    };
    let what = match mask {
        Some(m) if m != 0 && m & all != all => {
            let cpus: Vec<String> = (0..64)
                .filter(|c| m & (1 << c) != 0)
                .map(|c| c.to_string())
                .collect();
            format!(
                "CPU {} (of {}) saturated by CPU-bound work pinned there",
                cpus.join(","),
                node.cpus
            )
        }
        _ => format!("{} CPUs saturated by CPU-bound work", node.cpus),
    };
    let summary = format!(
        "{what}: {avg_waiting:.1} tasks waited for a CPU on average{psi}; {}{}; {suffer}.",
        named.join(", "),
        if hogs.len() > 4 {
            format!(" and {} more", hogs.len() - 4)
        } else {
            String::new()
        },
    );
    let top = hogs[0];
    let mut score = (top.1.preempt_ns as f64 / secs) as u64;
    if let Some(f) = floor {
        score = score.min(f.saturating_sub(1));
    }
    let mut f = Finding {
        tool: INFO.name,
        cause: CPU_SATURATED,
        subject: Subject::named("node", format!("{} CPUs", node.cpus)),
        culprit: Some(top.1.subject.clone()),
        score: Score::NsPerS(score),
        summary,
        evidence: vec![],
        advice: "more runnable CPU-bound threads than CPUs: give latency-sensitive services the CPU first (cpu.weight, nice) and batch work less (nice 19, SCHED_IDLE, cpu.max), cut thread counts, or add CPUs".into(),
        next: Some(format!(
            "tracekit runq-lat --pid {} --threads --duration 10s",
            top.0
        )),
        fold: None,
        members: Vec::new(),
    }
    .evidence("cpus", node.cpus)
    .evidence("hog_cpus_mask", mask.unwrap_or(0))
    .evidence("waiting_total_ns", waiting)
    .evidence("hogs", hogs.len())
    .evidence("hog_preempt_wait_total_ns", top.1.preempt_ns);
    if let Some(p) = node.cpu_pressure_ppm {
        f = f.evidence("cpu_pressure_some_ppm", p);
    }
    f.evidence(WINDOW_NS, (secs * 1e9) as u64)
}
