use super::*;

#[test]
fn registry_names_are_unique_and_defaults_parse() {
    let mut names: Vec<&str> = TOOLS.iter().chain(COMMANDS).map(|t| t.name).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "duplicate tool names");
    let cmd = <Tool as clap::Subcommand>::augment_subcommands(clap::Command::new("tracekit"));
    for t in TOOLS.iter().chain(COMMANDS) {
        let sub = cmd.find_subcommand(t.name);
        assert!(sub.is_some(), "{} is not a subcommand", t.name);
        assert_eq!(sub.unwrap().is_hide_set(), t.hidden, "{}", t.name);
    }
    assert!(args_from::<fsync_lat::Args>(&[]).is_ok());
    assert!(args_from::<fsync_lat::Args>(&["--by-file"]).is_ok_and(|a| a.by_file));
    assert!(args_from::<fsync_lat::Args>(&["--no-such-flag"]).is_err());
}

/// ctxsw and runq-lat declare one hook table, so run together they cost one program per
/// sched hook; numa joins that table's `sched_switch` program (its other hooks stay its own),
/// and alone it keeps its own.
#[test]
fn tools_declaring_one_table_compose_into_one_program_per_hook() {
    let triage: Vec<&ToolInfo> = TOOLS.iter().filter(|t| t.triage && !t.hidden).collect();
    let plan = composed_plan(&triage);
    let switch = &plan
        .iter()
        .find(|(e, _)| *e == "sched:sched_switch")
        .expect("sched_switch is shared")
        .1;
    assert_eq!(switch, &vec![vec!["ctxsw", "runq-lat", "numa"]]);
    let alone: Vec<&ToolInfo> = TOOLS
        .iter()
        .filter(|t| ["numa", "fsync-lat"].contains(&t.name))
        .collect();
    assert!(
        composed_plan(&alone)
            .iter()
            .all(|(e, _)| *e != "sched:sched_switch"),
        "numa without a sched reader joins nothing"
    );
    let waking = &plan
        .iter()
        .find(|(e, _)| *e == "sched:sched_waking")
        .unwrap()
        .1;
    assert_eq!(waking[0], vec!["ctxsw", "runq-lat"], "{waking:?}");
    // An event only one tool attaches is not listed.
    assert!(
        plan.iter().all(|(e, _)| !e.starts_with("syscalls:")),
        "{plan:?}"
    );
}

/// The README's generated blocks (`<!-- NAME:begin -->` … `<!-- NAME:end -->`) are what the
/// registry says; `UPDATE_README=1 cargo test -p tracekit readme` rewrites them.
#[test]
fn readme_generated_blocks_are_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let mut readme = std::fs::read_to_string(&path).unwrap();
    let update = std::env::var_os("UPDATE_README").is_some();
    for (name, want) in [
        ("tools", readme_table()),
        ("kernel", readme_kernel_table()),
        ("causes", readme_causes_table()),
    ] {
        let (begin, end) = (
            format!("<!-- {name}:begin -->\n"),
            format!("<!-- {name}:end -->"),
        );
        let a = readme
            .find(&begin)
            .unwrap_or_else(|| panic!("README has no {begin}"))
            + begin.len();
        let b = readme
            .find(&end)
            .unwrap_or_else(|| panic!("README has no {end}"));
        if update {
            readme = format!("{}{want}{}", &readme[..a], &readme[b..]);
            continue;
        }
        assert_eq!(
            &readme[a..b],
            want,
            "README's {name} block is stale: run UPDATE_README=1 cargo test -p tracekit readme"
        );
    }
    if update {
        std::fs::write(&path, readme).unwrap();
    }
}

/// Issue #32: every cause is declared once, by name, with a meaning; the tools that
/// conclude findings declare their causes.
#[test]
fn causes_are_declared_once_with_a_meaning() {
    let all = causes();
    let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all.len());
    for c in &all {
        assert!(
            !c.means.is_empty() && c.name.chars().all(|x| x.is_ascii_lowercase() || x == '-'),
            "{c:?}"
        );
    }
    for t in TOOLS.iter().filter(|t| !t.hidden) {
        assert!(!t.causes.is_empty(), "{} declares no cause", t.name);
    }
}

/// Issue #32: every row kind is declared once per tool, its fields once each, and every
/// exported metric is a count (counters only grow) with a unique name.
#[test]
fn row_declarations_are_consistent() {
    let mut metrics = Vec::new();
    for t in TOOLS.iter().chain(MODES) {
        let mut kinds: Vec<&str> = t.rows.iter().map(|r| r.kind).collect();
        kinds.sort();
        kinds.dedup();
        assert_eq!(
            kinds.len(),
            t.rows.len(),
            "{}: a row kind declared twice",
            t.name
        );
        for r in t.rows {
            let mut keys: Vec<&str> = r.all_fields().map(|f| f.key).collect();
            let n = keys.len();
            keys.sort();
            keys.dedup();
            assert_eq!(
                keys.len(),
                n,
                "{} {}: a field declared twice",
                t.name,
                r.kind
            );
            for f in r.all_fields() {
                if let Some(e) = f.export {
                    assert_eq!(
                        f.role,
                        crate::report::schema::Role::Count,
                        "{} {}",
                        t.name,
                        f.key
                    );
                    metrics.push(e.name);
                }
            }
            metrics.extend(r.dists.iter().filter_map(|d| d.export).map(|e| e.0));
        }
    }
    metrics.sort();
    let n = metrics.len();
    metrics.dedup();
    assert_eq!(metrics.len(), n, "a metric name declared twice");
}

/// CONTRIBUTING.md is the recipe, so it must name what the code has (issue #32: it had
/// drifted to files, macros and lists that no longer existed). Every path it cites exists,
/// every macro it names is defined, and every `Type::item` or identifier it cites appears
/// in the sources: a rename that leaves the recipe behind fails here.
#[test]
fn contributing_names_what_the_code_has() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("CONTRIBUTING.md")).unwrap();
    let mut sources = String::new();
    let mut stack = vec![
        root.join("cli/src"),
        root.join("probes-ebpf/src"),
        root.join("probes-common/src"),
        root.join("tests"),
    ];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                sources.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let is_ident = |w: &str| {
        !w.is_empty()
            && w.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut missing = Vec::new();
    let mut checked = 0;
    for (i, tok) in doc.split('`').enumerate() {
        if i % 2 == 0 || tok.contains('<') || tok.contains(' ') {
            continue;
        }
        if tok.contains('/') && (tok.ends_with(".rs") || tok.ends_with('/')) {
            let p = tok.trim_start_matches("cli/src/");
            let found = root.join(tok).exists() || root.join("cli/src").join(p).exists();
            checked += 1;
            if !found {
                missing.push(format!("path {tok}"));
            }
        } else if let Some(m) = tok.strip_suffix('!').filter(|m| is_ident(m)) {
            checked += 1;
            if !sources.contains(&format!("macro_rules! {m}")) {
                missing.push(format!("macro {tok}"));
            }
        } else if tok.contains("::") && !tok.contains('(') && !tok.contains('{') {
            for seg in tok.split("::").filter(|s| is_ident(s)) {
                checked += 1;
                if !sources.contains(seg) {
                    missing.push(format!("{seg} in {tok}"));
                }
            }
        } else if is_ident(tok) && tok.len() > 3 && tok.chars().any(|c| c == '_') {
            checked += 1;
            if !sources.contains(tok) {
                missing.push(format!("identifier {tok}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "CONTRIBUTING.md names what the code lacks: {missing:#?}"
    );
    assert!(
        checked > 60,
        "only {checked} names checked: the scan is broken"
    );
}
