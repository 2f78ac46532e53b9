//! One finding per service: the findings of one cause about several processes of one service
//! (same name, same cgroup and container) are told as one, ranked once.
//!
//! With real software, one incident made many findings: pgbench against PostgreSQL gave one
//! fsync finding per backend and none for "the WAL flushes", `perf bench sched messaging` 80
//! near-identical run-queue findings (issue #33). The group keeps the worst member as its
//! subject and headline (its score is the worst member's: harm is what a victim feels, not a
//! sum over victims), sums the evidence its cause declares additive ([`Cause::sums`]: calls,
//! total times), states the members' spread, and lists the members in JSON.
//!
//! Processes group by name and the start of their title rather than by executable or parent:
//! the name is what the finding shows and survives the process, and a service's workers share
//! it (postgres, nginx, php-fpm); the title's first two words tell one program's jobs apart
//! (`python3 a.py` and `python3 b.py`, or two roles of one binary run with different
//! arguments, are two), while a service that retitles its workers keeps a common start
//! (`postgres: walwriter` and `postgres: bench bench [local] COMMIT`: the leading words ending
//! in `:`, see [`family`]). The
//! cgroup and container keep two services that share a name apart. The parent is not used: it
//! is gone with the process, and unrelated jobs share one (a shell, a test harness).

use std::collections::BTreeMap;

use super::{
    findings::{Finding, Num, Score},
    render::fmt_ns,
};

/// Fewest processes told as one service.
pub const MIN_MEMBERS: usize = 2;

/// What makes findings one service's: tool, cause, process name, title family, cgroup,
/// container.
type Key = (
    &'static str,
    &'static str,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// What one service's processes share in their titles: the first two words, or, for a title
/// in setproctitle's `program: what it does` form, its leading words that end in `:` (every
/// PostgreSQL process is `postgres: walwriter` or `postgres: bench bench [local] COMMIT`
/// without a cluster name, `postgres: 15/main: …` with one; nginx's are `nginx: master
/// process …` and `nginx: worker process`). By two words the walwriter and the backends of a
/// cluster without a cluster name were two services, and the walwriter's flushes left the WAL
/// finding once the backends' titles were known.
fn family(title: Option<&str>) -> Option<String> {
    let words: Vec<&str> = title?.split_whitespace().collect();
    let labelled = words.iter().take_while(|w| w.ends_with(':')).count();
    let n = if labelled > 0 { labelled } else { 2 };
    (!words.is_empty()).then(|| words[..n.min(words.len())].join(" "))
}

fn key(f: &Finding) -> Option<Key> {
    if f.subject.kind != "process" || f.subject.pid.is_none() || !f.members.is_empty() {
        return None;
    }
    Some((
        f.tool,
        f.cause.name,
        f.subject.name.clone()?,
        family(f.subject.cmdline.as_deref()),
        f.subject.cgroup.clone(),
        f.subject.container.clone(),
    ))
}

/// Groups `findings` in place: each service's findings of one cause become one (at the place
/// of its worst), the rest stay as they are. Run after folds and links, before ranking.
pub fn group(findings: &mut Vec<Finding>) {
    let keys: Vec<Option<Key>> = findings.iter().map(key).collect();
    let mut by_key: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        let Some(k) = k else { continue };
        // A process whose title is unknown (it exited before it was read) joins its name's
        // one titled family, if there is exactly one and the two together are three or more
        // processes: one titled beside one untitled may be two roles of one binary (a test's
        // fsync loop and the writer starving it, both `tk-workload`, were merged so), while
        // PostgreSQL's exited backends beside its walwriter, or 386 exited benchmark tasks
        // beside 14 live ones, are one service.
        let k = match &k.3 {
            Some(_) => k.clone(),
            None => {
                let (titled, untitled): (Vec<&Key>, Vec<&Key>) = keys
                    .iter()
                    .flatten()
                    .filter(|o| same_service(o, k))
                    .partition(|o| o.3.is_some());
                match titled.first() {
                    Some(first)
                        if titled.len() + untitled.len() >= 3
                            && titled.iter().all(|o| o.3 == first.3) =>
                    {
                        (*first).clone()
                    }
                    _ => k.clone(),
                }
            }
        };
        by_key.entry(k).or_default().push(i);
    }
    let mut gone = vec![false; findings.len()];
    for idx in by_key.into_values().filter(|v| v.len() >= MIN_MEMBERS) {
        let mut idx = idx;
        idx.sort_by(|a, b| worse(&findings[*b], &findings[*a]));
        let members: Vec<Finding> = idx.iter().map(|i| findings[*i].clone()).collect();
        findings[idx[0]] = merged(members);
        for i in &idx[1..] {
            gone[*i] = true;
        }
    }
    let mut i = 0;
    findings.retain(|_| {
        i += 1;
        !gone[i - 1]
    });
}

