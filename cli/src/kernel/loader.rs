//! Loading a tool's kernel object, attaching its programs with the cheapest mode the kernel
//! allows, and reading back its shared maps (stats, interval generation).
//!
//! Nothing is pinned: every program, link and map lives on a file descriptor of this process,
//! so the kernel frees them on any exit, SIGKILL included.

use std::{collections::BTreeMap, time::Duration};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{
        tp_btf::BtfTracePointLinkId, BtfTracePoint, ProgramError, RawTracePoint, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use probes_common::stats::{Control, NSTATS};

use crate::{error::UserError, options::Common};

/// A tool's embedded kernel object (built from `probes-ebpf` by `cli/build.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Object {
    pub name: &'static str,
    pub bytes: &'static [u8],
}

macro_rules! embed {
    ($konst:ident, $name:literal) => {
        pub const $konst: Object = Object {
            name: $name,
            bytes: aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/", $name)),
        };
    };
}
embed!(FSYNC_LAT, "fsync_lat");
embed!(FLOOR, "floor");
embed!(MEMSTALL, "memstall");
embed!(CTXSW, "ctxsw");
embed!(RUNQ_LAT, "runq_lat");

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the {object} kernel object: {source}")]
    Object {
        object: &'static str,
        source: aya::EbpfError,
    },
    #[error("{object} has no program {program}")]
    NoProgram {
        object: &'static str,
        program: String,
    },
    #[error("{object} has no map {map}")]
    NoMap { object: &'static str, map: String },
    #[error("loading program {program}: {msg}")]
    Program { program: String, msg: String },
    #[error("attaching {program} to {target}: {source}")]
    Attach {
        program: String,
        target: String,
        source: Box<ProgramError>,
    },
    #[error("map {map}: {source}")]
    Map {
        map: String,
        source: aya::maps::MapError,
    },
}

/// How a program is attached; cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttachMode {
    /// BTF-typed raw tracepoint (`tp_btf`, 5.5+): no perf-event layer, typed arguments.
    TpBtf,
    /// Raw tracepoint (4.17+): no perf-event layer, raw arguments.
    RawTp,
    /// Classic tracepoint through perf events: the record is built before the program runs.
    Tracepoint,
    /// fentry/fexit on a kernel function (BTF trampolines): cheap, but absent on some kernels
    /// (`features::fentry`) and tied to a function name that may change.
    Fentry,
    /// kprobe/kretprobe on a kernel function (`features::kprobes`): the costliest, the most widely
    /// available where CONFIG_KPROBES is on.
    Kprobe,
}

impl AttachMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::TpBtf => "tp_btf",
            AttachMode::RawTp => "raw_tp",
            AttachMode::Tracepoint => "tracepoint",
            AttachMode::Fentry => "fentry",
            AttachMode::Kprobe => "kprobe",
        }
    }
}

/// One attached program, for the report header and for tests that check cleanup.
#[derive(Clone, Debug)]
pub struct Attached {
    pub program: String,
    pub id: u32,
    pub mode: AttachMode,
    pub targets: Vec<String>,
}

