//! Findings: what a tool concludes, in one type every tool, `triage` and the exporter share.
//!
//! A finding names a subject (a process, cgroup, device, CPU, node, socket), the cause in words
//! with the evidence as named numbers from this window, the fix, and the command to run next.
//! Its score ranks it against findings of other tools: time lost per second of wall time where
//! it is a stall (a process that spent 9.4 s of 10 s in fsync scores 940 ms/s), a rate where it
//! is not (drops per second).

use serde::Serialize;
use serde_json::{json, Map, Value};

/// What kind of culprit a finding is about (the `cause` key of triage's JSON). Each tool
/// declares the causes it concludes as constants beside its findings and lists them in its
/// [`ToolInfo`](crate::tools::ToolInfo); [`crate::tools::causes`] is the one list (the README's
/// table of causes is generated from it).
#[derive(Clone, Copy, Debug)]
pub struct Cause {
    /// The JSON name (`thp-compaction`): kebab-case, unique across tools.
    pub name: &'static str,
    /// What it means, in one sentence (the README's table).
    pub means: &'static str,
    /// Evidence that adds up across the processes of one service (calls, total times, rates),
    /// summed when [`group`](crate::report::group::group) tells them as one finding; other
    /// evidence (percentiles, maxima) is the worst member's.
    pub sums: &'static [&'static str],
}

impl Cause {
    pub const fn new(name: &'static str, means: &'static str) -> Cause {
        Cause {
            name,
            means,
            sums: &[],
        }
    }

    /// The evidence that adds up across a service's processes (see [`Cause::sums`]).
    pub const fn summing(mut self, sums: &'static [&'static str]) -> Cause {
        self.sums = sums;
        self
    }

    pub fn as_str(self) -> &'static str {
        self.name
    }
}

// A cause is its name: two tools naming one cause (memstall's and the node check's
// `memcg-limit`) mean the same thing.
impl PartialEq for Cause {
    fn eq(&self, o: &Cause) -> bool {
        self.name == o.name
    }
}
impl Eq for Cause {}
impl PartialOrd for Cause {
    fn partial_cmp(&self, o: &Cause) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cause {
    fn cmp(&self, o: &Cause) -> std::cmp::Ordering {
        self.name.cmp(o.name)
    }
}
impl std::hash::Hash for Cause {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.name.hash(h)
    }
}
impl Serialize for Cause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name)
    }
}

/// Who or what a finding is about.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Subject {
    /// `process`, `thread`, `cgroup`, `container`, `device`, `cpu`, `node`, `socket`, `system`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// Display name, already sanitised for text (comm, `vda`, `cpu0`, `udp :5140`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Kubernetes: the pod and namespace of the container (set with it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The process title (`postgres: walwriter`), shown beside the name in text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
}

impl Subject {
    pub fn process(pid: u32, comm: impl Into<String>) -> Subject {
        Subject {
            kind: "process",
            pid: Some(pid),
            name: Some(comm.into()),
            ..Default::default()
        }
    }

    pub fn named(kind: &'static str, name: impl Into<String>) -> Subject {
        Subject {
            kind,
            name: Some(name.into()),
            ..Default::default()
        }
    }

    pub fn with_cgroup(mut self, cgroup: Option<String>) -> Subject {
        self.cgroup = cgroup;
        self
    }

    /// `postgres [postgres: walwriter] (pid 4711)`, `vda`, `CPU 0`.
    pub fn text(&self) -> String {
        let title = self
            .cmdline
            .as_deref()
            .map(|t| {
                let comm = self.name.as_deref().unwrap_or("").as_bytes();
                crate::report::sanitize::bracket_beside(comm, t.as_bytes())
            })
            .unwrap_or_default();
        let name = format!("{}{title}", self.name.as_deref().unwrap_or("?"));
        let name = name.as_str();
        let who = match (self.pid, self.tid) {
            (_, Some(t)) => format!("{name} (tid {t})"),
            (Some(p), None) => format!("{name} (pid {p})"),
            _ => name.to_string(),
        };
        match (&self.container, self.kind) {
            (Some(c), "process" | "thread") => {
                format!(
                    "{who} in container {}",
                    crate::report::sanitize::text(c.as_bytes())
                )
            }
            _ => who,
        }
    }
}

/// How much a finding matters, in a unit that ranks across tools.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Score {
    /// Time the subject lost per second of wall time (ns/s; 1e9 = all of its time).
    NsPerS(u64),
    /// Events per second (drops, migrations) where time lost is not measurable.
    RatePerS(f64),
}