/// Adds to `kept` those of `below` (findings a tool judged too small alone) whose service has a
/// finding in `kept`, so the service's group counts all of its processes: PostgreSQL's
/// walwriter flushing twice in a window belongs with the backends' 8,711 flushes when the
/// group is compared with `pg_stat_wal` (8,713).
pub fn with_service(kept: &mut Vec<Finding>, below: Vec<Finding>) {
    let keys: Vec<Key> = kept.iter().filter_map(key).collect();
    kept.extend(
        below
            .into_iter()
            .filter(|f| key(f).is_some_and(|k| keys.iter().any(|o| same_service(o, &k)))),
    );
}

/// One service's keys: all parts equal, the title family too unless one side has none (a
/// process that exited before its title was read).
fn same_service(a: &Key, b: &Key) -> bool {
    (a.0, a.1, &a.2, &a.4, &a.5) == (b.0, b.1, &b.2, &b.4, &b.5)
        && (a.3 == b.3 || a.3.is_none() || b.3.is_none())
}

fn worse(a: &Finding, b: &Finding) -> std::cmp::Ordering {
    let k = |f: &Finding| match f.score {
        Score::NsPerS(v) => (1, v as f64),
        Score::RatePerS(v) => (0, v),
    };
    let (ka, kb) = (k(a), k(b));
    ka.0.cmp(&kb.0)
        .then(ka.1.total_cmp(&kb.1))
        .then(b.subject.pid.cmp(&a.subject.pid))
}

fn num(v: Num) -> f64 {
    match v {
        Num::U(x) => x as f64,
        Num::I(x) => x as f64,
        Num::F(x) => x,
    }
}

/// The worst member with the group's sums, spread and member list.
fn merged(members: Vec<Finding>) -> Finding {
    let n = members.len();
    let mut head = members[0].clone();
    let sums = head.cause.sums;
    // Rates add up across members (switches per second of the service); times lost are felt
    // per process: the worst stays.
    if let Score::RatePerS(_) = head.score {
        let total: f64 = members
            .iter()
            .map(|m| match m.score {
                Score::RatePerS(r) => r,
                Score::NsPerS(_) => 0.0,
            })
            .sum();
        head.score = Score::RatePerS(total);
    }
    let mut summed = Vec::new();
    for (k, v) in head.evidence.iter_mut() {
        if !sums.contains(k) {
            continue;
        }
        let total: f64 = members
            .iter()
            .filter_map(|m| {
                m.evidence
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, x)| num(*x))
            })
            .sum();
        *v = match v {
            Num::F(_) => Num::F(total),
            Num::I(_) => Num::I(total as i64),
            Num::U(_) => Num::U(total.max(0.0) as u64),
        };
        summed.push(if k.ends_with("_ns") {
            format!("{} {}", k.trim_end_matches("_ns"), fmt_ns(total as u64))
        } else {
            format!("{k} {total:.0}")
        });
    }
    let pids: Vec<String> = members
        .iter()
        .filter_map(|m| m.subject.pid)
        .take(8)
        .map(|p| p.to_string())
        .collect();
    let more = if n > pids.len() {
        format!(" and {} more", n - pids.len())
    } else {
        String::new()
    };
    let spread = spread(&members);
    let name = head.subject.name.clone().unwrap_or_default();
    let together = if summed.is_empty() {
        String::new()
    } else {
        format!("; together: {}", summed.join(", "))
    };
    head.summary = format!(
        "{n} {name} processes (pids {}{more}) share this{together}; {spread}. The worst: {}",
        pids.join(", "),
        head.summary
    );
    head = head.evidence("members", n);
    head.members = members.into_iter().map(|m| (m.subject, m.score)).collect();
    head
}

