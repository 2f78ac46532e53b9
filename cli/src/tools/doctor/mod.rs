//! `tracekit doctor`: what every tool will do on this kernel, and why, before anyone traces.
//!
//! For each visible tool of the registry (`tools::TOOLS`), each mode of a tool with hooks of its
//! own (`tools::MODES`: `profile --off-cpu`), and each of their hooks: the attach mode
//! and program the tool's own `open` will use, the reasons cheaper modes were rejected, group
//! decisions, and the tracepoint fields found or missing with their offsets and sizes, all from
//! the one attach policy the loader follows (`kernel::hooks::choose_all`, with the `Env` and
//! `Symbols` a tool's `OpenCtx` holds); then per tool whether it can run
//! (`kernel::hooks::tool_verdict`, after the start-up checks every tool makes). Before that, the
//! node ([`node::System`]): kernel, privileges, BTF, tracefs (mounted here if absent, as the
//! tools do), the probes, cgroups, NUMA, THP, I/O schedulers, conntrack, lockdown.
//!
//! Output goes through the tools' path: a [`Sink`] (`--output`), text or NDJSON rendered from
//! [`Output`]s. JSON lines: `system`, one `hook` per tool and hook, one `tool` per tool, and a
//! `summary`. Exit 0 when every tool can run, 6 when some cannot, 3 without the privileges to
//! tell. Loads only the throw-away probe programs of `kernel::features`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::{
    engine::{RunOpts, Scope},
    error::{Error, Result},
    host::proc,
    kernel::hooks::{self, choose_all_with_facts, Choice, Env, Facts, Hook, Symbols},
    report::{
        output::Sink,
        render::{self, Output},
        rows::{Column, Ctx, Section},
    },
    tools::{self, OpenCtx, ToolInfo},
};

pub mod node;

use node::System;

pub const INFO: ToolInfo = ToolInfo::command(
    "doctor",
    "What every tool will do on this kernel, and why: each hook's attach mode and program (and why cheaper modes were rejected), the fields it reads at which offsets, whether each tool can run; and the node's facts (privileges, BTF, tracefs, cgroups and the container layouts recognised, NUMA, THP, I/O schedulers, conntrack).",
);

/// doctor's tables: facts, no measures.
const HOOK_ROWS: crate::report::schema::Rows = crate::report::schema::Rows::plain("hook");
const TOOL_ROWS: crate::report::schema::Rows = crate::report::schema::Rows::plain("tool");

const EXAMPLES: &str = "  tracekit doctor                                  # what each tool will do on this kernel, and why
  tracekit doctor --json --output doctor.ndjson    # the same as NDJSON, to compare nodes";

const NEEDS: &str = "root, or CAP_BPF and CAP_PERFMON (its feature probes load programs); it \
reads tracefs with CAP_DAC_READ_SEARCH and mounts it with CAP_SYS_ADMIN. Run without them it \
says what is missing and exits 3.";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    /// NDJSON output: a `system` line, one `hook` line per tool and hook, one `tool` line per
    /// tool, and a `summary` line.
    #[arg(long)]
    pub json: bool,

    /// Write the report to FILE (as the tools do: replaced atomically when complete; a device
    /// or FIFO is written directly).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
}

/// A cheaper mode the kernel does not allow, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejected {
    pub mode: &'static str,
    pub why: String,
}

/// Where a field is in the event's record: layouts differ between kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FieldAt {
    pub offset: u32,
    pub size: u32,
}

/// One hook of one tool: the JSON `hook` line and a row of the tool's table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HookRow {
    #[serde(rename = "for")]
    pub tool: &'static str,
    pub event: &'static str,
    pub optional: bool,
    /// When the tool attaches the hook, if not on every run ([`Hook::when`]).
    pub when: Option<&'static str>,
    /// Hooks of one group attach in one mode.
    pub group: Option<&'static str>,
    /// The chosen mode, `None` when the hook cannot attach.
    pub mode: Option<&'static str>,
    pub program: Option<&'static str>,
    /// Where the program attaches: the event, the raw tracepoint or the kernel function.
    pub target: Option<&'static str>,
    pub why: String,
    pub rejected: Vec<Rejected>,
    pub fields_found: Vec<&'static str>,
    pub fields_missing: Vec<&'static str>,
    pub layout: BTreeMap<&'static str, FieldAt>,
    /// Why the event's format could not be read, if it could not.
    pub format_error: Option<String>,
}

