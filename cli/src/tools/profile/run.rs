//! What the on-CPU and off-CPU collectors share: the kernel's stack map, the resolver, the
//! processes' titles, and the run's folded stacks with the files they go to (`--folded`,
//! `--svg`, `--pprof`).

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
};

use aya::maps::{stack_trace::StackTraceMap, MapData};
use probes_common::profile::ProfileKey;

use super::{
    pprof,
    stacks::{fold_into, key_frames, resolve_new_users, write_file_bytes, write_outputs, Sample},
    symbols::{Frame, Resolver},
    Args,
};
use crate::{
    error::{Context, Result},
    kernel::loader::Session,
    report::output::Sink,
};

pub struct StackRun {
    pub stacks: StackTraceMap<MapData>,
    /// The Python processes' frames (see `python.rs`).
    pub python: super::python::Python,
    pub resolver: Resolver,
    pub facts: crate::host::facts::Facts,
    /// Processes seen this window (their container and title are remembered).
    seen: HashSet<u32>,
    folded_path: Option<PathBuf>,
    svg_path: Option<PathBuf>,
    /// Folded stacks of the whole run (for `--folded` and `--svg`), counted in `unit`.
    folded: BTreeMap<String, u64>,
    unit: &'static str,
    /// `--pprof`: the file and the run's profile so far, and when the run started.
    pprof: Option<(PathBuf, pprof::Builder)>,
    started: (std::time::Instant, std::time::SystemTime),
}

impl StackRun {
    /// Checks `--folded` and `--svg` before anything is attached, with `--output`'s rules (a
    /// directory, a missing directory or a dangling symlink is exit 2; a device is written
    /// into, never replaced). The check's temporary file goes with the sink.
    pub fn check_files(args: &Args) -> Result<()> {
        for p in [&args.folded, &args.svg, &args.pprof].into_iter().flatten() {
            Sink::open(Some(p), false)?;
        }
        Ok(())
    }

    /// Takes the stack map `map` from `session`; the flame graph counts in `unit` (`samples`
    /// taken at `args.freq`, or blocked `ns`).
    pub fn new(
        session: &mut Session,
        map: &'static str,
        args: &Args,
        unit: &'static str,
        facts: crate::host::facts::Facts,
        scope: &crate::engine::Scope,
        python: bool,
    ) -> Result<StackRun> {
        Ok(StackRun {
            stacks: StackTraceMap::try_from(session.take_map(map)?).context(map)?,
            python: super::python::Python::new(session, scope, python)?,
            resolver: Resolver::default(),
            facts,
            seen: HashSet::new(),
            folded_path: args.folded.clone(),
            svg_path: args.svg.clone(),
            folded: BTreeMap::new(),
            unit,
            pprof: args.pprof.clone().map(|p| {
                let kind = match unit {
                    "samples" => pprof::Kind::Cpu {
                        period_ns: (1_000_000_000 / args.freq.max(1)) as i64,
                    },
                    _ => pprof::Kind::OffCpu,
                };
                (p, pprof::Builder::new(kind, args.common.threads))
            }),
            started: (std::time::Instant::now(), std::time::SystemTime::now()),
        })
    }

    /// A process seen in the kernel's counts or samples: the first time in a window, its
    /// container and title are remembered while it lives (the resolver opens its binaries when
    /// its first stack is resolved), so a process that exits before the window ends is named.
    pub fn see(&mut self, tgid: u32) {
        if self.seen.insert(tgid) {
            let _ = crate::host::container::of_pid(tgid);
            self.facts.lock().title(tgid);
        }
    }

    /// A poll of the frame-pointer modes: notes the processes of `keys` and resolves their new
    /// user stacks while they still run.
    pub fn poll(&mut self, keys: &[ProfileKey]) {
        self.resolver.begin_poll();
        for k in keys {
            self.see(k.tgid);
        }
        resolve_new_users(&mut self.resolver, &self.stacks, keys);
        self.python.poll(keys.iter().map(|k| (k.tgid, k.py_stack)));
    }

    /// The frames of one key, outermost first (`user`: already unwound).
    pub fn frames(&mut self, k: &ProfileKey, user: Option<std::rc::Rc<[Frame]>>) -> Vec<Frame> {
        let python = self.python.segments(k.tgid, k.py_stack);
        key_frames(&mut self.resolver, &self.stacks, k, user, python)
    }

    /// Adds a window's samples to the run's folded stacks.
    pub fn fold(&mut self, samples: &[Sample]) {
        fold_into(&mut self.folded, samples);
        if let Some((_, b)) = &mut self.pprof {
            b.add(samples);
        }
    }

    /// Writes the run's folded stacks and flame graph (titled `title`), those asked for.
    pub fn write_files(&self, title: &str) -> Result<()> {
        write_outputs(
            self.folded_path.as_deref(),
            self.svg_path.as_deref(),
            &self.folded,
            title,
            self.unit,
        )?;
        if let Some((path, b)) = &self.pprof {
            let start = self
                .started
                .1
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let took = self.started.0.elapsed().as_nanos() as i64;
            let gz = pprof::encode_gz(&b.profile(start, took)).map_err(|e| {
                crate::error::Error::other(format!(
                    "encoding the pprof profile {}: {e}",
                    path.display()
                ))
            })?;
            write_file_bytes(path, &gz)?;
        }
        Ok(())
    }

    /// Ends a window: forgets what belongs to processes that are gone.
    pub fn end_window(&mut self) {
        self.resolver.end_window();
        self.python.end_window();
        self.seen.clear();
    }
}
