//! `profile --pprof FILE`: the run's samples as gzip-compressed `profile.proto`
//! (github.com/google/pprof, `proto/profile.proto`), the format `go tool pprof`, Pyroscope and
//! Grafana read. The messages are declared here with their field numbers from that schema and
//! encoded by `prost`; only the fields tracekit fills are declared (a decoder skips the rest).
//!
//! What the file holds: one sample per (stack, process or thread) with its count and, on-CPU,
//! its CPU time (count × the sampling period); a location per (function, module), whose one
//! line names the function; a mapping per module (the binary, `[kernel]` for kernel frames).
//! The resolver keeps names, not addresses, so locations carry no address and mappings no
//! address range or build id.

use std::collections::HashMap;

use prost::Message;

use super::stacks::Sample;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<PSample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PSample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// The source line (Python frames), 0 when not known.
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// What a sample's values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// On-CPU samples taken every `period_ns` of a CPU's time: `samples/count`, `cpu/nanoseconds`.
    Cpu { period_ns: i64 },
    /// Off-CPU: each stack's blocked time, `off_cpu/nanoseconds`.
    OffCpu,
}

/// The run's profile, built up window by window.
pub struct Builder {
    kind: Kind,
    strings: Vec<String>,
    string_ix: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    mappings: HashMap<i64, u64>,
    locations: HashMap<(u64, u64, u32), u64>,
    /// (locations leaf first, row id, tgid, comm) → count.
    samples: HashMap<(Vec<u64>, u32, u32, i64), u64>,
    profile: Profile,
    threads: bool,
}

impl Builder {
    pub fn new(kind: Kind, threads: bool) -> Builder {
        let mut b = Builder {
            kind,
            strings: Vec::new(),
            string_ix: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
            profile: Profile::default(),
            threads,
        };
        // The string table starts with "" (index 0 is the empty string by definition).
        b.string("");
        let vt = |b: &mut Builder, t: &str, u: &str| ValueType {
            r#type: b.string(t),
            unit: b.string(u),
        };
        match kind {
            Kind::Cpu { period_ns } => {
                let types = vec![
                    vt(&mut b, "samples", "count"),
                    vt(&mut b, "cpu", "nanoseconds"),
                ];
                b.profile.sample_type = types;
                b.profile.period_type = Some(vt(&mut b, "cpu", "nanoseconds"));
                b.profile.period = period_ns;
            }
            Kind::OffCpu => {
                b.profile.sample_type = vec![vt(&mut b, "off_cpu", "nanoseconds")];
                b.profile.period_type = Some(vt(&mut b, "off_cpu", "nanoseconds"));
                b.profile.period = 1;
            }
        }
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ix.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ix.insert(s.to_string(), i);
        i
    }

    fn location(&mut self, function: &str, module: &str, line: u32) -> u64 {
        let file = if module == "kernel" {
            "[kernel]"
        } else {
            module
        };
        let (name, file) = (self.string(function), self.string(file));
        let next = self.profile.mapping.len() as u64 + 1;
        let mapping = *self.mappings.entry(file).or_insert(next);
        if mapping == next {
            self.profile.mapping.push(Mapping {
                id: mapping,
                filename: file,
                has_functions: true,
            });
        }
        let next = self.profile.function.len() as u64 + 1;
        let func = *self.functions.entry((name, file)).or_insert(next);
        if func == next {
            self.profile.function.push(Function {
                id: func,
                name,
                system_name: name,
                filename: file,
            });
        }
        let next = self.profile.location.len() as u64 + 1;
        let loc = *self.locations.entry((func, mapping, line)).or_insert(next);
        if loc == next {
            self.profile.location.push(Location {
                id: loc,
                mapping_id: mapping,
                line: vec![Line {
                    function_id: func,
                    line: line as i64,
                }],
            });
        }
        loc
    }

    /// Adds a window's samples (frames outermost first, as [`Sample`] holds them).
    pub fn add(&mut self, samples: &[Sample]) {
        for s in samples {
            let locs: Vec<u64> = s
                .frames
                .iter()
                .rev()
                .map(|f| self.location(&f.function, &f.module, f.line))
                .collect();
            let comm = self.string(&crate::report::sanitize::text(&s.comm));
            *self.samples.entry((locs, s.id, s.tgid, comm)).or_default() += s.count;
        }
    }