impl crate::report::rows::Row for HookRow {}

impl HookRow {
    fn new(tool: &'static str, hook: &Hook, c: &Choice, f: &Facts) -> HookRow {
        let (mut found, mut missing, mut layout) = (Vec::new(), Vec::new(), BTreeMap::new());
        let format_error = match f.format() {
            Ok(fmt) => {
                for &name in hook.fields {
                    match fmt.field(name) {
                        Ok(x) => {
                            found.push(name);
                            layout.insert(
                                name,
                                FieldAt {
                                    offset: x.offset,
                                    size: x.size,
                                },
                            );
                        }
                        Err(_) => missing.push(name),
                    }
                }
                None
            }
            Err(e) => Some(e.clone()),
        };
        HookRow {
            tool,
            event: hook.event,
            optional: hook.optional,
            when: (!hook.when.is_empty()).then_some(hook.when),
            group: (!hook.group.is_empty()).then_some(hook.group),
            mode: c.mode.map(|(m, _)| m.as_str()),
            program: c.mode.map(|(_, p)| p),
            target: c.mode.map(|(m, _)| hook.attach_target(m)),
            why: c.why.clone(),
            rejected: c
                .rejected
                .iter()
                .map(|(m, why)| Rejected {
                    mode: m.as_str(),
                    why: why.clone(),
                })
                .collect(),
            fields_found: found,
            fields_missing: missing,
            layout,
            format_error,
        }
    }

    /// `prev_pid@24/4 next_pid@56/4`, then the missing ones.
    fn fields_text(&self) -> String {
        let mut parts: Vec<String> = self
            .fields_found
            .iter()
            .map(|n| {
                let at = self.layout[n];
                format!("{n}@{}/{}", at.offset, at.size)
            })
            .collect();
        parts.extend(self.fields_missing.iter().map(|n| format!("{n}:MISSING")));
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(" ")
        }
    }

    /// The reason for the choice, what is skipped, and why each cheaper mode was not used.
    fn why_text(&self) -> String {
        let mut s = self.why.clone();
        if self.mode.is_none() && self.optional {
            s.push_str(" (optional: the tool skips it)");
        }
        if let (Some(_), Some(w)) = (self.mode, self.when) {
            s.push_str(&format!("; attached only for {w}"));
        }
        // A group's reason may already name the hook's own (`which this hook cannot (…)`).
        for r in self.rejected.iter().filter(|r| !self.why.contains(&r.why)) {
            s.push_str(&format!("; not {}: {}", r.mode, r.why));
        }
        s
    }
}

const HOOK_COLUMNS: &[Column<HookRow>] = &[
    Column::left("EVENT", |r, _| r.event.to_string()),
    Column::left("MODE", |r, _| r.mode.unwrap_or("NONE").to_string()),
    Column::left("PROGRAM", |r, _| r.program.unwrap_or("-").to_string()),
    Column::left("FIELDS", |r, _| r.fields_text()),
    Column::left("WHY", |r, _| r.why_text()),
];

/// [`HOOK_COLUMNS`] with the group, for tools with grouped hooks.
const GROUPED_HOOK_COLUMNS: &[Column<HookRow>] = &[
    Column::left("EVENT", |r, _| r.event.to_string()),
    Column::left("GROUP", |r, _| r.group.unwrap_or("-").to_string()),
    Column::left("MODE", |r, _| r.mode.unwrap_or("NONE").to_string()),
    Column::left("PROGRAM", |r, _| r.program.unwrap_or("-").to_string()),
    Column::left("FIELDS", |r, _| r.fields_text()),
    Column::left("WHY", |r, _| r.why_text()),
];

/// One tool's verdict: the JSON `tool` line and a row of the closing table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolRow {
    pub name: &'static str,
    pub can_run: bool,
    pub why: String,
    pub hooks: usize,
    pub usable: usize,
}

impl crate::report::rows::Row for ToolRow {}

impl ToolRow {
    fn verdict(&self) -> &'static str {
        if self.can_run {
            "can run"
        } else {
            "CANNOT run"
        }
    }
}