impl Score {
    /// The time score (0 for a rate).
    pub fn ns_per_s(&self) -> u64 {
        match *self {
            Score::NsPerS(v) => v,
            Score::RatePerS(_) => 0,
        }
    }

    /// Ordering key: every time score ranks above every rate score; larger first.
    fn key(&self) -> (u8, f64) {
        match *self {
            Score::NsPerS(v) => (1, v as f64),
            Score::RatePerS(v) => (0, v),
        }
    }
}

/// A number in the evidence, kept exact: integers stay integers in JSON.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    U(u64),
    I(i64),
    F(f64),
}

impl From<u64> for Num {
    fn from(v: u64) -> Num {
        Num::U(v)
    }
}
impl From<u32> for Num {
    fn from(v: u32) -> Num {
        Num::U(v.into())
    }
}
impl From<i64> for Num {
    fn from(v: i64) -> Num {
        Num::I(v)
    }
}
impl From<f64> for Num {
    fn from(v: f64) -> Num {
        Num::F(v)
    }
}
impl From<usize> for Num {
    fn from(v: usize) -> Num {
        Num::U(v as u64)
    }
}

impl Num {
    fn json(self) -> Value {
        match self {
            Num::U(v) => v.into(),
            Num::I(v) => v.into(),
            Num::F(v) => json!(v),
        }
    }
}

/// The name of an evidence number. A key another part of tracekit reads (triage folding
/// runq-lat's waits into ctxsw's storm) is a constant beside the tool that writes it, so a
/// rename is one edit the compiler follows; keys only people read may stay literals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ev(pub &'static str);

impl From<&'static str> for Ev {
    fn from(s: &'static str) -> Ev {
        Ev(s)
    }
}

/// The window the finding's numbers cover, in ns: every tool's findings carry it.
pub const WINDOW_NS: Ev = Ev("window_ns");

/// A finding that is the cost of another finding about the same process, to be told once:
/// runq-lat's waits after the wakeups of a context-switch storm are what the switching costs.
/// The tool that concludes the cost declares it; [`fold`] merges it into the other finding
/// where one of cause `into` about the same pid was concluded in the window and
/// `covers(that, this)` holds, and otherwise it stands on its own.
#[derive(Clone, Debug)]
pub struct FoldInto {
    pub into: Cause,
    /// Whether the other finding accounts for this one (enough switches for these waits).
    pub covers: fn(into: &Finding, this: &Finding) -> bool,
    /// Added to the other finding's summary when it had only a rate to rank by.
    pub sentence: String,
    /// Evidence the other finding takes over.
    pub evidence: Vec<(&'static str, Num)>,
}

// `covers` is code, not data: two declarations are the same fold when they say the same.
impl PartialEq for FoldInto {
    fn eq(&self, o: &FoldInto) -> bool {
        self.into == o.into && self.sentence == o.sentence && self.evidence == o.evidence
    }
}

/// One verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The tool that concluded it.
    pub tool: &'static str,
    pub cause: Cause,
    /// The victim (who lost time), or the thing at fault when nobody in particular waited.
    pub subject: Subject,
    /// Someone else who caused it (the noisy neighbour), when known.
    pub culprit: Option<Subject>,
    pub score: Score,
    /// The verdict in one or two sentences, citing its numbers.
    pub summary: String,
    /// The numbers it rests on, by name (units in the names: `_ns`, `_per_s`, `_ppm`).
    pub evidence: Vec<(&'static str, Num)>,
    /// What to do about it.
    pub advice: String,
    /// The command to look closer (`tracekit memstall --pid 4711 --duration 30s`).
    pub next: Option<String>,
    /// Where this finding is another's cost, told within that one ([`fold`]).
    pub fold: Option<Box<FoldInto>>,
    /// The processes of one service told as this one finding, worst first (the subject is the
    /// worst), with each one's own score; empty for a finding about one subject.
    pub members: Vec<(Subject, Score)>,
}

pub use super::harm::MIN_NS_PER_S;

impl Finding {
    /// Ranks this finding just below a victim's whose score is `victim`: a culprit's own
    /// finding, or its cause seen from the other side, is that victim's harm told again. A
    /// rate, or a score already below, stays.
    pub fn rank_below(&mut self, victim: Score) {
        if let (Score::NsPerS(v), Score::NsPerS(c)) = (victim, self.score) {
            if c >= v {
                self.score = Score::NsPerS(v.saturating_sub(1));
            }
        }
    }

