//! Attaching a loaded object's programs: hook by hook in the mode the attach policy chose
//! ([`plan`]), or on the CPU clock for sampling programs.

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, FEntry, FExit, KProbe, PerfEvent, Program, ProgramError, RawTracePoint,
        TracePoint,
    },
    Ebpf,
};

use super::{prog_load_err, AttachMode, Attached, LoadError, Session};
use crate::kernel::hooks::{choose_all, Choice, Env, Hook, Symbols};

impl Session {
    fn record(&mut self, program: &str, mode: AttachMode, target: String) {
        if let Some(a) = self.attached.iter_mut().find(|a| a.program == program) {
            a.targets.push(target);
            return;
        }
        // The id is read once everything is attached (`fill_ids`): one bpf() call less between
        // two attaches.
        self.attached.push(Attached {
            program: program.to_string(),
            id: 0,
            mode,
            targets: vec![target],
        });
    }

    /// Reads the kernel's id of every attached program that has none yet.
    fn fill_ids(&mut self) {
        for a in self.attached.iter_mut().filter(|a| a.id == 0) {
            a.id = self
                .ebpf
                .program(&a.program)
                .and_then(|p| p.info().ok())
                .map(|i| i.id())
                .unwrap_or(0);
        }
    }

    /// Attaches every hook as `plan` (from [`plan`]) chose; hooks without a mode are listed in
    /// [`Session::skipped`] with the reason.
    pub fn attach_planned(&mut self, hooks: &[Hook], plan: &[Choice]) -> Result<(), LoadError> {
        for (hook, choice) in hooks.iter().zip(plan) {
            match choice.mode {
                Some((mode, program)) => {
                    let t = std::time::Instant::now();
                    self.attach_hook(hook, mode, program)?;
                    tracing::debug!("{program} loaded and attached in {:?}", t.elapsed());
                }
                None => self.skipped.push((
                    hook.event,
                    choice
                        .rejected
                        .last()
                        .map(|(_, w)| w.clone())
                        .unwrap_or(choice.why.clone()),
                )),
            }
        }
        self.choices.extend(plan.iter().cloned());
        self.fill_ids();
        Ok(())
    }

    /// Attaches one hook with `program` in `mode`.
    pub fn attach_hook(
        &mut self,
        hook: &Hook,
        mode: AttachMode,
        program: &'static str,
    ) -> Result<(), LoadError> {
        let target = hook.attach_target(mode).to_string();
        if self
            .links
            .iter()
            .any(|(p, t)| *p == program && *t == target)
        {
            // Another hook already attached this program there (one raw `sys_enter` program
            // serving several syscall events).
            self.record(program, mode, hook.event.to_string());
            return Ok(());
        }
        let attach_err = |source: ProgramError| LoadError::Attach {
            program: program.into(),
            target: target.clone(),
            source: Box::new(source),
        };
        let no_mode = |why: String| LoadError::NoMode {
            event: hook.event.into(),
            why,
            permission: false,
        };
        let (ebpf, object) = (&mut self.ebpf, self.object);
        match mode {
            AttachMode::Tracepoint => {
                let (category, name) = hook
                    .tracepoint_name()
                    .ok_or_else(|| no_mode("not a tracepoint".into()))?;
                loaded::<TracePoint>(ebpf, object, program, |p| p.load())?
                    .attach(category, name)
                    .map_err(attach_err)?;
            }
            AttachMode::TpBtf => {
                let mut own = None;
                let btf = stub_for(
                    self.tp_stub.as_ref(),
                    &format!("btf_trace_{target}"),
                    &mut own,
                    |b| b.tp_btf_stub(&[&target]),
                )
                .ok_or_else(|| no_mode(format!("kernel BTF has no btf_trace_{target}")))?;
                loaded::<BtfTracePoint>(ebpf, object, program, |p| p.load(&target, btf))?
                    .attach()
                    .map_err(attach_err)?;
            }
            AttachMode::RawTp => {
                loaded::<RawTracePoint>(ebpf, object, program, |p| p.load())?
                    .attach(&target)
                    .map_err(attach_err)?;
            }
            AttachMode::Fentry | AttachMode::Fexit => {
                if self.fn_stub.is_none() {
                    self.fn_stub = crate::kernel::btf::vmlinux()
                        .ok()
                        .and_then(|b| b.func_stub(&[&target]));
                }
                let mut own = None;
                let btf = stub_for(self.fn_stub.as_ref(), &target, &mut own, |b| {
                    b.func_stub(&[&target])
                })
                .ok_or_else(|| no_mode(format!("kernel BTF has no function {target}")))?;
                if mode == AttachMode::Fentry {
                    loaded::<FEntry>(ebpf, object, program, |p| p.load(&target, btf))?
                        .attach()
                        .map_err(attach_err)?;
                } else {
                    loaded::<FExit>(ebpf, object, program, |p| p.load(&target, btf))?
                        .attach()
                        .map_err(attach_err)?;
                }
            }
            AttachMode::Kprobe | AttachMode::Kretprobe => {
                loaded::<KProbe>(ebpf, object, program, |p| p.load())?
                    .attach(&target, 0)
                    .map_err(attach_err)?;
            }
            AttachMode::PerfEvent => {
                return Err(no_mode(
                    "perf events attach per CPU with a frequency: use attach_cpu_clock".into(),
                ))
            }
        }
        self.links.push((program, target));
        self.record(program, mode, hook.event.to_string());
        Ok(())
    }

