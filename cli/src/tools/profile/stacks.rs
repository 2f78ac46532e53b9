//! From resolved samples to what profile shows: per-process function counts (self: the
//! innermost frame; total: anywhere on the stack, once per sample), folded stacks in the format
//! `flamegraph.pl` and inferno read, and the SVG flame graph.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    rc::Rc,
};

use aya::maps::{stack_trace::StackTraceMap, MapData};
use probes_common::profile::ProfileKey;

use super::symbols::{Frame, Resolver};
use crate::report::output::{OutputError, Sink};

/// The addresses of stack `id` in a stack-trace map, innermost first (`None`: no stack).
pub fn stack_ips(stacks: &StackTraceMap<MapData>, id: i32) -> Option<Vec<u64>> {
    if id < 0 {
        return None;
    }
    let st = stacks.get(&(id as u32), 0).ok()?;
    Some(st.frames().iter().map(|f| f.ip).collect())
}

/// Resolves the frame-pointer user stacks of `keys` not resolved yet (while their processes
/// still run).
pub fn resolve_new_users(
    resolver: &mut Resolver,
    stacks: &StackTraceMap<MapData>,
    keys: &[ProfileKey],
) {
    for k in keys {
        if k.user_stack >= 0 && !resolver.has_user(k.tgid, k.user_stack) {
            if let Some(ips) = stack_ips(stacks, k.user_stack) {
                resolver.resolve_user(k.tgid, k.user_stack, &ips);
            }
        }
    }
}

/// The frames of one key, outermost first: user frames (`user`: already unwound, else the
/// key's frame-pointer stack) with the Python stack spliced in (`python`: its segments), then
/// kernel frames; `[no stack]` when there are none.
pub fn key_frames(
    resolver: &mut Resolver,
    stacks: &StackTraceMap<MapData>,
    k: &ProfileKey,
    user: Option<std::rc::Rc<[Frame]>>,
    python: Option<std::rc::Rc<[Vec<Frame>]>>,
) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::new();
    let user = user.or_else(|| {
        stack_ips(stacks, k.user_stack).map(|ips| resolver.resolve_user(k.tgid, k.user_stack, &ips))
    });
    if let Some(f) = user {
        out.extend(f.iter().rev().cloned());
    }
    if let Some(segs) = python {
        out = super::python::merge(&out, &segs);
    }
    if let Some(ips) = stack_ips(stacks, k.kernel_stack) {
        let f = resolver.resolve_kernel(k.kernel_stack, &ips);
        out.extend(f.iter().rev().cloned());
    }
    if out.is_empty() {
        out.push(marker("[no stack]", "[unknown]"));
    }
    out
}

/// Samples of one stack of one process (or thread) in a window.
pub struct Sample {
    /// tgid, or tid with `--threads`.
    pub id: u32,
    pub tgid: u32,
    pub comm: Vec<u8>,
    /// Outermost first; kernel frames after the user frames.
    pub frames: Vec<Frame>,
    pub count: u64,
}

/// One process's samples by function.
#[derive(Default)]
pub struct ProcAgg {
    pub tgid: u32,
    pub comm: Vec<u8>,
    pub samples: u64,
    pub self_: HashMap<Frame, u64>,
    pub total: HashMap<Frame, u64>,
    /// Python samples by where the application's own code was: its innermost Python frame
    /// outside the interpreter's library directories, and the library frame it called
    /// (`json.dumps`), if any.
    pub python: HashMap<(Frame, Option<Frame>), u64>,
}

/// Whether a Python frame's file is in the interpreter's library directories (the standard
/// library `…/lib/python3.11/json/…`, installed packages under `…/python3.11/site-packages/`,
/// `<frozen runpy>`), not the application's own code.
pub fn stdlib_file(file: &str) -> bool {
    file.starts_with("<frozen")
        || file
            .split('/')
            .any(|c| c.starts_with("python3.") && !c.ends_with(".py"))
}

/// The application's innermost Python frame in `frames` (outermost first) and the library frame
/// it called.
fn python_path(frames: &[Frame]) -> Option<(Frame, Option<Frame>)> {
    let py: Vec<&Frame> = frames.iter().filter(|f| f.line > 0).collect();
    let i = py.iter().rposition(|f| !stdlib_file(&f.module))?;
    Some((py[i].clone(), py.get(i + 1).map(|f| (*f).clone())))
}

