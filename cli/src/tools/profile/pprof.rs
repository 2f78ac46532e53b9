//! `profile --pprof FILE`: the run's samples as gzip-compressed `profile.proto`
//! (github.com/google/pprof, `proto/profile.proto`), the format `go tool pprof`, Pyroscope and
//! Grafana read. The messages are declared here with their field numbers from that schema and
//! encoded by `prost`; only the fields tracekit fills are declared (a decoder skips the rest).
//!
//! What the file holds: one sample per (stack, process or thread) with its count and, on-CPU,
//! its CPU time (count × the sampling period); a location per (function, module), whose one
//! line names the function; a mapping per module (the binary, `[kernel]` for kernel frames).
//! A native user frame's location also carries an address sampled in it (the first seen: the
//! report merges a function's samples), and its mapping the range the process mapped, the file
//! offset, the path and the file's GNU build id, so a backend can fetch the debug info. Kernel
//! locations carry their address in the `[kernel]` mapping; Python frames (file and line)
//! carry none.

use std::collections::HashMap;

use prost::Message;

use super::{
    stacks::Sample,
    symbols::{At, Frame},
};

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
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
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

/// The GNU build id (`NT_GNU_BUILD_ID`, hex) in a sequence of ELF notes, as the kernel
/// publishes its own in `/sys/kernel/notes`: each note is its name and descriptor sizes, its
/// type, then the name and the descriptor, each padded to 4 bytes.
pub fn gnu_build_id(notes: &[u8]) -> Option<String> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(notes.get(at..at + 4)?.try_into().ok()?))
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at)? as usize, word(at + 4)? as usize, word(at + 8)?);
        let name = notes.get(at + 12..at + 12 + namesz)?;
        let desc_at = at + 12 + pad(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() {
            return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
        }
        at = desc_at + pad(descsz);
    }
    None
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
    /// By module name, for frames without a file mapping.
    mappings: HashMap<i64, u64>,
    /// By file mapping (path, range, offset).
    file_mappings: HashMap<(i64, u64, u64, u64), u64>,
    locations: HashMap<(u64, u64, u32, u64), u64>,
    /// The running kernel's build id (hex, empty if unknown), for the `[kernel]` mapping.
    kernel_build_id: String,
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
            file_mappings: HashMap::new(),
            locations: HashMap::new(),
            kernel_build_id: crate::host::read_capped(
                &crate::host::sys_path("kernel/notes"),
                crate::host::SMALL_FILE,
            )
            .ok()
            .and_then(|b| gnu_build_id(&b))
            .unwrap_or_default(),
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

    /// The mapping of a frame: its file mapping when the resolver placed it, else one per
    /// module name.
    fn mapping(&mut self, module: &str, at: &At) -> (u64, i64) {
        let next = self.profile.mapping.len() as u64 + 1;
        if let Some(m) = &at.map {
            let (file, build_id) = (self.string(&m.path), self.string(&m.build_id));
            let id = *self
                .file_mappings
                .entry((file, m.start, m.end, m.offset))
                .or_insert(next);
            if id == next {
                self.profile.mapping.push(Mapping {
                    id,
                    memory_start: m.start,
                    memory_limit: m.end,
                    file_offset: m.offset,
                    filename: file,
                    build_id,
                    has_functions: true,
                });
            }
            return (id, self.string(module));
        }
        let file = self.string(if module == "kernel" {
            "[kernel]"
        } else {
            module
        });
        let id = *self.mappings.entry(file).or_insert(next);
        if id == next {
            let build_id = if module == "kernel" {
                let id = self.kernel_build_id.clone();
                self.string(&id)
            } else {
                0
            };
            self.profile.mapping.push(Mapping {
                id,
                filename: file,
                build_id,
                has_functions: true,
                ..Default::default()
            });
        }
        (id, file)
    }

    fn location(&mut self, f: &Frame) -> u64 {
        let (mapping, file) = self.mapping(&f.module, &f.at);
        let name = self.string(&f.function);
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
        let key = (func, mapping, f.line, f.at.addr);
        let loc = *self.locations.entry(key).or_insert(next);
        if loc == next {
            self.profile.location.push(Location {
                id: loc,
                mapping_id: mapping,
                address: f.at.addr,
                line: vec![Line {
                    function_id: func,
                    line: f.line as i64,
                }],
            });
        }
        loc
    }

    /// Adds a window's samples (frames outermost first, as [`Sample`] holds them).
    pub fn add(&mut self, samples: &[Sample]) {
        for s in samples {
            let locs: Vec<u64> = s.frames.iter().rev().map(|f| self.location(f)).collect();
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

    use std::rc::Rc;

    use super::*;
    use crate::tools::profile::stacks::marker;
    use crate::tools::profile::symbols::MapInfo;

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

    /// A placed frame (its address and file mapping) gets a location with that address in a
    /// mapping with the range, offset, path and build id; a frame without one keeps the
    /// module's mapping and no address.
    #[test]
    fn placed_frames_carry_addresses_and_build_ids() {
        let mut b = Builder::new(Kind::Cpu { period_ns: 1 }, false);
        let map = Rc::new(MapInfo {
            path: Rc::from("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            start: 0x7f00_0002_8000,
            end: 0x7f00_0018_0000,
            offset: 0x28000,
            build_id: Rc::from("93ac61ec5a8eb1396f9fbd350e3169a558528a40"),
        });
        let mut s = sample(3, &[("main", "hot"), ("memcpy", "libc")], 4);
        s.frames[1].at = At {
            addr: 0x7f00_0003_0001,
            map: Some(map),
        };
        b.add(&[s]);
        let p = decode(&encode_gz(&b.profile(0, 1)).unwrap());
        let st = |i: i64| p.string_table[i as usize].as_str();
        let leaf = &p.location[(p.sample[0].location_id[0] - 1) as usize];
        assert_eq!(leaf.address, 0x7f00_0003_0001);
        let m = &p.mapping[(leaf.mapping_id - 1) as usize];
        assert_eq!(
            (m.memory_start, m.memory_limit, m.file_offset),
            (0x7f00_0002_8000, 0x7f00_0018_0000, 0x28000)
        );
        assert_eq!(st(m.filename), "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(st(m.build_id), "93ac61ec5a8eb1396f9fbd350e3169a558528a40");
        // The function keeps the module's short name.
        let f = &p.function[(leaf.line[0].function_id - 1) as usize];
        assert_eq!((st(f.name), st(f.filename)), ("memcpy", "libc"));
        let outer = &p.location[(p.sample[0].location_id[1] - 1) as usize];
        assert_eq!(outer.address, 0);
        let m = &p.mapping[(outer.mapping_id - 1) as usize];
        assert_eq!(
            (st(m.filename), m.memory_limit, st(m.build_id)),
            ("hot", 0, "")
        );
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

    /// /sys/kernel/notes of a 6.18 kernel: the build id note, then Xen's and Linux's notes.
    #[test]
    fn kernel_build_id_is_read_from_its_notes() {
        let mut notes = Vec::new();
        let mut note = |name: &[u8], kind: u32, desc: &[u8]| {
            notes.extend((name.len() as u32).to_ne_bytes());
            notes.extend((desc.len() as u32).to_ne_bytes());
            notes.extend(kind.to_ne_bytes());
            for part in [name, desc] {
                notes.extend(part);
                notes.resize(notes.len().div_ceil(4) * 4, 0);
            }
        };
        note(b"Linux\0", 6, b"\x01\x01");
        note(b"GNU\0", 3, &[0x32, 0xa7, 0xf3, 0xba, 0x0e]);
        assert_eq!(gnu_build_id(&notes).as_deref(), Some("32a7f3ba0e"));
        assert_eq!(gnu_build_id(&notes[..20]), None, "truncated");
        assert_eq!(gnu_build_id(b""), None);
    }
}