const TOOL_COLUMNS: &[Column<ToolRow>] = &[
    Column::left("TOOL", |r, _| r.name.to_string()),
    Column::left("VERDICT", |r, _| r.verdict().to_string()),
    Column::right("HOOKS", |r, _| format!("{}/{}", r.usable, r.hooks)),
    Column::left("WHY", |r, _| r.why.clone()),
];

/// Everything doctor found about one tool.
#[derive(Clone, Debug)]
pub struct ToolReport {
    pub tool: ToolRow,
    pub hooks: Vec<HookRow>,
}

/// Whether a tool can run: the start-up checks every tool makes first (privileges, a BTF file
/// that exists but does not parse), then the attach policy's verdict on its hooks.
pub fn verdict(sys: &System, tool: &ToolInfo, choices: &[Choice]) -> (bool, String) {
    if sys.unprivileged() {
        return (
            false,
            format!(
                "not permitted: tracekit lacks {}",
                proc::cap_list(&sys.missing)
            ),
        );
    }
    if let Some(r) = &sys.preflight_refusal {
        return (false, r.clone());
    }
    if tool.needs_btf && !crate::kernel::features::btf_present() {
        return (
            false,
            format!(
                "needs the kernel's BTF ({}) for struct offsets, whatever the attach mode",
                crate::kernel::btf::vmlinux_path().display()
            ),
        );
    }
    hooks::tool_verdict(choices)
}

/// What the attach policy decides for every hook of `tool`, with the same `Env` and `Symbols`
/// a tool's `open` gets, and the verdict.
pub fn examine(tool: &ToolInfo, sys: &System, env: &Env, symbols: &Symbols) -> ToolReport {
    let picks = choose_all_with_facts(tool.hooks, env, symbols);
    let hooks: Vec<HookRow> = tool
        .hooks
        .iter()
        .zip(&picks)
        .map(|(h, (c, f))| HookRow::new(tool.name, h, c, f))
        .collect();
    let choices: Vec<Choice> = picks.into_iter().map(|(c, _)| c).collect();
    let (can_run, why) = verdict(sys, tool, &choices);
    ToolReport {
        tool: ToolRow {
            name: tool.name,
            can_run,
            why,
            hooks: hooks.len(),
            usable: hooks.iter().filter(|h| h.mode.is_some()).count(),
        },
        hooks,
    }
}

/// doctor's whole answer.
pub struct Report {
    pub system: System,
    pub tools: Vec<ToolReport>,
}

