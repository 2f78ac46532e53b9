use std::path::{Path, PathBuf};

use super::{node::*, *};
use crate::{
    error::Exit,
    host::numa::Topology,
    kernel::{
        features::Probe,
        hooks::AttachMode::{Fentry, Kprobe, RawTp, TpBtf, Tracepoint},
        loader,
        tracefs::Tracefs,
    },
};

/// On this kernel, with the `Env` and `Symbols` of an `OpenCtx` as `run` builds them, doctor's
/// mode and program for every hook of every registered tool (hidden ones included) and of every
/// mode with hooks of its own (`profile --off-cpu`) are those `loader::plan` gives a tool's
/// `open` with its own, separately probed `Env`; a tool the plan refuses is one doctor says
/// cannot run.
#[test]
fn modes_are_what_the_loader_plans_for_every_registered_tool() {
    let ctx = OpenCtx::new(Scope::default(), RunOpts::default());
    let all = || tools::TOOLS.iter().chain(tools::MODES);
    let report = Report::build(System::read(&ctx.env), all(), &ctx.env, &ctx.symbols);
    assert_eq!(report.tools.len(), all().count());
    let (env, symbols) = (Env::detect(), Symbols::default());
    let mut compared = 0;
    for (info, r) in all().zip(&report.tools) {
        assert_eq!(r.tool.name, info.name);
        assert_eq!(r.hooks.len(), info.hooks.len(), "{}", info.name);
        match loader::plan(info.hooks, &env, &symbols) {
            Ok(plan) => {
                for (c, h) in plan.iter().zip(&r.hooks) {
                    assert_eq!(c.event, h.event);
                    assert_eq!(
                        c.mode.map(|(m, _)| m.as_str()),
                        h.mode,
                        "{}: {h:?}",
                        info.name
                    );
                    assert_eq!(c.mode.map(|(_, p)| p), h.program, "{}: {h:?}", info.name);
                    assert_eq!(c.why, h.why, "{}", info.name);
                    compared += 1;
                }
                if !report.system.unprivileged() && report.system.preflight_refusal.is_none() {
                    assert_eq!(r.tool.can_run, hooks::tool_verdict(&plan).0, "{:?}", r.tool);
                }
            }
            Err(e) => assert!(
                !r.tool.can_run,
                "{}: the loader refuses ({e}) but doctor says it can run",
                info.name
            ),
        }
    }
    assert!(compared > 0, "no hook compared");
}

/// `profile --off-cpu` is an entry of its own in doctor's report: the hooks that mode attaches
/// (the wakeup, then the switch), with the program the off-CPU object names for each, while
/// `profile`'s entry keeps the CPU clock alone; and in doctor's JSON, one `hook` line each for
/// it and a `tool` line whose hook count matches.
#[test]
fn off_cpu_is_its_own_entry_with_its_hooks() {
    let ctx = OpenCtx::new(Scope::default(), RunOpts::default());
    let report = Report::build(
        System::read(&ctx.env),
        tools::TOOLS.iter().chain(tools::MODES),
        &ctx.env,
        &ctx.symbols,
    );
    let entry = |name: &str| {
        report
            .tools
            .iter()
            .find(|t| t.tool.name == name)
            .unwrap_or_else(|| panic!("doctor has no entry {name}"))
    };
    let off = entry("profile --off-cpu");
    let events: Vec<&str> = off.hooks.iter().map(|h| h.event).collect();
    assert_eq!(events, ["sched:sched_waking", "sched:sched_switch"]);
    for h in &off.hooks {
        assert_eq!(h.tool, "profile --off-cpu");
        if let Some(p) = h.program {
            assert!(p.starts_with("tk_offcpu_"), "{h:?}");
        }
    }
    assert!(!off.hooks[1].optional && off.hooks[0].optional);
    let on: Vec<&str> = entry("profile").hooks.iter().map(|h| h.event).collect();
    assert_eq!(on, ["cpu-clock"]);
    let lines: Vec<Value> = report
        .render(true)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let hooks = lines
        .iter()
        .filter(|l| l["type"] == "hook" && l["for"] == "profile --off-cpu")
        .count();
    let tool = lines
        .iter()
        .find(|l| l["type"] == "tool" && l["name"] == "profile --off-cpu")
        .expect("a tool line for profile --off-cpu");
    assert_eq!((hooks, tool["hooks"].as_u64()), (2, Some(2)));
}