/// Per-process aggregates, keyed by id.
pub fn aggregate(samples: &[Sample]) -> BTreeMap<u32, ProcAgg> {
    let mut out: BTreeMap<u32, ProcAgg> = BTreeMap::new();
    for s in samples {
        let p = out.entry(s.id).or_insert_with(|| ProcAgg {
            tgid: s.tgid,
            comm: s.comm.clone(),
            ..Default::default()
        });
        p.samples += s.count;
        if let Some(leaf) = s.frames.last() {
            *p.self_.entry(leaf.clone()).or_default() += s.count;
        }
        if let Some(path) = python_path(&s.frames) {
            *p.python.entry(path).or_default() += s.count;
        }
        let mut seen = HashSet::new();
        for f in &s.frames {
            if seen.insert(f) {
                *p.total.entry(f.clone()).or_default() += s.count;
            }
        }
    }
    out
}

/// The `(function, samples)` pairs of `m` with the most samples first (ties by name), at most
/// `n` (0: all).
pub fn top(m: &HashMap<Frame, u64>, n: usize) -> Vec<(Frame, u64)> {
    let mut v: Vec<(Frame, u64)> = m.iter().map(|(f, c)| (f.clone(), *c)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    if n > 0 {
        v.truncate(n);
    }
    v
}

/// A name as one folded-stack frame: `;` separates frames and the last space the count, so
/// both are replaced; kernel frames carry inferno's `_[k]` suffix (coloured as kernel).
fn folded_name(f: &Frame) -> String {
    let fold = |s: &str| -> String {
        s.chars()
            .map(|c| match c {
                ';' => ':',
                c if c.is_whitespace() || c.is_control() => '_',
                c => c,
            })
            .collect()
    };
    let name = fold(&f.function);
    if &*f.module == "kernel" {
        format!("{name}_[k]")
    } else if f.line > 0 {
        // A Python frame, as py-spy folds it: `save (app.py:12)`. Folded readers split the
        // count at the last space, so the one space inside a frame is safe.
        format!("{name} ({}:{})", fold(&f.module), f.line)
    } else {
        name
    }
}

/// Adds `samples` to the folded stacks `acc` (`comm-pid;outer;…;leaf` → count).
pub fn fold_into(acc: &mut BTreeMap<String, u64>, samples: &[Sample]) {
    for s in samples {
        let comm = crate::report::sanitize::text(&s.comm).replace([';', ' '], "_");
        let mut line = format!("{comm}-{}", s.id);
        for f in &s.frames {
            line.push(';');
            line.push_str(&folded_name(f));
        }
        *acc.entry(line).or_default() += s.count;
    }
}

/// The folded stacks as text, one `stack count` line each.
pub fn folded_text(acc: &BTreeMap<String, u64>) -> String {
    let mut s = String::new();
    for (k, v) in acc {
        s.push_str(&format!("{k} {v}\n"));
    }
    s
}

/// Writes `text` to `path` with `--output`'s rules (`report::output::Sink`): a regular file is
/// replaced atomically, a device or FIFO is written into and never replaced, a directory is
/// refused.
pub fn write_file(path: &Path, text: &str) -> Result<(), OutputError> {
    write_file_bytes(path, text.as_bytes())
}

/// [`write_file`] for bytes (`--pprof`'s gzip).
pub fn write_file_bytes(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let mut sink = Sink::open(Some(path), false)?;
    sink.write_bytes(bytes)?;
    sink.finish()
}

/// Writes the run's folded stacks to `folded` and its flame graph (titled `title`, counts in
/// `unit`) to `svg`, those that are asked for.
pub fn write_outputs(
    folded: Option<&Path>,
    svg_path: Option<&Path>,
    acc: &BTreeMap<String, u64>,
    title: &str,
    unit: &str,
) -> crate::error::Result<()> {
    if let Some(p) = folded {
        write_file(p, &folded_text(acc))?;
    }
    if let Some(p) = svg_path {
        let svg = svg(acc, title, unit).map_err(|e| {
            crate::error::Error::other(format!("drawing the flame graph {}: {e}", p.display()))
        })?;
        write_file(p, &String::from_utf8_lossy(&svg))?;
    }
    Ok(())
}

/// An SVG that says there was nothing to draw (inferno refuses an empty profile).
fn empty_svg(title: &str) -> Vec<u8> {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text><text x=\"600\" y=\"48\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">no samples: nothing ran in scope</text></svg>\n",
        esc(title)
    )
    .into_bytes()
}