impl Report {
    pub fn build<'a>(
        system: System,
        tools: impl IntoIterator<Item = &'a ToolInfo>,
        env: &Env,
        symbols: &Symbols,
    ) -> Report {
        let tools = tools
            .into_iter()
            .map(|t| examine(t, &system, env, symbols))
            .collect();
        Report { system, tools }
    }

    fn runnable(&self) -> usize {
        self.tools.iter().filter(|t| t.tool.can_run).count()
    }

    /// The node (title, facts, the `system` line), then the tools (one table per tool, the
    /// verdicts, the `summary` line).
    pub fn outputs(&self) -> [Output; 2] {
        let mut system = serde_json::to_value(&self.system).unwrap_or(Value::Null);
        system["type"] = "system".into();
        let node = Output {
            title: self.system.title(),
            notes: self.system.lines(),
            extra_json: vec![system],
            ..Default::default()
        };
        let ctx = Ctx { secs: 0.0 };
        let mut sections: Vec<Section> = self
            .tools
            .iter()
            .map(|t| {
                let grouped = t.hooks.iter().any(|h| h.group.is_some());
                let cols = if grouped {
                    GROUPED_HOOK_COLUMNS
                } else {
                    HOOK_COLUMNS
                };
                Section::build(&HOOK_ROWS, &t.hooks, cols, &ctx, 0).caption(format!(
                    "{}: {} ({})",
                    t.tool.name,
                    t.tool.verdict(),
                    t.tool.why
                ))
            })
            .collect();
        let rows: Vec<ToolRow> = self.tools.iter().map(|t| t.tool.clone()).collect();
        sections.push(Section::build(&TOOL_ROWS, &rows, TOOL_COLUMNS, &ctx, 0));
        let (n, ok) = (self.tools.len(), self.runnable());
        let closing = if self.system.unprivileged() {
            format!(
                "Not permitted: run doctor as root (or with {}) to see what this kernel allows.",
                proc::cap_list(proc::TOOL_CAPS)
            )
        } else {
            format!("{ok} of {n} tool(s) can run on this kernel.")
        };
        let (composed, composed_json) = composed();
        let tools = Output {
            sections,
            footnotes: vec![composed, closing],
            extra_json: vec![
                composed_json,
                json!({"type": "summary", "tools": n, "runnable": ok}),
            ],
            ..Default::default()
        };
        [node, tools]
    }

    /// Text, or NDJSON with `tool` and `type` on every line (added by the renderer).
    pub fn render(&self, json: bool) -> String {
        let outs = self.outputs();
        if json {
            outs.iter()
                .map(|o| render::json(o, INFO.name, &Map::new(), &Map::new()))
                .collect()
        } else {
            outs.iter()
                .map(|o| render::text(o, false))
                .collect::<Vec<_>>()
                .join("")
        }
    }

    /// The exit status: 3 without the privileges to tell, 6 when some tool cannot run.
    pub fn result(&self) -> Result<()> {
        let sys = &self.system;
        if sys.unprivileged() {
            return Err(Error::Permission(format!(
                "doctor cannot tell what this kernel allows without {} (missing: {}): run it as root",
                proc::cap_list(proc::TOOL_CAPS),
                proc::cap_list(&sys.missing)
            )));
        }
        let cannot: Vec<String> = self
            .tools
            .iter()
            .filter(|t| !t.tool.can_run)
            .map(|t| format!("{} ({})", t.tool.name, t.tool.why))
            .collect();
        if cannot.is_empty() {
            return Ok(());
        }
        Err(Error::ToolsUnavailable(format!(
            "{} of {} tool(s) cannot run on this kernel: {}",
            cannot.len(),
            self.tools.len(),
            cannot.join("; ")
        )))
    }
}

/// triage's plan (serve's and record's too, with their `--tools`): the events several of its
/// collectors attach to, and how many programs each costs there (`tools::composed_plan`).
fn composed() -> (String, Value) {
    let triage: Vec<&ToolInfo> = tools::TOOLS
        .iter()
        .filter(|t| t.triage && !t.hidden)
        .collect();
    let plan = tools::composed_plan(&triage);
    let text = plan
        .iter()
        .map(|(event, progs)| {
            let each: Vec<String> = progs.iter().map(|names| names.join(" + ")).collect();
            format!(
                "{event} runs {} program(s) ({})",
                progs.len(),
                each.join("; ")
            )
        })
        .collect::<Vec<_>>();
    let text = if text.is_empty() {
        "Run together (triage, serve, record), no two collectors share a hook.".to_string()
    } else {
        format!(
            "Run together (triage, serve, record), collectors declaring one hook table share one object, one program per hook doing their union: {}.",
            text.join(", ")
        )
    };
    let json = json!({
        "type": "composed",
        "events": plan
            .iter()
            .map(|(event, progs)| json!({"event": event, "programs": progs}))
            .collect::<Vec<_>>(),
    });
    (text, json)
}

pub fn run(args: Args) -> Result<()> {
    // The report goes where a tool's would, checked before any probing.
    let mut sink = Sink::open(args.output.as_deref(), false)?;
    let ctx = OpenCtx::new(
        Scope::default(),
        RunOpts {
            json: args.json,
            ..Default::default()
        },
    );
    let system = System::read(&ctx.env);
    // Each tool, and each mode of a tool that attaches hooks of its own (`profile --off-cpu`).
    let visible = tools::TOOLS
        .iter()
        .chain(tools::MODES)
        .filter(|t| !t.hidden);
    let report = Report::build(system, visible, &ctx.env, &ctx.symbols);
    // A reader that went away (`doctor | head -1`) ends nothing early: the verdict still
    // decides the exit code.
    match sink.write(&report.render(ctx.opts.json)) {
        Err(e) if !e.is_broken_pipe() => return Err(e.into()),
        _ => sink.finish()?,
    }
    report.result()
}

#[cfg(test)]
mod tests;