    /// A finding with no culprit, evidence, advice or next command yet (add them after).
    pub fn new(
        tool: &'static str,
        cause: Cause,
        subject: Subject,
        score: Score,
        summary: String,
    ) -> Finding {
        Finding {
            tool,
            cause,
            subject,
            culprit: None,
            score,
            summary,
            evidence: Vec::new(),
            advice: String::new(),
            next: None,
            fold: None,
            members: Vec::new(),
        }
    }

    pub fn evidence(mut self, name: impl Into<Ev>, v: impl Into<Num>) -> Finding {
        self.evidence.push((name.into().0, v.into()));
        self
    }

    /// The evidence number called `name`, as a float, when the finding has it.
    pub fn ev(&self, name: impl Into<Ev>) -> Option<f64> {
        let name = name.into().0;
        self.evidence
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| match *v {
                Num::U(x) => x as f64,
                Num::I(x) => x as f64,
                Num::F(x) => x,
            })
    }

    /// The NDJSON line (without the common keys the engine adds: `tool`, `type`, interval).
    pub fn json(&self) -> Value {
        let mut m = Map::new();
        m.insert("cause".into(), self.cause.as_str().into());
        m.insert(
            "subject".into(),
            serde_json::to_value(&self.subject).unwrap_or_default(),
        );
        if let Some(p) = self.subject.pid {
            m.insert("pid".into(), p.into());
        }
        if let (Some(n), "process" | "thread") = (&self.subject.name, self.subject.kind) {
            m.insert("comm".into(), n.clone().into());
        }
        if let Some(t) = &self.subject.cmdline {
            m.insert("cmdline".into(), t.clone().into());
        }
        if let Some(c) = &self.subject.cgroup {
            m.insert("cgroup".into(), c.clone().into());
        }
        if let Some(c) = &self.subject.container {
            m.insert("container".into(), c.clone().into());
        }
        match self.score {
            Score::NsPerS(v) => m.insert("score_ns_per_s".into(), v.into()),
            Score::RatePerS(v) => m.insert("rate_per_s".into(), json!(v)),
        };
        if let Some(c) = &self.culprit {
            if let Some(p) = c.pid {
                m.insert("culprit_pid".into(), p.into());
            }
            if let Some(n) = &c.name {
                m.insert("culprit_comm".into(), n.clone().into());
            }
            m.insert(
                "culprit".into(),
                serde_json::to_value(c).unwrap_or_default(),
            );
        }
        let ev: Map<String, Value> = self
            .evidence
            .iter()
            .map(|(k, v)| (k.to_string(), v.json()))
            .collect();
        m.insert("evidence".into(), Value::Object(ev));
        m.insert("summary".into(), self.summary.clone().into());
        m.insert("advice".into(), self.advice.clone().into());
        if let Some(n) = &self.next {
            m.insert("next".into(), n.clone().into());
        }
        if !self.members.is_empty() {
            let members: Vec<Value> = self
                .members
                .iter()
                .map(|(s, score)| {
                    let mut v = serde_json::to_value(s).unwrap_or_default();
                    match *score {
                        Score::NsPerS(x) => v["score_ns_per_s"] = x.into(),
                        Score::RatePerS(x) => v["rate_per_s"] = json!(x),
                    }
                    v
                })
                .collect();
            m.insert("members".into(), members.into());
        }
        Value::Object(m)
    }

    /// Text: the summary, the fix and the next command, wrapped under a bullet.
    pub fn text(&self, bullet: &str) -> String {
        let mut s = format!("{bullet}{}", self.summary);
        if !self.advice.is_empty() {
            s.push_str(&format!(
                "\n{}Fix: {}",
                " ".repeat(bullet.chars().count()),
                self.advice
            ));
        }
        if let Some(n) = &self.next {
            s.push_str(&format!(
                "\n{}Next: {n}",
                " ".repeat(bullet.chars().count())
            ));
        }
        s
    }
}