    /// Attaches perf-event `program` to the software CPU clock of every online CPU, sampling
    /// `freq` times a second (`PERF_COUNT_SW_CPU_CLOCK`: present in virtual machines that lack
    /// a hardware PMU).
    pub fn attach_cpu_clock(&mut self, program: &'static str, freq: u64) -> Result<(), LoadError> {
        let cpus = aya::util::online_cpus().map_err(|(_, e)| LoadError::Attach {
            program: program.into(),
            target: "online CPUs".into(),
            source: Box::new(ProgramError::IOError(e)),
        })?;
        let p = loaded::<PerfEvent>(&mut self.ebpf, self.object, program, |p| p.load())?;
        for cpu in cpus {
            p.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(freq),
                false,
            )
            .map_err(|source| LoadError::Attach {
                program: program.into(),
                target: format!("cpu-clock on CPU {cpu}"),
                source: Box::new(source),
            })?;
        }
        self.record(program, AttachMode::PerfEvent, "cpu-clock".into());
        self.fill_ids();
        Ok(())
    }

    /// Links whose close waits for an RCU grace period (classic tracepoints, kprobes): see
    /// [`crate::kernel::loader::detach_in_background`].
    pub fn slow_links(&self) -> usize {
        self.attached
            .iter()
            .filter(|a| {
                matches!(
                    a.mode,
                    AttachMode::Tracepoint | AttachMode::Kprobe | AttachMode::Kretprobe
                )
            })
            .map(|a| a.targets.len())
            .sum()
    }
}

/// How every hook of a tool will attach on this kernel (the policy `doctor` reports, decided
/// before loading, so a tool sets the globals of the chosen mode): an error naming the first
/// required hook that cannot attach at all.
pub fn plan(hooks: &[Hook], env: &Env, symbols: &Symbols) -> Result<Vec<Choice>, LoadError> {
    let choices = choose_all(hooks, env, symbols);
    if !choices.is_empty() && choices.iter().all(|c| c.mode.is_none()) {
        // Nothing at all can attach: say why for the first hook, mode by mode.
        let c = &choices[0];
        let why: Vec<String> = c
            .rejected
            .iter()
            .map(|(m, w)| format!("{}: {w}", m.as_str()))
            .collect();
        return Err(LoadError::NoMode {
            event: c.event.to_string(),
            why: if why.is_empty() {
                c.why.clone()
            } else {
                why.join("; ")
            },
            permission: env.tracefs_denied(),
        });
    }
    if let Some(c) = choices.iter().find(|c| !c.optional && c.mode.is_none()) {
        let why = c
            .rejected
            .last()
            .map(|(_, w)| w.clone())
            .unwrap_or(c.why.clone());
        return Err(LoadError::NoMode {
            event: c.event.to_string(),
            why,
            permission: env.tracefs_denied(),
        });
    }
    Ok(choices)
}

/// Program `program` of the object as its type `P`, loaded into the kernel by `load` unless it
/// already is (one program may serve several hooks).
fn loaded<'a, P>(
    ebpf: &'a mut Ebpf,
    object: &'static str,
    program: &str,
    mut load: impl FnMut(&mut P) -> Result<(), ProgramError>,
) -> Result<&'a mut P, LoadError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(program)
        .ok_or_else(|| LoadError::NoProgram {
            object,
            program: program.into(),
        })?;
    let is_loaded = prog.fd().is_ok();
    let p: &'a mut P = prog.try_into().map_err(|e| prog_load_err(program, e))?;
    if !is_loaded {
        crate::kernel::retry_eagain(|| load(&mut *p), crate::kernel::program_io_error)
            .map_err(|e| prog_load_err(program, e))?;
    }
    Ok(p)
}

/// The BTF stub to load a program on `name` with: `cached` when it covers `name`, else one
/// `build` makes from the kernel's BTF (kept in `own`). `None` when the kernel lacks `name`.
fn stub_for<'s>(
    cached: Option<&'s aya::Btf>,
    name: &str,
    own: &'s mut Option<aya::Btf>,
    build: impl FnOnce(&crate::kernel::btf::Btf) -> Option<aya::Btf>,
) -> Option<&'s aya::Btf> {
    match cached {
        Some(stub) if stub_has(stub, name) => Some(stub),
        _ => {
            *own = crate::kernel::btf::vmlinux().ok().and_then(build);
            own.as_ref()
        }
    }
}

fn stub_has(stub: &aya::Btf, name: &str) -> bool {
    use aya_obj::btf::BtfKind;
    stub.id_by_type_name_kind(name, BtfKind::Typedef).is_ok()
        || stub.id_by_type_name_kind(name, BtfKind::Func).is_ok()
}