/// A tool's settings for its object: read-only globals (field offsets, flags) patched in before
/// load, and map sizes.
#[derive(Debug, Default)]
pub struct LoadSpec {
    globals: Vec<(&'static str, Vec<u8>)>,
    max_entries: Vec<(&'static str, u32)>,
    tp_btf: Vec<&'static str>,
}

impl LoadSpec {
    pub fn new() -> LoadSpec {
        LoadSpec::default()
    }

    /// Sets global `name`; its size must match the kernel object's (checked by aya at load).
    pub fn global<T: aya::Pod>(mut self, name: &'static str, value: &T) -> LoadSpec {
        // SAFETY: T is Pod (plain bytes, no padding that matters); we copy exactly its size.
        let bytes = unsafe {
            std::slice::from_raw_parts(value as *const T as *const u8, std::mem::size_of::<T>())
        };
        self.globals.push((name, bytes.to_vec()));
        self
    }

    pub fn max_entries(mut self, map: &'static str, n: u32) -> LoadSpec {
        self.max_entries.push((map, n));
        self
    }

    /// Raw tracepoints the tool will attach with tp_btf: their BTF stub (see
    /// `Session::prepare_tp_btf`) is built on a second thread while the object loads (map
    /// creation and aya's feature probes), which hides its ~0.5 ms on a 2-CPU machine.
    pub fn tp_btf(mut self, tps: &[&'static str]) -> LoadSpec {
        self.tp_btf.extend_from_slice(tps);
        self
    }
}

/// A loaded tool object with its attachments. Dropping it detaches everything.
pub struct Session {
    pub object: &'static str,
    pub ebpf: Ebpf,
    pub attached: Vec<Attached>,
    stats_prev: [u64; NSTATS as usize],
    /// A tp_btf stub covering several tracepoints (see `prepare_tp_btf`).
    tp_stub: Option<(Vec<String>, aya::Btf)>,
}

fn map_err(map: &str) -> impl FnOnce(aya::maps::MapError) -> LoadError + '_ {
    move |source| LoadError::Map {
        map: map.to_string(),
        source,
    }
}

fn prog_load_err(program: &str, e: ProgramError) -> LoadError {
    let msg = match &e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            // The error is often well before the last lines; RUST_LOG=tracekit=debug shows it all.
            tracing::debug!("verifier log of {program}:\n{log}");
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .filter(|l| !l.trim().is_empty())
                .take(2)
                .collect();
            format!(
                "{io_error} (verifier: {})",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            )
        }
        other => other.to_string(),
    };
    LoadError::Program {
        program: program.to_string(),
        msg,
    }
}

impl Session {
    /// Loads `object` with the shared filter globals from `common` plus the tool's own settings
    /// from `configure` (globals, map sizes). BTF is not parsed for relocations: Rust BPF code
    /// has none, and skipping it saves a second parse of /sys/kernel/btf/vmlinux at start-up.
    pub fn load(object: Object, common: &Common, spec: LoadSpec) -> anyhow::Result<Session> {
        let comm = common.comm_bytes();
        let spec = spec
            .global("FILTER_PIDS_ON", &u8::from(!common.pids.is_empty()))
            .global("FILTER_COMM_ON", &u8::from(comm.is_some()))
            .global("FILTER_COMM", &comm.unwrap_or([0; 16]));
        let t = std::time::Instant::now();
        let mut loader = loader_without_vmlinux_btf();
        tracing::debug!("EbpfLoader::new took {:?}", t.elapsed());
        loader.btf(None);
        // Task-local storage maps (BTF-defined) have no typed wrapper in aya 0.14; the programs
        // use them, userspace never reads them.
        loader.allow_unsupported_maps();
        for (name, bytes) in &spec.globals {
            loader.override_global(name, bytes.as_slice(), true);
        }
        for (name, n) in &spec.max_entries {
            loader.map_max_entries(name, *n);
        }
        // After EbpfLoader::new: its unshare(CLONE_NEWNS) needs a single-threaded process.
        let stub_thread =
            (!spec.tp_btf.is_empty() && crate::kernel::features::btf_present()).then(|| {
                let tps = spec.tp_btf.clone();
                std::thread::spawn(move || {
                    crate::kernel::btf::vmlinux()
                        .ok()
                        .and_then(|b| b.tp_btf_stub(&tps))
                        .map(|stub| (tps.iter().map(|s| s.to_string()).collect(), stub))
                })
            });
        let loaded = loader.load(object.bytes);
        let tp_stub = stub_thread.and_then(|t| t.join().ok()).flatten();
        let mut ebpf = loaded.map_err(|source| {
            if is_eperm(&source) {
                anyhow::Error::new(UserError::Permission(format!(
                    "the kernel refused to load {} (EPERM): run as root, or with CAP_BPF and CAP_PERFMON",
                    object.name
                )))
            } else {
                LoadError::Object {
                    object: object.name,
                    source,
                }
                .into()
            }
        })?;
        tracing::debug!("load of {} done at {:?}", object.name, t.elapsed());
        if !common.pids.is_empty() {
            let mut m: HashMap<_, u32, u8> =
                HashMap::try_from(ebpf.map_mut("FILTER_PIDS").ok_or(LoadError::NoMap {
                    object: object.name,
                    map: "FILTER_PIDS".into(),
                })?)
                .map_err(map_err("FILTER_PIDS"))?;
            for p in &common.pids {
                m.insert(p, 1, 0).map_err(map_err("FILTER_PIDS"))?;
            }
        }
        Ok(Session {
            object: object.name,
            ebpf,
            attached: Vec::new(),
            stats_prev: [0; NSTATS as usize],
            tp_stub,
        })
    }