fn probe(ok: bool, why: &str) -> Probe {
    Probe {
        available: ok,
        why: why.into(),
    }
}

/// A tracefs tree holding the fixture formats of sched_switch and kfree_skb (without `reason`).
fn fixture_tracefs() -> PathBuf {
    let formats = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats");
    let root = std::env::temp_dir().join(format!(
        "tk-doctor-tracefs-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    for (file, event) in [
        ("sched_switch.x86_64", "sched/sched_switch"),
        ("kfree_skb.no_reason", "skb/kfree_skb"),
    ] {
        let dir = root.join("events").join(event);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(formats.join(file), dir.join("format")).unwrap();
    }
    root
}

/// A kernel without raw tracepoints, fentry or kprobes, whose tracefs is the fixture tree.
fn fixture_env(tracefs: &Path) -> Env {
    Env::fixed(
        false,
        probe(false, "EPERM in a test"),
        probe(false, "no trampolines in a test"),
        probe(false, "no kprobe PMU in a test"),
        Ok(Tracefs::at(tracefs)),
    )
}

fn system(capeff: u64, btf_error: Option<&str>) -> System {
    System::new(
        HostFacts {
            kernel: Some("6.18.0-test".into()),
            euid: if capeff == 0 { 65534 } else { 0 },
            capeff,
            topology: Topology::read_from(Path::new("/nonexistent"), 2),
            settings: Settings {
                lockdown_error: Some("absent".into()),
                ..Default::default()
            },
            ..Default::default()
        },
        KernelFacts {
            btf_path: "/sys/kernel/btf/vmlinux".into(),
            btf_present: true,
            btf_error: btf_error.map(String::from),
            ..Default::default()
        },
    )
}

const SWITCH: Hook = Hook {
    fields: &["prev_pid", "next_pid", "prev_state"],
    programs: &[
        (TpBtf, "tk_sw_btf"),
        (RawTp, "tk_sw_raw"),
        (Tracepoint, "tk_sw_tp"),
    ],
    ..Hook::event("sched:sched_switch")
};
const DROP: Hook = Hook {
    fields: &["skbaddr", "reason"],
    programs: &[(Tracepoint, "tk_drop")],
    ..Hook::event("skb:kfree_skb")
};
const PAIR_A: Hook = Hook {
    fields: &["prev_pid"],
    programs: &[(Tracepoint, "tk_a")],
    optional: true,
    group: "pair",
    ..Hook::event("sched:sched_switch")
};
const PAIR_B: Hook = Hook {
    programs: &[(Tracepoint, "tk_b")],
    optional: true,
    group: "pair",
    ..Hook::event("sched:sched_wakeup")
};
const FUNC: Hook = Hook {
    programs: &[(Fentry, "tk_f"), (Kprobe, "tk_k")],
    optional: true,
    ..Hook::event("migrate_misplaced_folio")
};

const fn fake(name: &'static str, hooks: &'static [Hook]) -> ToolInfo {
    ToolInfo {
        name,
        summary: "",
        hooks,
        triage: false,
        hidden: false,
        needs_btf: false,
        rows: &[],
        causes: &[],
        by_container: false,
        joins: &[],
    }
}

const BROKEN: ToolInfo = fake("broken", &[SWITCH, DROP, FUNC]);
const GROUPED: ToolInfo = fake("grouped", &[PAIR_A, PAIR_B]);

fn fixture_report(sys: System) -> Report {
    let dir = fixture_tracefs();
    let env = fixture_env(&dir);
    let r = Report::build(sys, [&BROKEN, &GROUPED], &env, &Symbols::default());
    let _ = std::fs::remove_dir_all(dir);
    r
}

#[test]
fn fixture_kernel_hooks_fall_back_and_say_why() {
    let r = fixture_report(system(u64::MAX, None));
    let [sw, drop, func] = &r.tools[0].hooks[..] else {
        panic!("{:?}", r.tools[0].hooks)
    };
    assert_eq!(sw.mode, Some("tracepoint"));
    assert_eq!(sw.program, Some("tk_sw_tp"));
    assert_eq!(sw.target, Some("sched:sched_switch"));
    assert_eq!(sw.why, "tracefs format has prev_pid, next_pid, prev_state");
    let modes: Vec<&str> = sw.rejected.iter().map(|x| x.mode).collect();
    assert_eq!(modes, ["tp_btf", "raw_tp"]);
    assert!(sw.rejected[0].why.contains("EPERM in a test"), "{sw:?}");
    assert_eq!(
        sw.layout["prev_pid"],
        FieldAt {
            offset: 24,
            size: 4
        }
    );
    assert_eq!(
        sw.layout["next_pid"],
        FieldAt {
            offset: 56,
            size: 4
        }
    );
    assert_eq!(
        sw.fields_text(),
        "prev_pid@24/4 next_pid@56/4 prev_state@32/8"
    );
    // kfree_skb without `reason`: the only mode fails on the field, and the tool cannot run.
    assert_eq!(drop.mode, None);
    assert_eq!(drop.fields_found, ["skbaddr"]);
    assert_eq!(drop.fields_missing, ["reason"]);
    assert!(
        drop.rejected[0].why.contains("lacks field(s) reason"),
        "{drop:?}"
    );
    assert!(drop.fields_text().ends_with("reason:MISSING"));
    // A function: neither fentry nor kprobes here; no format, and it says why.
    assert_eq!(func.mode, None);
    assert!(
        func.rejected[1].why.starts_with("kprobes unavailable"),
        "{func:?}"
    );
    assert!(func
        .format_error
        .as_deref()
        .unwrap()
        .contains("is a function"));
    assert!(func
        .why_text()
        .contains("(optional: the tool skips it); not fentry: fentry unavailable"));
    let t = &r.tools[0].tool;
    assert!(!t.can_run);
    assert_eq!(
        t.why,
        "required hook skb:kfree_skb cannot attach (format lacks field(s) reason)"
    );
    assert_eq!((t.hooks, t.usable), (3, 1));
    // The group attaches as the mode that works for A; B, without a format, is skipped and
    // the reason names the group.
    let g = &r.tools[1];
    assert_eq!(g.hooks[0].group, Some("pair"));
    assert_eq!(g.hooks[0].mode, Some("tracepoint"));
    assert_eq!(g.hooks[1].mode, None);
    assert!(
        g.hooks[1]
            .why
            .starts_with("group pair attaches as tracepoint, which this hook cannot"),
        "{:?}",
        g.hooks[1]
    );
    assert!(g.tool.can_run, "{:?}", g.tool);
    assert!(g
        .tool
        .why
        .contains("skipped (optional): sched:sched_wakeup"));
}

#[test]
fn text_report_has_a_table_per_tool_and_the_verdicts() {
    let r = fixture_report(system(u64::MAX, None));
    let text = r.render(false);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("tracekit doctor: Linux 6.18.0-test, running as root"));
    assert!(lines[1].starts_with("  BTF "), "{text}");
    for needle in [
        "\nbroken: CANNOT run (required hook skb:kfree_skb cannot attach (format lacks field(s) reason))\nEVENT ",
        "\ngrouped: can run (1 of 2 hooks attach; skipped (optional): sched:sched_wakeup)\nEVENT               GROUP  MODE ",
        "\nTOOL     VERDICT     HOOKS  WHY\n",
        "\nbroken   CANNOT run    1/3  required hook",
        "\n1 of 2 tool(s) can run on this kernel.\n",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    let sw = lines
        .iter()
        .find(|l| l.starts_with("sched:sched_switch       tracepoint  tk_sw_tp"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        sw.contains("tk_sw_tp  prev_pid@24/4 next_pid@56/4 prev_state@32/8  tracefs format has"),
        "{sw}"
    );
    assert!(
        sw.contains("; not tp_btf: raw tracepoints unavailable: EPERM in a test"),
        "{sw}"
    );
    assert!(
        text.contains(
            "\nskb:kfree_skb            NONE        -         skbaddr@8/8 reason:MISSING "
        ),
        "{text}"
    );
    // A group's reason is said once, not again among the rejected modes.
    let wakeup = lines
        .iter()
        .find(|l| l.starts_with("sched:sched_wakeup"))
        .unwrap();
    assert_eq!(
        wakeup
            .matches("tracefs has no event sched:sched_wakeup")
            .count(),
        1,
        "{wakeup}"
    );
}

#[test]
fn json_lines_keep_their_types_and_keys() {
    let r = fixture_report(system(u64::MAX, None));
    let lines: Vec<Value> = r
        .render(true)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["system", "hook", "hook", "hook", "hook", "hook", "tool", "tool", "composed", "summary"]
    );
    assert!(lines.iter().all(|l| l["tool"] == "doctor"));
    // triage's plan: ctxsw, runq-lat and numa share one program on sched_switch.
    let switch = lines[8]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"] == "sched:sched_switch")
        .unwrap();
    assert_eq!(switch["programs"], json!([["ctxsw", "runq-lat", "numa"]]));
    assert_eq!(lines[0]["kernel"], "6.18.0-test");
    let sw = &lines[1];
    assert_eq!(sw["for"], "broken");
    assert_eq!(sw["event"], "sched:sched_switch");
    assert_eq!(sw["mode"], "tracepoint");
    assert_eq!(sw["program"], "tk_sw_tp");
    assert_eq!(sw["layout"]["prev_state"], json!({"offset": 32, "size": 8}));
    assert_eq!(
        sw["rejected"][1],
        json!({"mode": "raw_tp", "why": "raw tracepoints unavailable: EPERM in a test"})
    );
    assert_eq!(sw["group"], Value::Null);
    let drop = &lines[2];
    assert_eq!(drop["mode"], Value::Null);
    assert_eq!(drop["fields_missing"], json!(["reason"]));
    assert_eq!(drop["format_error"], Value::Null);
    assert_eq!(lines[4]["group"], "pair");
    assert_eq!(
        lines[6],
        json!({"tool": "doctor", "type": "tool", "name": "broken", "can_run": false,
               "why": "required hook skb:kfree_skb cannot attach (format lacks field(s) reason)",
               "hooks": 3, "usable": 1})
    );
    assert_eq!(
        lines[9],
        json!({"tool": "doctor", "type": "summary", "tools": 2, "runnable": 1})
    );
}

#[test]
fn exit_codes_follow_the_verdicts() {
    let r = fixture_report(system(u64::MAX, None));
    let e = r.result().unwrap_err();
    assert_eq!(e.exit(), Exit::ToolsUnavailable);
    assert!(
        e.to_string()
            .starts_with("1 of 2 tool(s) cannot run on this kernel: broken (required hook"),
        "{e}"
    );
    // Only the runnable tool: exit 0.
    let dir = fixture_tracefs();
    let env = fixture_env(&dir);
    let ok = Report::build(
        system(u64::MAX, None),
        [&GROUPED],
        &env,
        &Symbols::default(),
    );
    assert!(ok.result().is_ok());
    // A BTF file that does not parse: every tool's start-up refuses it, so none can run.
    let bad = Report::build(
        system(u64::MAX, Some("x: not BTF")),
        [&GROUPED],
        &env,
        &Symbols::default(),
    );
    assert!(!bad.tools[0].tool.can_run);
    assert!(
        bad.tools[0].tool.why.contains("unusable: x: not BTF"),
        "{:?}",
        bad.tools[0].tool
    );
    assert_eq!(bad.result().unwrap_err().exit(), Exit::ToolsUnavailable);
    let _ = std::fs::remove_dir_all(dir);
    // Without CAP_BPF and CAP_PERFMON: exit 3, and no "cannot run on this kernel".
    let r = fixture_report(system(0, None));
    let e = r.result().unwrap_err();
    assert_eq!(e.exit(), Exit::Permission);
    let msg = e.to_string();
    assert!(
        msg.contains("CAP_BPF") && msg.contains("run it as root"),
        "{msg}"
    );
    assert!(r.tools.iter().all(|t| t
        .tool
        .why
        .starts_with("not permitted: tracekit lacks CAP_BPF and CAP_PERFMON")));
    assert!(r
        .render(false)
        .contains("\nNot permitted: run doctor as root"));
}

/// Issue #32: a program a hook table names but the object lacks fails only on a kernel that
/// picks that mode (a renamed `_raw` fallback fails on 5.10 alone). Rootless: every embedded
/// object is parsed from the ELF, nothing is loaded. Every tool's (and mode's) programs live in
/// one object, which also holds the maps every session uses (`CONTROL` for the generation,
/// `STATS` for what could not be recorded).
#[test]
fn every_program_a_hook_table_names_is_in_one_embedded_object() {
    let dir = std::path::Path::new(env!("OUT_DIR"));
    let mut objects = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let bytes = match std::fs::read(e.path()) {
            Ok(b) if b.starts_with(b"\x7fELF") => b,
            _ => continue,
        };
        let obj = aya_obj::Object::parse(&bytes)
            .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
        let name = e.file_name().to_string_lossy().into_owned();
        objects.push((name, obj));
    }
    assert!(objects.len() >= 8, "embedded objects: {}", objects.len());
    for t in crate::tools::TOOLS.iter().chain(crate::tools::MODES) {
        let progs: Vec<&str> = t
            .hooks
            .iter()
            .flat_map(|h| h.programs.iter().map(|(_, p)| *p))
            .collect();
        if progs.is_empty() {
            continue;
        }
        let Some((name, obj)) = objects
            .iter()
            .find(|(_, o)| progs.iter().all(|p| o.programs.contains_key(*p)))
        else {
            let missing: Vec<String> = objects
                .iter()
                .map(|(n, o)| {
                    let m: Vec<&&str> = progs
                        .iter()
                        .filter(|p| !o.programs.contains_key(**p))
                        .collect();
                    format!("{n} lacks {m:?}")
                })
                .collect();
            panic!("{}: no object holds all its programs: {missing:#?}", t.name);
        };
        if t.name != "bench-floor" {
            for map in ["CONTROL", "STATS"] {
                assert!(
                    obj.maps.contains_key(map),
                    "{}: object {name} has no map {map} (maps: {:?})",
                    t.name,
                    obj.maps.keys().collect::<Vec<_>>()
                );
            }
        }
    }
}

