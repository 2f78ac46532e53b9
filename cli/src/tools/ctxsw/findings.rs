//! ctxsw's findings: a process whose switch rate is a storm, between its own threads or
//! driven by others, with the preemptor that drives it.

use super::*;

/// A storm is "between its own threads" when most of its measured wakeups came from them.
const OWN_SHARE: f64 = 0.5;

/// One finding per process whose switch rate makes it a storm, most switches first.
pub(super) fn findings(rows: &[CtxswRow], secs: f64, pairs: &[sched::Pair]) -> Vec<Finding> {
    let me = std::process::id();
    // Per process: switches, voluntary, own wakeups, wake waits measured, who, run-queue
    // wait, and its life in the window (the span of its threads' lives).
    type Per = (u64, u64, u64, u64, Subject, u64, (u64, u64));
    let mut per: std::collections::BTreeMap<u32, Per> = Default::default();
    for r in rows
        .iter()
        .filter(|r| r.id != 0 && r.who.pid != me && r.who.processes.is_none())
    {
        let e = per
            .entry(r.who.pid)
            .or_insert_with(|| (0, 0, 0, 0, r.who.subject(), 0, r.alive));
        e.0 += r.voluntary + r.involuntary;
        e.1 += r.voluntary;
        e.2 += r.own_wakeups;
        e.3 += r.woken;
        e.5 += r.runq_total_ns;
        e.6 = (e.6 .0.min(r.alive.0), e.6 .1.max(r.alive.1));
    }
    let window_ns = (secs * 1e9) as u64;
    let mut out = Vec::new();
    for (pid, (sw, vol, own, woken, subject, wait_ns, alive)) in per {
        let alive_ns = (alive.1 - alive.0).min(window_ns);
        let life = sched::rate_secs(alive_ns, secs);
        let rate_s = sw as f64 / life;
        if rate_s < STORM_PER_S {
            continue;
        }
        let invol = sw - vol;
        // The preemptors of its rows, by process, its own threads apart.
        let mut by: std::collections::BTreeMap<u32, u64> = Default::default();
        for p in pairs.iter().filter(|p| p.a_tgid == pid) {
            *by.entry(p.b_tgid).or_default() += p.count;
        }
        let own_pre = by.remove(&pid).unwrap_or(0);
        let top = by.iter().max_by_key(|(_, n)| **n).map(|(p, n)| (*p, *n));
        let own_share = if woken > 0 {
            own as f64 / woken as f64
        } else {
            0.0
        };
        let between_own = own_share >= OWN_SHARE || (invol > 0 && own_pre * 2 >= invol);
        let vol_pct = vol as f64 * 100.0 / sw.max(1) as f64;
        // Part of the window only: say so, or a 12 s storm in a 15 s window reads as 20 %
        // lower than the process switched.
        let lived = if alive_ns * 20 < window_ns * 19 {
            format!(
                " while alive ({} of the {} window)",
                fmt_ns(alive_ns),
                fmt_ns(window_ns)
            )
        } else {
            String::new()
        };
        let mut summary = format!(
            "{} switched {:.0} times/s{lived} ({vol_pct:.0} % voluntary, {:.0} % involuntary)",
            subject.text(),
            rate_s,
            100.0 - vol_pct
        );
        if between_own {
            summary.push_str(&format!(
                "; the switches are between its own threads ({:.0} % of its wakeups came from them{})",
                own_share * 100.0,
                if invol > 0 {
                    format!(", {:.0} % of its preemptions by them", own_pre as f64 * 100.0 / invol as f64)
                } else {
                    String::new()
                }
            ));
        }
        let culprit = top.filter(|(_, n)| *n * 4 >= invol.max(1) && invol * 2 >= sw);
        // The preemptor as this window's rows knew it (its comm from the kernel, so a process
        // that exited before the window was read keeps its name), else as /proc knows it now.
        let culprit_subject = culprit.map(|(cp, _)| {
            rows.iter()
                .find(|r| r.who.pid == cp && r.who.processes.is_none())
                .map(|r| r.who.subject())
                .unwrap_or_else(|| {
                    let name = crate::host::proc::comm(cp)
                        .map(|c| sanitize::text(&c))
                        .unwrap_or_else(|| if cp == 0 { "[idle]" } else { "[exited]" }.into());
                    Subject::process(cp, name)
                })
        });
        if let (Some((_, n)), Some(c)) = (culprit, &culprit_subject) {
            summary.push_str(&format!("; preempted most by {}, {n} times", c.text()));
        }
        summary.push('.');
        // What the storm costs it, on the harm scale of every stall: each switch is a wait for
        // a CPU (the handoff's wakeup, or the preemption), so a storm that waits at least
        // `MIN_NS_PER_S` ranks by that time beside the stalls instead of after them.
        let wait_per_s = (wait_ns as f64 / secs) as u64;
        let timed = wait_per_s >= crate::report::harm::MIN_NS_PER_S;
        if timed {
            summary.push_str(&format!(
                " Around its switches it waited {} for a CPU ({:.1} % of its time): the cost of switching this often.",
                crate::report::render::fmt_ns(wait_ns),
                wait_ns as f64 * 100.0 / (life * 1e9)
            ));
        }
        let advice = if vol * 2 >= sw {
            "its threads hand work to each other one item at a time: batch the handoffs (larger queue items, fewer wakeups per item, a short spin before sleeping), or do producer and consumer work in one thread"
        } else {
            "it is preempted: more runnable threads than CPUs; cut its thread count or CPU quota, lower its neighbours' priority (nice, cpu.weight), or give it its own CPUs"
        };
        let mut f = Finding {
            tool: INFO.name,
            cause: CTXSW_STORM,
            subject,
            culprit: culprit_subject,
            score: if timed {
                Score::NsPerS(wait_per_s)
            } else {
                Score::RatePerS((rate_s * 10.0).round() / 10.0)
            },
            summary,
            evidence: vec![],
            advice: advice.into(),
            next: Some(format!(
                "tracekit ctxsw --pid {pid} --threads --duration 10s"
            )),
            fold: None,
            members: Vec::new(),
        }
        .evidence("alive_ns", alive_ns)
        .evidence("switches_per_s", per_s(sw, life))
        .evidence(ev::VOLUNTARY_PER_S, per_s(vol, life))
        .evidence("involuntary_per_s", per_s(invol, life))
        .evidence("own_wakeup_ppm", (own_share * 1e6).round() as u64)
        .evidence("own_preemptions", own_pre)
        .evidence("runq_total_ns", wait_ns);
        if let Some((_, n)) = culprit {
            f = f.evidence("culprit_preemptions", n);
        }
        out.push(f.evidence(crate::report::findings::WINDOW_NS, (secs * 1e9) as u64));
    }
    rank(&mut out);
    out
}