    fn unrecord(&mut self, program: &str, target: &str) {
        if let Some(a) = self.attached.iter_mut().find(|a| a.program == program) {
            a.targets.retain(|t| t != target);
        }
        self.attached.retain(|a| !a.targets.is_empty());
    }

    fn record(&mut self, program: &str, mode: AttachMode, target: String) {
        if let Some(a) = self.attached.iter_mut().find(|a| a.program == program) {
            a.targets.push(target);
            return;
        }
        let id = self
            .ebpf
            .program(program)
            .and_then(|p| p.info().ok())
            .map(|i| i.id())
            .unwrap_or(0);
        self.attached.push(Attached {
            program: program.to_string(),
            id,
            mode,
            targets: vec![target],
        });
    }

    /// Attaches classic-tracepoint program `program` to `category:name` (loading it on first
    /// use; one program may serve several events).
    pub fn attach_tracepoint(
        &mut self,
        program: &str,
        category: &str,
        name: &str,
    ) -> Result<(), LoadError> {
        let p: &mut TracePoint = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| LoadError::NoProgram {
                object: self.object,
                program: program.into(),
            })?
            .try_into()
            .map_err(|e| prog_load_err(program, e))?;
        if p.fd().is_err() {
            p.load().map_err(|e| prog_load_err(program, e))?;
        }
        p.attach(category, name)
            .map_err(|source| LoadError::Attach {
                program: program.into(),
                target: format!("{category}:{name}"),
                source: Box::new(source),
            })?;
        self.record(
            program,
            AttachMode::Tracepoint,
            format!("{category}:{name}"),
        );
        Ok(())
    }

    /// Attaches `program` as a BTF tracepoint (tp_btf) on raw tracepoint `tp`. `Err` says why
    /// this kernel cannot (no BTF, no `btf_trace_<tp>`, the verifier refused); the caller then
    /// falls back. A tp_btf link detaches without waiting for an RCU grace period, unlike a
    /// classic tracepoint's perf event (see `probes-ebpf/src/fsync_lat.rs`).
    pub fn attach_tp_btf(
        &mut self,
        program: &str,
        tp: &str,
    ) -> Result<BtfTracePointLinkId, String> {
        if !crate::kernel::features::btf_present() {
            return Err(format!(
                "no kernel BTF ({})",
                crate::kernel::btf::vmlinux_path().display()
            ));
        }
        // A stub holding just this tracepoint's typedef id, from the shared fast BTF reader
        // (see crate::kernel::btf::Btf::tp_btf_stub), instead of aya's full parse.
        let own;
        let btf = match &self.tp_stub {
            Some((tps, stub)) if tps.iter().any(|t| t == tp) => stub,
            _ => {
                own = crate::kernel::btf::vmlinux()
                    .map_err(|e| e.to_string())?
                    .tp_btf_stub(&[tp])
                    .ok_or_else(|| format!("kernel BTF has no btf_trace_{tp}"))?;
                &own
            }
        };
        let p: &mut BtfTracePoint = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| format!("{} has no program {program}", self.object))?
            .try_into()
            .map_err(|e: ProgramError| e.to_string())?;
        if p.fd().is_err() {
            p.load(tp, btf)
                .map_err(|e| prog_load_err(program, e).to_string())?;
        }
        let id = p.attach().map_err(|e| e.to_string())?;
        self.record(program, AttachMode::TpBtf, tp.to_string());
        Ok(id)
    }

    /// Undoes [`Session::attach_tp_btf`] (when the rest of a group cannot attach that way).
    pub fn detach_tp_btf(&mut self, program: &str, tp: &str, id: BtfTracePointLinkId) {
        if let Some(p) = self.ebpf.program_mut(program) {
            if let Ok(p) = <&mut BtfTracePoint>::try_from(p) {
                let _ = p.detach(id);
            }
        }
        self.unrecord(program, tp);
    }

    /// Builds one tp_btf stub for all of `tps` ahead of `attach_raw` calls for them: the stub
    /// holds a placeholder for every vmlinux type id below the highest typedef, so building and
    /// parsing it costs ~0.5 ms; one for the set instead of one per tracepoint.
    pub fn prepare_tp_btf(&mut self, tps: &[&str]) {
        if !crate::kernel::features::btf_present() {
            return;
        }
        if let Some(stub) = crate::kernel::btf::vmlinux()
            .ok()
            .and_then(|b| b.tp_btf_stub(tps))
        {
            self.tp_stub = Some((tps.iter().map(|s| s.to_string()).collect(), stub));
        }
    }

    /// Attaches to raw tracepoint `tp`, preferring `btf_program` (tp_btf) and falling back to
    /// `raw_program` (raw_tp) when the kernel has no BTF or refuses tp_btf. Returns the mode used.
    pub fn attach_raw(
        &mut self,
        btf_program: &str,
        raw_program: &str,
        tp: &str,
    ) -> Result<AttachMode, LoadError> {
        match self.attach_tp_btf(btf_program, tp) {
            Ok(_) => return Ok(AttachMode::TpBtf),
            Err(e) => tracing::info!("tp_btf {tp} unavailable ({e}); falling back to raw_tp"),
        }
        let p: &mut RawTracePoint = self
            .ebpf
            .program_mut(raw_program)
            .ok_or_else(|| LoadError::NoProgram {
                object: self.object,
                program: raw_program.into(),
            })?
            .try_into()
            .map_err(|e| prog_load_err(raw_program, e))?;
        if p.fd().is_err() {
            p.load().map_err(|e| prog_load_err(raw_program, e))?;
        }
        p.attach(tp).map_err(|source| LoadError::Attach {
            program: raw_program.into(),
            target: tp.to_string(),
            source: Box::new(source),
        })?;
        self.record(raw_program, AttachMode::RawTp, tp.to_string());
        Ok(AttachMode::RawTp)
    }

    /// Per-CPU stats summed over CPUs, as deltas since the previous call.
    pub fn stats_delta(&mut self) -> Result<[u64; NSTATS as usize], LoadError> {
        let m: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("STATS").ok_or(LoadError::NoMap {
                object: self.object,
                map: "STATS".into(),
            })?)
            .map_err(map_err("STATS"))?;
        let mut now = [0u64; NSTATS as usize];
        for (i, slot) in now.iter_mut().enumerate() {
            let v = m.get(&(i as u32), 0).map_err(map_err("STATS"))?;
            *slot = v.iter().sum();
        }
        let mut delta = [0u64; NSTATS as usize];
        for i in 0..now.len() {
            delta[i] = now[i].wrapping_sub(self.stats_prev[i]);
        }
        self.stats_prev = now;
        Ok(delta)
    }

    /// The generation the kernel writes to now.
    pub fn generation(&self) -> Result<u32, LoadError> {
        let m: Array<_, Control> =
            Array::try_from(self.ebpf.map("CONTROL").ok_or(LoadError::NoMap {
                object: self.object,
                map: "CONTROL".into(),
            })?)
            .map_err(map_err("CONTROL"))?;
        Ok(m.get(&0, 0).map_err(map_err("CONTROL"))?.gen & 1)
    }

    /// Starts a new interval: the kernel switches to the other generation, and the one returned
    /// is quiescent once programs that read the old value have finished (they run for
    /// microseconds; we wait 2 ms).
    pub fn flip_generation(&mut self) -> Result<u32, LoadError> {
        let old = self.generation()?;
        let mut m: Array<_, Control> =
            Array::try_from(self.ebpf.map_mut("CONTROL").ok_or(LoadError::NoMap {
                object: self.object,
                map: "CONTROL".into(),
            })?)
            .map_err(map_err("CONTROL"))?;
        m.set(
            0,
            Control {
                gen: old ^ 1,
                _pad: 0,
            },
            0,
        )
        .map_err(map_err("CONTROL"))?;
        std::thread::sleep(Duration::from_millis(2));
        Ok(old)
    }

    /// Attached programs for the JSON meta line.
    pub fn programs_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.attached
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "name": a.program, "id": a.id, "attach": a.mode.as_str(), "targets": a.targets,
                    })
                })
                .collect(),
        )
    }

    /// One line per program for the text header.
    pub fn programs_text(&self) -> String {
        let mut by_mode: BTreeMap<AttachMode, usize> = BTreeMap::new();
        for a in &self.attached {
            *by_mode.entry(a.mode).or_default() += a.targets.len();
        }
        let parts: Vec<String> = by_mode
            .iter()
            .map(|(m, n)| format!("{n} {} hook{}", m.as_str(), if *n == 1 { "" } else { "s" }))
            .collect();
        parts.join(", ")
    }
}