    /// The profile so far, spanning `duration_ns` from `start_unix_ns`.
    pub fn profile(&self, start_unix_ns: i64, duration_ns: i64) -> Profile {
        let mut p = self.profile.clone();
        let key = |b: &Builder, k: &str| b.string_ix.get(k).copied();
        let mut strings = self.strings.clone();
        let mut ix = |s: &str| match key(self, s) {
            Some(i) => i,
            None => {
                strings.push(s.to_string());
                strings.len() as i64 - 1
            }
        };
        let (pid, tid, comm) = (ix("pid"), ix("tid"), ix("comm"));
        let mut samples: Vec<_> = self.samples.iter().collect();
        // Largest first, then by stack: the same run gives the same file.
        samples.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        for ((locs, id, tgid, c), &count) in samples {
            let count = count as i64;
            let value = match self.kind {
                Kind::Cpu { period_ns } => vec![count, count.saturating_mul(period_ns)],
                Kind::OffCpu => vec![count],
            };
            let mut label = vec![
                Label {
                    key: pid,
                    str: 0,
                    num: i64::from(*tgid),
                },
                Label {
                    key: comm,
                    str: *c,
                    num: 0,
                },
            ];
            if self.threads {
                label.push(Label {
                    key: tid,
                    str: 0,
                    num: i64::from(*id),
                });
            }
            p.sample.push(PSample {
                location_id: locs.clone(),
                value,
                label,
            });
        }
        p.string_table = strings;
        p.time_nanos = start_unix_ns;
        p.duration_nanos = duration_ns;
        p
    }
}

/// `profile`, gzip-compressed as pprof expects (`.pb.gz`).
pub fn encode_gz(p: &Profile) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::tools::profile::stacks::marker;

    fn sample(id: u32, frames: &[(&str, &str)], count: u64) -> Sample {
        Sample {
            id,
            tgid: id,
            comm: b"hot".to_vec(),
            frames: frames.iter().map(|(f, m)| marker(f, m)).collect(),
            count,
        }
    }

    fn decode(gz: &[u8]) -> Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut raw)
            .unwrap();
        Profile::decode(raw.as_slice()).unwrap()
    }

    /// The names of sample `s`'s frames, leaf first.
    fn names(p: &Profile, s: &PSample) -> Vec<String> {
        s.location_id
            .iter()
            .map(|&l| {
                let loc = &p.location[l as usize - 1];
                assert_eq!(loc.id, l);
                let f = &p.function[loc.line[0].function_id as usize - 1];
                p.string_table[f.name as usize].clone()
            })
            .collect()
    }

    #[test]
    fn samples_round_trip_with_leaf_first_stacks_and_cpu_time() {
        let mut b = Builder::new(
            Kind::Cpu {
                period_ns: 10_101_010,
            },
            false,
        );
        let main = ("main", "/usr/bin/hot");
        let spin = ("spin", "/usr/bin/hot");
        let irq = ("asm_sysvec_apic_timer_interrupt", "kernel");
        b.add(&[
            sample(7, &[main, spin], 9),
            sample(7, &[main, spin, irq], 1),
        ]);
        // A second window adds to the same stack.
        b.add(&[sample(7, &[main, spin], 3)]);
        let p = decode(&encode_gz(&b.profile(1, 2_000_000_000)).unwrap());
        assert_eq!(p.string_table[0], "");
        let st = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|v| (st(v.r#type), st(v.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(p.period, 10_101_010);
        assert_eq!(p.sample.len(), 2);
        let top = &p.sample[0];
        assert_eq!(top.value, [12, 12 * 10_101_010]);
        assert_eq!(names(&p, top), ["spin", "main"]);
        assert_eq!(
            names(&p, &p.sample[1]),
            ["asm_sysvec_apic_timer_interrupt", "spin", "main"]
        );
        // Three functions, two mappings (the binary and the kernel), a location each.
        assert_eq!(p.function.len(), 3);
        assert_eq!(p.location.len(), 3);
        let files: Vec<&str> = p.mapping.iter().map(|m| st(m.filename)).collect();
        assert_eq!(files, ["/usr/bin/hot", "[kernel]"]);
        let labels: Vec<(&str, i64, &str)> = top
            .label
            .iter()
            .map(|l| (st(l.key), l.num, st(l.str)))
            .collect();
        assert_eq!(labels, [("pid", 7, ""), ("comm", 0, "hot")]);
        assert_eq!((p.time_nanos, p.duration_nanos), (1, 2_000_000_000));
    }

    #[test]
    fn off_cpu_values_are_blocked_nanoseconds() {
        let mut b = Builder::new(Kind::OffCpu, true);
        b.add(&[sample(9, &[("main", "a"), ("schedule", "kernel")], 5_000)]);
        let p = decode(&encode_gz(&b.profile(0, 1)).unwrap());
        assert_eq!(p.sample[0].value, [5_000]);
        assert_eq!(p.sample_type.len(), 1);
        assert_eq!(p.string_table[p.sample_type[0].r#type as usize], "off_cpu");
        // With --threads, the row's thread id too.
        assert!(p.sample[0]
            .label
            .iter()
            .any(|l| p.string_table[l.key as usize] == "tid" && l.num == 9));
    }
}