/// The SVG flame graph of `acc` (with no samples, an SVG saying so).
pub fn svg(acc: &BTreeMap<String, u64>, title: &str, unit: &str) -> std::io::Result<Vec<u8>> {
    if acc.is_empty() {
        return Ok(empty_svg(title));
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = unit.into();
    let lines: Vec<String> = acc.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out)
        .map_err(std::io::Error::other)?;
    Ok(out)
}

/// A frame for display: `function (module)`, for a Python frame `function (file:line)`.
pub fn label(f: &Frame) -> String {
    let (function, module) = (
        crate::report::sanitize::text(f.function.as_bytes()),
        crate::report::sanitize::text(f.module.as_bytes()),
    );
    match f.line {
        0 => format!("{function} ({module})"),
        line => format!("{function} ({module}:{line})"),
    }
}

/// A frame that stands for what could not be resolved or recorded.
pub fn marker(name: &str, module: &str) -> Frame {
    Frame {
        function: Rc::from(name),
        module: Rc::from(module),
        line: 0,
        at: super::symbols::At::NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fr(f: &str, m: &str) -> Frame {
        marker(f, m)
    }

    fn fixture() -> Vec<Sample> {
        let main = fr("main", "hot");
        let spin = fr("spin", "hot");
        let k = fr("asm_sysvec_apic_timer_interrupt", "kernel");
        vec![
            Sample {
                id: 7,
                tgid: 7,
                comm: b"hot".to_vec(),
                frames: vec![main.clone(), spin.clone()],
                count: 9,
            },
            Sample {
                id: 7,
                tgid: 7,
                comm: b"hot".to_vec(),
                frames: vec![main.clone(), spin.clone(), k],
                count: 1,
            },
            Sample {
                id: 8,
                tgid: 8,
                comm: b"a b;c".to_vec(),
                frames: vec![fr("f;g h", "x")],
                count: 2,
            },
        ]
    }

    #[test]
    fn self_and_total_per_process() {
        let a = aggregate(&fixture());
        let p = &a[&7];
        assert_eq!(p.samples, 10);
        assert_eq!(top(&p.self_, 1), vec![(fr("spin", "hot"), 9)]);
        assert_eq!(p.total[&fr("main", "hot")], 10);
        assert_eq!(p.total[&fr("spin", "hot")], 10);
        assert_eq!(top(&p.self_, 0).len(), 2);
    }

    #[test]
    fn folded_lines_escape_separators_and_mark_kernel_frames() {
        let mut acc = BTreeMap::new();
        fold_into(&mut acc, &fixture());
        fold_into(&mut acc, &fixture()[..1]);
        let t = folded_text(&acc);
        assert_eq!(
            t,
            "a_b_c-8;f:g_h 2\nhot-7;main;spin 18\nhot-7;main;spin;asm_sysvec_apic_timer_interrupt_[k] 1\n"
        );
    }

    #[test]
    fn svg_names_the_functions() {
        let mut acc = BTreeMap::new();
        fold_into(&mut acc, &fixture());
        let s = String::from_utf8(svg(&acc, "t", "samples").unwrap()).unwrap();
        assert!(s.starts_with("<?xml"), "{}", &s[..40]);
        assert!(s.contains("spin"));
        assert!(s.trim_end().ends_with("</svg>"));
    }

    /// No samples (a --comm that matched nothing): an SVG saying so, never an error.
    #[test]
    fn svg_of_nothing_says_so() {
        let s = String::from_utf8(svg(&BTreeMap::new(), "in comm <x> & y", "samples").unwrap())
            .unwrap();
        assert!(
            s.starts_with("<?xml") && s.trim_end().ends_with("</svg>"),
            "{s}"
        );
        assert!(
            s.contains("no samples") && s.contains("in comm &lt;x&gt; &amp; y"),
            "{s}"
        );
    }

    /// The flame graph and folded files follow --output's rules: a directory is refused, a
    /// character device is written into, never replaced.
    #[test]
    fn files_are_written_with_the_output_rules() {
        let dir = std::env::temp_dir().join(format!("tk-profile-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(matches!(
            write_file(&dir, "x"),
            Err(OutputError::Target { .. })
        ));
        write_file(Path::new("/dev/null"), "x").unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        let f = dir.join("cpu.folded");
        write_file(&f, "a;b 3\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a;b 3\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