/// The members' scores, least to most: `each lost 3.1–9.9 % of its time (median 6.2 %)`.
fn spread(members: &[Finding]) -> String {
    let mut ns: Vec<u64> = members
        .iter()
        .filter_map(|m| match m.score {
            Score::NsPerS(v) => Some(v),
            Score::RatePerS(_) => None,
        })
        .collect();
    if ns.len() == members.len() {
        ns.sort_unstable();
        let pct = |v: u64| v as f64 / 1e7;
        return format!(
            "each lost {:.1}–{:.1} % of its time (median {:.1} %)",
            pct(ns[0]),
            pct(ns[ns.len() - 1]),
            pct(ns[ns.len() / 2])
        );
    }
    let mut r: Vec<f64> = members
        .iter()
        .map(|m| match m.score {
            Score::RatePerS(v) => v,
            Score::NsPerS(_) => 0.0,
        })
        .collect();
    r.sort_by(f64::total_cmp);
    format!(
        "each at {:.0}–{:.0}/s (median {:.0}/s)",
        r[0],
        r[r.len() - 1],
        r[r.len() / 2]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::findings::{Cause, Subject};

    const FSYNC: Cause = Cause::new("fsync", "t").summing(&["calls", "total_ns"]);

    fn backend(pid: u32, ns_per_s: u64, calls: u64, cgroup: &str) -> Finding {
        let mut s = Subject::process(pid, "postgres");
        s.cgroup = Some(cgroup.into());
        s.cmdline = Some(if pid == 100 {
            "postgres: 15/main: walwriter".into()
        } else {
            format!(
                "postgres: 15/main: bench bench [local] {}",
                if pid.is_multiple_of(2) {
                    "COMMIT"
                } else {
                    "idle"
                }
            )
        });
        Finding::new(
            "fsync-lat",
            FSYNC,
            s,
            Score::NsPerS(ns_per_s),
            format!("postgres spent {ns_per_s} ns/s in fsync."),
        )
        .evidence("calls", calls)
        .evidence("total_ns", ns_per_s * 10)
        .evidence("p99_ns", 1_000 + u64::from(pid))
    }

    #[test]
    fn title_families() {
        let fam = |t: &str| family(Some(t)).unwrap();
        assert_eq!(
            fam("postgres: walwriter"),
            fam("postgres: bench bench [local] COMMIT")
        );
        assert_eq!(fam("postgres: 15/main: walwriter"), "postgres: 15/main:");
        assert_ne!(
            fam("postgres: 15/main: walwriter"),
            fam("postgres: 16/main: walwriter")
        );
        assert_eq!(
            fam("nginx: worker process"),
            fam("nginx: master process /usr/sbin/nginx")
        );
        assert_ne!(fam("python3 a.py"), fam("python3 b.py"));
        assert_eq!(fam("dd"), "dd");
        assert_eq!(family(Some("  ")), None);
    }

    /// pgbench against PostgreSQL: 8 backends and the walwriter, one fsync finding each, and
    /// another service's postgres in another cgroup.
    #[test]
    fn a_services_findings_are_one_with_sums_and_spread() {
        let cg = "/system.slice/postgresql@15-main.service";
        let mut f: Vec<Finding> = (0..9)
            .map(|i| {
                backend(
                    100 + i,
                    50_000_000 + u64::from(i) * 10_000_000,
                    2_000 + u64::from(i) * 100,
                    cg,
                )
            })
            .collect();
        f.push(backend(900, 400_000_000, 7, "/other.slice"));
        f.push(Finding::new(
            "net-rx",
            Cause::new("net-drops", "t"),
            Subject::named("system", "NETFILTER_DROP"),
            Score::RatePerS(5.0),
            "drops".into(),
        ));
        group(&mut f);
        assert_eq!(f.len(), 3, "{f:#?}");
        let g = f.iter().find(|x| x.members.len() == 9).expect("one group");
        assert_eq!(g.subject.pid, Some(108), "the worst is the subject");
        assert_eq!(
            g.score,
            Score::NsPerS(130_000_000),
            "the worst's, not a sum"
        );
        assert_eq!(
            g.ev("calls"),
            Some((0..9).map(|i| 2_000.0 + i as f64 * 100.0).sum())
        );
        assert_eq!(g.ev("p99_ns"), Some(1_108.0), "the worst's percentile");
        assert_eq!(g.ev("members"), Some(9.0));
        assert!(
            g.summary.starts_with("9 postgres processes (pids 108, 107"),
            "{}",
            g.summary
        );
        assert!(
            g.summary.contains("each lost 5.0–13.0 % of its time"),
            "{}",
            g.summary
        );
        assert!(g.summary.contains("calls 21600"), "{}", g.summary);
        assert_eq!(g.json()["members"].as_array().unwrap().len(), 9);
        // The other cgroup's postgres stays on its own.
        assert!(f
            .iter()
            .any(|x| x.subject.pid == Some(900) && x.members.is_empty()));
        // Grouping twice changes nothing.
        let again = f.clone();
        group(&mut f);
        assert_eq!(f, again);
    }

    #[test]
    fn small_members_join_only_a_service_with_a_finding() {
        let cg = "/pg";
        let mut kept = vec![
            backend(101, 60_000_000, 1_000, cg),
            backend(102, 50_000_000, 900, cg),
        ];
        let mut walwriter = backend(100, 100, 2, cg);
        // The backends exited before their titles were read; the walwriter has its own.
        for k in &mut kept {
            k.subject.cmdline = None;
        }
        walwriter.subject.cmdline = Some("postgres: 15/main: walwriter".into());
        let below = vec![walwriter, backend(300, 100, 3, "/other")];
        with_service(&mut kept, below);
        assert_eq!(kept.len(), 3);
        group(&mut kept);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].ev("calls"), Some(1_902.0));
        assert_eq!(kept[0].members.len(), 3);
    }

    #[test]
    fn rates_add_up_and_one_process_is_no_group() {
        let storm = |pid: u32, r: f64| {
            Finding::new(
                "ctxsw",
                Cause::new("ctxsw-storm", "t"),
                Subject::process(pid, "sched-messaging"),
                Score::RatePerS(r),
                "switched.".into(),
            )
        };
        let mut f = vec![storm(1, 1000.0), storm(2, 3000.0), storm(3, 2000.0)];
        group(&mut f);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].score, Score::RatePerS(6000.0));
        assert!(
            f[0].summary.contains("each at 1000–3000/s (median 2000/s)"),
            "{}",
            f[0].summary
        );
        let mut one = vec![storm(1, 1000.0)];
        group(&mut one);
        assert!(one[0].members.is_empty());
        // One binary in two roles (a test's victim and an innocent beside it): two jobs.
        let titled = |pid: u32, t: &str| {
            let mut f = storm(pid, 10.0);
            f.subject.cmdline = Some(t.into());
            f
        };
        let mut two = vec![
            titled(1, "/usr/bin/tk-workload sleeper 1"),
            titled(2, "/usr/bin/tk-workload triage-duty 14000"),
        ];
        group(&mut two);
        assert_eq!(two.len(), 2);
        // An exited member without a title joins its name's one titled family.
        let mut some = vec![
            titled(1, "perf bench sched messaging -g 10"),
            titled(2, "perf bench sched messaging -g 10"),
            storm(3, 10.0),
        ];
        group(&mut some);
        assert_eq!(some.len(), 1, "{some:#?}");
        assert_eq!(some[0].members.len(), 3);
        // One titled and one untitled: maybe two roles, not grouped.
        let mut pair = vec![
            titled(1, "/usr/bin/tk-workload memcg-writer /sys/fs/cgroup/x"),
            storm(2, 10.0),
        ];
        group(&mut pair);
        assert_eq!(pair.len(), 2, "{pair:#?}");
    }
}
