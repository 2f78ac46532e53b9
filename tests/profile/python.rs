//! CPython frames in `profile`: a program with a known call path (`handler → save → json.dumps`
//! on a 2,000-key dict) on every Python of this host — the one on PATH (pyenv's, built without
//! frame pointers, `libpython` shared), Debian's stripped `/usr/bin/python3` (the interpreter
//! in the executable) and pyenv's other versions when present — on-CPU with its files and
//! lines in the folded stacks, the SVG and the finding; and off-CPU, a thread blocked in
//! `os.fsync` under `write_journal()`.

use super::*;

/// Lines: `save` calls `json.dumps` on line 4, `handler` calls `save` on line 6.
const APP: &str = r#"import json, os, sys, time

def save(doc):
    return json.dumps(doc)

def handler(doc):
    return save(doc)

def write_journal(f, doc):
    f.write(doc)
    f.flush()
    os.fsync(f.fileno())

def main():
    doc = {"key%d" % i: i for i in range(2000)}
    end = time.monotonic() + float(sys.argv[1])
    print("ready", flush=True)
    if sys.argv[2] == "cpu":
        while time.monotonic() < end:
            handler(doc)
    else:
        with open(sys.argv[3], "w") as f:
            while time.monotonic() < end:
                write_journal(f, "x" * 4096)

main()
"#;

/// The Pythons to test: the one on PATH and Debian's (both required), then pyenv's others.
fn pythons() -> Vec<(String, std::path::PathBuf)> {
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    let on_path = std::path::PathBuf::from(String::from_utf8_lossy(&exe.stdout).trim());
    let debian = std::path::PathBuf::from("/usr/bin/python3");
    assert!(on_path.exists(), "no python3 on PATH");
    assert!(debian.exists(), "no /usr/bin/python3");
    let mut out = vec![
        ("PATH".to_string(), on_path.clone()),
        ("debian".to_string(), debian.clone()),
    ];
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    if let Ok(rd) = std::fs::read_dir(Path::new(&root).join("versions")) {
        let mut v: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
        v.sort();
        for dir in v {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let minor: Vec<&str> = name.split('.').collect();
            if minor.len() < 2 || minor[0] != "3" {
                continue;
            }
            let Ok(m) = minor[1].parse::<u32>() else {
                continue;
            };
            let bin = dir.join(format!("bin/python3.{m}"));
            let canon = |p: &Path| std::fs::canonicalize(p).ok();
            if (10..=13).contains(&m) && bin.exists() && canon(&bin) != canon(&on_path) {
                out.push((format!("pyenv {name}"), bin));
            }
        }
    }
    out
}

/// Starts `python APP secs mode [file]` and waits for its "ready" line.
fn start(python: &Path, app: &Path, args: &[&str]) -> std::process::Child {
    use std::io::BufRead;
    let mut c = Command::new(python)
        .arg(app)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut line = String::new();
    let mut r = std::io::BufReader::new(c.stdout.take().unwrap());
    r.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "{}", python.display());
    c
}

/// `profile` (with `extra`) of one pid for 3 s: its JSON lines and its folded stacks.
fn profile_pid(dir: &Path, pid: u32, tag: &str, extra: &[&str]) -> (Vec<Value>, String, String) {
    let folded = dir.join(format!("{tag}.folded"));
    let svg = dir.join(format!("{tag}.svg"));
    let pid_s = pid.to_string();
    let mut a = vec![
        "profile",
        "--json",
        "--pid",
        &pid_s,
        "--duration",
        "3s",
        "--top",
        "20",
        "--folded",
        folded.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    let tk = Tracer::spawn(&a);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(60));
    assert!(status.success(), "{tag}: {stderr}");
    (
        lines,
        std::fs::read_to_string(&folded).unwrap(),
        std::fs::read_to_string(&svg).unwrap(),
    )
}