/// Drains every key of generation `gen` from `map`: returns (key, value) pairs and deletes them.
pub fn drain_generation<K, V>(
    map: &mut HashMap<MapData, K, V>,
    gen: u32,
    key_gen: impl Fn(&K) -> u32,
) -> Result<Vec<(K, V)>, aya::maps::MapError>
where
    K: aya::Pod,
    V: aya::Pod,
{
    let keys: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| key_gen(k) == gen)
        .collect();
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if let Ok(v) = map.get(&k, 0) {
            out.push((k, v));
        }
        let _ = map.remove(&k);
    }
    Ok(out)
}

/// An `EbpfLoader` without parsing `/sys/kernel/btf/vmlinux`.
///
/// aya 0.14's `EbpfLoader::new()` always parses the kernel's BTF (about 30 ms here, most of
/// tracekit's start-up), although our objects have no CO-RE relocations and we pass
/// `.btf(None)` anyway. So while `new()` runs, the file is masked with /dev/null in a private
/// mount namespace of this process: the parse fails at once and nothing outside the process
/// sees any change. The mask is removed right after, so tp_btf attachment can read BTF later.
/// Without CAP_SYS_ADMIN (CAP_BPF + CAP_PERFMON only) this silently falls back to the slow path.
fn loader_without_vmlinux_btf() -> EbpfLoader<'static> {
    const VMLINUX: &std::ffi::CStr = c"/sys/kernel/btf/vmlinux";
    // SAFETY: plain syscalls with valid NUL-terminated paths. unshare(CLONE_NEWNS) affects only
    // this process; tracekit is single-threaded at this point (the event loop starts later).
    let masked = unsafe {
        libc::unshare(libc::CLONE_NEWNS) == 0
            && libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) == 0
            && libc::mount(
                c"/dev/null".as_ptr(),
                VMLINUX.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) == 0
    };
    let loader = EbpfLoader::new();
    if masked {
        // SAFETY: as above; unmounts only the bind mount made just before.
        unsafe { libc::umount2(VMLINUX.as_ptr(), libc::MNT_DETACH) };
    }
    loader
}

fn is_eperm(e: &aya::EbpfError) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error() == Some(libc::EPERM);
        }
        src = s.source();
    }
    false
}