/// Folds every finding that declares itself another's cost ([`FoldInto`]) into that finding,
/// where the window has it: the other keeps the larger time score (taking this one's when it
/// ranked by a rate, with the sentence saying so) and this one's evidence, and this one goes.
pub fn fold(f: &mut Vec<Finding>) {
    let mut gone = Vec::new();
    for i in 0..f.len() {
        let (Some(into), Some(pid)) = (f[i].fold.clone(), f[i].subject.pid) else {
            continue;
        };
        let this = &f[i];
        let Some(t) = f.iter().position(|x| {
            x.cause == into.into
                && x.subject.pid == Some(pid)
                && !std::ptr::eq(x, this)
                && (into.covers)(x, this)
        }) else {
            continue;
        };
        let score = f[i].score;
        let target = &mut f[t];
        match (target.score, score) {
            (Score::NsPerS(own), Score::NsPerS(cost)) => {
                target.score = Score::NsPerS(own.max(cost))
            }
            (Score::RatePerS(_), Score::NsPerS(_)) => {
                target.score = score;
                target.summary.push_str(&into.sentence);
            }
            (_, Score::RatePerS(_)) => {}
        }
        target.evidence.extend(into.evidence);
        gone.push(i);
    }
    let mut i = 0;
    f.retain(|_| {
        i += 1;
        !gone.contains(&(i - 1))
    });
}

/// Most harmful first: time lost per second above rates, then larger first; ties by tool,
/// cause and subject so the order is stable.
pub fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        let (ka, kb) = (a.score.key(), b.score.key());
        kb.0.cmp(&ka.0)
            .then(kb.1.total_cmp(&ka.1))
            .then(a.tool.cmp(b.tool))
            .then(a.cause.cmp(&b.cause))
            .then(a.subject.pid.cmp(&b.subject.pid))
            .then(a.subject.name.cmp(&b.subject.name))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const FSYNC: Cause = Cause::new("fsync", "t");
    const NET_DROPS: Cause = Cause::new("net-drops", "t");
    const RUNQ_DELAY: Cause = Cause::new("runq-delay", "t");

    fn f(cause: Cause, score: Score, pid: u32) -> Finding {
        Finding {
            tool: "t",
            cause,
            subject: Subject::process(pid, "p"),
            culprit: None,
            score,
            summary: "s".into(),
            evidence: vec![],
            advice: String::new(),
            next: None,
            fold: None,
            members: Vec::new(),
        }
    }

    #[test]
    fn ranks_time_before_rates_then_by_size() {
        let mut v = vec![
            f(NET_DROPS, Score::RatePerS(1e6), 1),
            f(FSYNC, Score::NsPerS(10_000_000), 2),
            f(RUNQ_DELAY, Score::NsPerS(900_000_000), 3),
            f(NET_DROPS, Score::RatePerS(5.0), 4),
        ];
        rank(&mut v);
        let pids: Vec<u32> = v.iter().map(|x| x.subject.pid.unwrap()).collect();
        assert_eq!(pids, [3, 2, 1, 4]);
    }

    #[test]
    fn json_keys_are_flat_integers_and_named() {
        let mut x = f(RUNQ_DELAY, Score::NsPerS(123), 7)
            .evidence("waits", 5u64)
            .evidence("share_ppm", 250_000u64)
            .evidence("ratio", 0.5);
        x.culprit = Some(Subject::process(9, "hog"));
        x.next = Some("tracekit runq-lat --pid 7".into());
        let j = x.json();
        assert_eq!(j["cause"], "runq-delay");
        assert_eq!(j["pid"], 7);
        assert_eq!(j["score_ns_per_s"], 123);
        assert_eq!(j["culprit_pid"], 9);
        assert_eq!(j["culprit_comm"], "hog");
        assert_eq!(j["evidence"]["waits"], 5);
        assert!(j["evidence"]["waits"].is_u64());
        assert_eq!(j["evidence"]["ratio"], 0.5);
        assert_eq!(j["next"], "tracekit runq-lat --pid 7");
        assert_eq!(j["subject"]["kind"], "process");
        let r = f(NET_DROPS, Score::RatePerS(2.5), 1).json();
        assert_eq!(r["rate_per_s"], 2.5);
        assert!(r.get("score_ns_per_s").is_none());
    }

    #[test]
    fn text_has_fix_and_next_indented() {
        let mut x = f(FSYNC, Score::NsPerS(1), 1);
        x.summary = "postgres waited".into();
        x.advice = "batch commits".into();
        x.next = Some("tracekit fsync-lat --by-file".into());
        assert_eq!(
            x.text("1. "),
            "1. postgres waited\n   Fix: batch commits\n   Next: tracekit fsync-lat --by-file"
        );
        assert_eq!(Subject::named("device", "vda").text(), "vda");
        assert_eq!(Subject::process(4, "x").text(), "x (pid 4)");
    }
}