fn notes(lines: &[Value]) -> String {
    lines
        .iter()
        .filter(|l| l["type"] == "meta" || l["type"] == "summary")
        .flat_map(|l| l["notes"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn python_frames_name_the_call_path_with_files_and_lines() {
    require_root();
    let dir = scratch("profile-python");
    let app = dir.join("app.py");
    std::fs::write(&app, APP).unwrap();
    let file = app.display().to_string();
    let save = format!("save ({file}:4)");
    let handler = format!("handler ({file}:7)");
    let mut report = Vec::new();
    for (name, python) in pythons() {
        let mut py = start(&python, &app, &["20", "cpu"]);
        let pid = py.id();
        let pb = dir.join(format!("{}.pb.gz", name.replace(' ', "-")));
        let (lines, folded, svg) = profile_pid(
            &dir,
            pid,
            &name.replace(' ', "-"),
            &["--pprof", pb.to_str().unwrap()],
        );
        let _ = py.kill();
        let _ = py.wait();
        let (both, all) = folded_share(&folded, pid as u64, |_| true);
        let hit: u64 = folded
            .lines()
            .filter(|l| l.contains(&save) && l.contains(&handler))
            .filter(|l| {
                l.split(';')
                    .next()
                    .unwrap_or("")
                    .ends_with(&format!("-{pid}"))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum();
        assert_eq!(both, all);
        let finding = findings_for(&lines, pid as u64).join(" | ");
        eprintln!(
            "{name} ({}): {hit} of {all} samples carry `{save}` and `{handler}`; finding: {finding}",
            python.display()
        );
        report.push((name.clone(), hit, all));
        assert!(all >= 100, "{name}: only {all} samples\n{}", notes(&lines));
        assert!(
            hit * 100 >= all * 80,
            "{name}: {hit} of {all} samples carry save and handler with their lines\n{}\n{}",
            notes(&lines),
            folded.lines().take(5).collect::<Vec<_>>().join("\n")
        );
        assert!(
            svg.contains("save (") && svg.contains("app.py:4") && svg.contains("handler ("),
            "{name}: the SVG does not show save and handler"
        );
        // The function rows carry the line; the finding names the path in Python terms.
        let row = rows(&lines, "function_total", pid as u64)
            .into_iter()
            .find(|r| r["function"] == "save" && r["line"] == 4)
            .unwrap_or_else(|| panic!("{name}: no function_total row for save at line 4"));
        assert_eq!(row["module"], file.as_str());
        assert!(
            finding.contains("under `save` (") && finding.contains("`dumps` ("),
            "{name}: finding {finding}"
        );
        // pprof: `go tool pprof -lines` puts save's samples at app.py:4, as many as the
        // function_total row counts.
        let out = output_ok(
            Command::new("go")
                .args(["tool", "pprof", "-top", "-lines", "-cum", "-nodecount=1000"])
                .args(["-sample_index=samples", "-symbolize=none"])
                .arg(&pb)
                .env("HOME", &dir),
            "go tool pprof -lines (Debian package golang-go)",
        );
        let text = String::from_utf8_lossy(&out);
        let cum: u64 = text
            .lines()
            .filter(|l| l.contains(" save ") && l.contains(&format!("{file}:4")))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
            .max()
            .unwrap_or(0);
        assert_eq!(
            Some(cum),
            row["total_samples"].as_u64(),
            "{name}: go tool pprof -lines:\n{text}"
        );
    }
    eprintln!("tested: {report:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn off_cpu_python_frames_name_the_function_blocked_in_fsync() {
    require_root();
    let dir = scratch("profile-python-off");
    let app = dir.join("app.py");
    std::fs::write(&app, APP).unwrap();
    let journal = dir.join("journal");
    let want = format!("write_journal ({}:12)", app.display());
    for (name, python) in pythons().into_iter().take(2) {
        let mut py = start(&python, &app, &["20", "fsync", journal.to_str().unwrap()]);
        let pid = py.id();
        let (lines, folded, _) = profile_pid(
            &dir,
            pid,
            &format!("off-{}", name.replace(' ', "-")),
            &["--off-cpu", "--min-block", "0"],
        );
        let _ = py.kill();
        let _ = py.wait();
        let (hit, all) = folded_share(&folded, pid as u64, |f| f == want);
        let fsync = folded
            .lines()
            .filter(|l| l.contains(&want) && l.contains("fsync"))
            .count();
        eprintln!(
            "{name}: {hit} of {all} blocked ns under `{want}`, {fsync} stacks with it and fsync"
        );
        assert!(all > 0, "{name}: nothing blocked\n{}", notes(&lines));
        assert!(
            hit * 2 >= all && fsync > 0,
            "{name}: {hit} of {all} blocked ns under {want}\n{}\n{}",
            notes(&lines),
            folded.lines().take(5).collect::<Vec<_>>().join("\n")
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
