//! What the on-CPU and off-CPU collectors share: the kernel's stack map, the resolver, the
//! processes' titles, and the run's folded stacks with the files they go to (`--folded`,
//! `--svg`).

use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
};

use aya::maps::{stack_trace::StackTraceMap, MapData};
use probes_common::profile::ProfileKey;

use super::{
    stacks::{fold_into, key_frames, resolve_new_users, write_outputs, Sample},
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
    pub resolver: Resolver,
    pub facts: crate::host::facts::Facts,
    /// Processes seen this window (their container and title are remembered).
    seen: HashSet<u32>,
    folded_path: Option<PathBuf>,
    svg_path: Option<PathBuf>,
    /// Folded stacks of the whole run (for `--folded` and `--svg`), counted in `unit`.
    folded: BTreeMap<String, u64>,
    unit: &'static str,
}

impl StackRun {
    /// Checks `--folded` and `--svg` before anything is attached, with `--output`'s rules (a
    /// directory, a missing directory or a dangling symlink is exit 2; a device is written
    /// into, never replaced). The check's temporary file goes with the sink.
    pub fn check_files(args: &Args) -> Result<()> {
        for p in [&args.folded, &args.svg].into_iter().flatten() {
            Sink::open(Some(p), false)?;
        }
        Ok(())
    }

    /// Takes the stack map `map` from `session`; the flame graph counts in `unit`.
    pub fn new(
        session: &mut Session,
        map: &'static str,
        args: &Args,
        unit: &'static str,
        facts: crate::host::facts::Facts,
    ) -> Result<StackRun> {
        Ok(StackRun {
            stacks: StackTraceMap::try_from(session.take_map(map)?).context(map)?,
            resolver: Resolver::default(),
            facts,
            seen: HashSet::new(),
            folded_path: args.folded.clone(),
            svg_path: args.svg.clone(),
            folded: BTreeMap::new(),
            unit,
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
    }

    /// The frames of one key, outermost first (`user`: already unwound).
    pub fn frames(&mut self, k: &ProfileKey, user: Option<std::rc::Rc<[Frame]>>) -> Vec<Frame> {
        key_frames(&mut self.resolver, &self.stacks, k, user)
    }

    /// Adds a window's samples to the run's folded stacks.
    pub fn fold(&mut self, samples: &[Sample]) {
        fold_into(&mut self.folded, samples);
    }

    /// Writes the run's folded stacks and flame graph (titled `title`), those asked for.
    pub fn write_files(&self, title: &str) -> Result<()> {
        write_outputs(
            self.folded_path.as_deref(),
            self.svg_path.as_deref(),
            &self.folded,
            title,
            self.unit,
        )
    }

    /// Ends a window: forgets what belongs to processes that are gone.
    pub fn end_window(&mut self) {
        self.resolver.end_window();
        self.seen.clear();
    }
}