/// Issue #32: a map name userspace asks for (`GenMap::take`, `take_map`, `map`/`map_mut`,
/// `max_entries`) that the object lacks fails only at run time, on a root run that loads it.
/// Rootless: every such name in a tool's source is a map of the object that source loads (the
/// file's own `object!`, else its folder's).
#[test]
fn every_map_a_tool_names_is_in_its_object() {
    let out = std::path::Path::new(env!("OUT_DIR"));
    let tools = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tools");
    let object_of = |text: &str| -> Option<String> {
        let at = text.find("crate::object!(\"")? + "crate::object!(\"".len();
        Some(text[at..].split('"').next()?.to_string())
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(&tools).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files.extend(
                std::fs::read_dir(&p)
                    .unwrap()
                    .flatten()
                    .map(|f| f.path())
                    .filter(|f| f.extension().is_some_and(|x| x == "rs")),
            );
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    let names_on = |line: &str| -> Vec<String> {
        let mut v = Vec::new();
        for (i, part) in line.split('"').enumerate() {
            if i % 2 == 1
                && part.len() > 2
                && part.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && part
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                v.push(part.to_string());
            }
        }
        v
    };
    let mut checked = 0;
    let mut errors = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let body = text.split("#[cfg(test)]").next().unwrap_or("");
        let object = object_of(&text).or_else(|| {
            let m = f.parent()?.join("mod.rs");
            (f.parent()? != tools).then(|| object_of(&std::fs::read_to_string(m).ok()?))?
        });
        let asks = |l: &str| {
            [
                "take(",
                "take_map(",
                ".map(\"",
                "map_mut(\"",
                "max_entries(",
                "pair_map(",
            ]
            .iter()
            .any(|p| l.contains(p))
        };
        // A call may put its names on the lines after the one that opens it.
        let lines: Vec<&str> = body.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if !asks(l) {
                continue;
            }
            let mut names = names_on(l);
            if names.is_empty() && l.trim_end().ends_with('(') {
                for next in lines.iter().skip(i + 1).take(3) {
                    names.extend(names_on(next));
                }
            }
            for n in names {
                let Some(obj) = &object else {
                    errors.push(format!(
                        "{}: {n} asked for, but no object! is loaded there",
                        f.display()
                    ));
                    continue;
                };
                let bytes = std::fs::read(out.join(obj)).unwrap();
                let o = aya_obj::Object::parse(&bytes).unwrap();
                checked += 1;
                if !o.maps.contains_key(&n) {
                    errors.push(format!("{}: map {n} is not in object {obj}", f.display()));
                }
            }
        }
    }
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(
        checked >= 30,
        "only {checked} map names found: the scan is broken"
    );
}
