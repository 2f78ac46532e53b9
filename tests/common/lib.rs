//! Helpers for the root tests: find the binaries, run tracekit as a child, read its NDJSON,
//! send it signals, and ask the kernel which programs exist.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

pub mod block;
pub mod held;
pub mod mm;
pub mod podman;
pub mod progs;
pub mod prometheus;
pub mod recording;
pub mod udp;
pub mod vm;
pub mod workloads;

pub use held::Held;
pub use progs::*;
pub use recording::*;
pub use workloads::*;

/// The release `tracekit` that `cargo xtask test` built (`TRACEKIT_BIN`), else the usual place.
pub fn tracekit_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TRACEKIT_BIN") {
        return PathBuf::from(p);
    }
    // The tests are the root package: the repository is CARGO_MANIFEST_DIR itself, where
    // `cargo xtask build` leaves `target/release/tracekit`.
    let p = repo_target().join("release/tracekit");
    assert!(
        p.exists(),
        "{} missing: run `cargo xtask test`, which builds it",
        p.display()
    );
    p
}

/// `tk-workload`: `TK_WORKLOAD` (set in the VM), else built beside the test executables.
pub fn workload_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TK_WORKLOAD") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join("tk-workload");
    assert!(p.exists(), "{} missing (built with the tests)", p.display());
    p
}

pub fn is_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

/// Root tests need root; CI runs as root. Failing (not skipping) keeps a green run honest.
pub fn require_root() {
    assert!(
        is_root(),
        "this test loads BPF programs and must run as root (cargo xtask test as root)"
    );
    mm::restore_leftovers();
}

/// Runs `cmd` to its end and returns its stdout; panics naming `what`, with the command's
/// stderr, when it cannot start or fails.
pub fn output_ok(cmd: &mut Command, what: &str) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out.stdout
}

/// The repository's `target/` (or `CARGO_TARGET_DIR`): where the builds and the scratch
/// directories live, inside the work tree.
pub fn repo_target() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
    }
}

/// A scratch directory on the work tree's filesystem (real disk, unlike tmpfs where fsync is
/// free).
pub fn scratch(tag: &str) -> PathBuf {
    let d = repo_target()
        .join("test-scratch")
        .join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running tracekit with its stdout collected line by line.
pub struct Tracer {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    /// The arguments it was started with, for a failure's message.
    what: String,
}

impl Tracer {
    pub fn spawn(args: &[&str]) -> Tracer {
        Self::spawn_env(args, &[])
    }

    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Tracer {
        let child = ends_with_the_test(&mut Command::new(tracekit_bin()))
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tracekit");
        let mut t = Tracer::from_child(child);
        t.what = format!("{args:?} {env:?}");
        t
    }

    /// Wraps a tracekit started with piped stdout and stderr.
    pub fn from_child(mut child: Child) -> Tracer {
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Tracer {
            child,
            lines: rx,
            seen: Vec::new(),
            what: String::new(),
        }
    }

    /// Waits for the JSON meta line tracekit prints once everything is attached.
    pub fn wait_attached(&mut self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if let Ok(v) = serde_json::from_str::<Value>(&l) {
                        if v["type"] == "meta" {
                            return v;
                        }
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let out = self.child.wait_with_output_stderr();
                    panic!("tracekit did not report attaching within 20 s; stderr: {out}");
                }
            }
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our child's pid.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Waits for exit (at most `timeout`), returning the status, all stdout lines as JSON where
    /// they parse, and stderr.
    pub fn finish(self, timeout: Duration) -> (ExitStatus, Vec<Value>, String) {
        let (status, raw, stderr) = self.finish_text(timeout);
        let json = raw
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        (status, json, stderr)
    }

    /// Like `finish`, with stdout as raw lines.
    pub fn finish_text(mut self, timeout: Duration) -> (ExitStatus, Vec<String>, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                // Where each of its threads waits, before it is killed: what a hang needs.
                let pid = self.child.id();
                let mut stacks = String::new();
                if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                    for t in tasks.flatten() {
                        let d = t.path();
                        let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
                        stacks.push_str(&format!(
                            "\n[{}] {} wchan={} {}",
                            t.file_name().to_string_lossy(),
                            read("comm").trim(),
                            read("wchan"),
                            read("stack").replace('\n', " | ")
                        ));
                    }
                }
                let _ = self.child.kill();
                let _ = self.child.wait();
                let mut stderr = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                }
                panic!(
                    "tracekit {} did not exit within {timeout:?}; its stderr: {stderr}; its threads:{stacks}",
                    self.what
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.seen.push(l);
        }
        let stderr = self.child.wait_with_output_stderr();
        (status, std::mem::take(&mut self.seen), stderr)
    }
}

/// Spawns `tracekit ARGS` in text mode and waits (at most 20 s) for its announcement on stderr
/// ("Tracing … Ctrl-C to end."), printed once everything is attached: the text-mode
/// counterpart of [`Tracer::wait_attached`]. Its stderr is drained and dropped from then on.
pub fn spawn_text_attached(args: &[&str]) -> Tracer {
    let mut child = ends_with_the_test(&mut Command::new(tracekit_bin()))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tracekit");
    let err = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            // Keep draining after the announcement, so tracekit never blocks on stderr.
            let _ = tx.send(line);
        }
    });
    let tk = Tracer::from_child(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with("Tracing ") => return tk,
            Ok(l) => seen.push(l),
            Err(_) => panic!("tracekit {args:?} did not announce tracing within 20 s: {seen:?}"),
        }
    }
}

/// This test binary's tests one at a time, for those that stage incidents (each is "the"
/// culprit of the node), move global counters (`/proc/vmstat`, diskstats) or compare latencies
/// another test's load would disturb: hold the guard for the whole test. Cargo runs a binary's
/// tests on several threads, and the binaries one after another.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test that fails (panics) before `finish` must not leave its tracekit running.
/// A tracekit the test starts gets SIGTERM when the test's thread dies: a test binary killed
/// with SIGKILL (a CI timeout) would otherwise leave it running, its programs attached. SIGTERM,
/// not SIGKILL, so it still detaches and writes its summary as on any stop.
pub fn ends_with_the_test(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl and signal are async-signal-safe and touch only the child being started.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A suite started under `nohup` passes SIGHUP on ignored, and tracekit keeps an
            // inherited ignored SIGHUP ignored (what `nohup tracekit` asks for): the tests of
            // its SIGHUP path then hung 15 s and failed. They test the path a terminal takes.
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        })
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Ends `child` as a user would, with SIGINT, sent again every 500 ms (a tool still attaching
/// may not act on the first), and waits at most `timeout`. Past that, the child is killed and
/// the test fails naming `what`: a reference tool that ignores its signal must fail the test,
/// not hang it (a bpftrace once sat 74 min in epoll_wait after its SIGINT, holding a CI run).
pub fn interrupt(child: &mut Child, what: &str, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    let mut next = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        let now = Instant::now();
        if now > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {timeout:?} of SIGINT");
        }
        if now >= next {
            // SAFETY: plain syscall on our own, not yet reaped, child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            next = now + Duration::from_millis(500);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// All of a child's piped stderr (read to its end).
pub fn take_stderr(child: &mut Child) -> String {
    use std::io::Read;
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut err)
        .unwrap();
    err
}

trait StderrExt {
    fn wait_with_output_stderr(&mut self) -> String;
}

impl StderrExt for Child {
    fn wait_with_output_stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

/// Summary lines of `tool` for `pid`.
pub fn rows_for<'a>(lines: &'a [Value], tool: &str, pid: u32) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["tool"] == tool && v["type"] == "summary" && v["pid"] == pid)
        .collect()
}

/// Nearest-rank percentile (the definition tracekit's histograms use).
pub fn percentile(values: &[u64], q: f64) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Sum of `count` over a tool's summary rows matching `pred`.
pub fn sum_counts(lines: &[Value], tool: &str, pred: impl Fn(&Value) -> bool) -> u64 {
    lines
        .iter()
        .filter(|v| v["tool"] == tool && v["type"] == "summary" && pred(v))
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .sum()
}

/// The last `"type":"stats"` line.
pub fn last_stats(lines: &[Value]) -> &Value {
    lines
        .iter()
        .rev()
        .find(|l| l["type"] == "stats")
        .expect("a stats line")
}

/// A workload started with `TK_WAIT_STDIN=1`: it has printed its pid and waits for `go()`.
pub struct Parked {
    pub child: Child,
    pub pid: u32,
}

impl Parked {
    pub fn start(args: &[&str]) -> Parked {
        let mut child = Command::new(workload_bin())
            .args(args)
            .env("TK_WAIT_STDIN", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn tk-workload");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).expect("ready line");
        let pid = v["ready"].as_u64().unwrap() as u32;
        child.stdout = Some(out.into_inner());
        Parked { child, pid }
    }

    /// Lets it run to completion and returns its report.
    pub fn go(mut self) -> Value {
        use std::io::Write;
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).expect("workload JSON")
    }
}

/// `tracekit CMD --help`: whether it exited 0, and what it printed.
pub fn help_of(cmd: &str) -> (bool, String) {
    let o = Command::new(tracekit_bin())
        .args([cmd, "--help"])
        .output()
        .expect("run tracekit --help");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

/// A thread of this process that waits until `stop`: its tid is a valid id that is not a
/// process id (for `--pid`).
pub struct IdleThread {
    pub tid: String,
    done: mpsc::Sender<()>,
    handle: thread::JoinHandle<()>,
}

impl IdleThread {
    pub fn start() -> IdleThread {
        let (tx, rx) = mpsc::channel();
        let (done, done_rx) = mpsc::channel::<()>();
        let handle = thread::spawn(move || {
            // SAFETY: plain syscall.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap().to_string();
        IdleThread { tid, done, handle }
    }

    pub fn stop(self) {
        self.done.send(()).unwrap();
        self.handle.join().unwrap();
    }
}

/// A new anonymous private read-write mapping of `len` bytes, owned by the caller for the life
/// of the process.
pub fn anon_map(len: usize) -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping; checked for MAP_FAILED below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p
}

/// `tracekit …` command lines listed under "Examples:" in a --help text, as words (comments
/// after `#` dropped).
pub fn help_examples(help: &str) -> Vec<Vec<String>> {
    help.lines()
        .skip_while(|l| !l.starts_with("Examples:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            l.split('#')
                .next()
                .unwrap()
                .split_whitespace()
                .map(String::from)
                .collect()
        })
        .collect()
}

/// `sh -c 'sleep 0.2; exec tk-workload pingpong 3000'`: a process that runs as `sh` first, then
/// execs. Returns its pid (the same before and after the exec).
pub fn run_exec_workload() -> u32 {
    let script = format!("sleep 0.2; exec {} pingpong 3000", workload_bin().display());
    let out = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sh");
    let pid = out.id();
    let status = { out }.wait().expect("wait sh");
    assert!(status.success());
    pid
}

/// Creates (or truncates) `path` for writing; panics with the path on failure.
pub fn open_trunc(path: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Writes 4 KiB then calls `kind` (fsync or fdatasync), `count` times, timing each call.
pub fn timed_sync(f: &mut std::fs::File, kind: &str, count: usize) -> Vec<u64> {
    let buf = vec![0x5au8; 4096];
    (0..count)
        .map(|_| {
            std::io::Write::write_all(f, &buf).expect("write");
            let t = std::time::Instant::now();
            // SAFETY: plain syscalls on an fd we own.
            let rc = unsafe {
                if kind == "fsync" {
                    libc::fsync(std::os::fd::AsRawFd::as_raw_fd(f))
                } else {
                    libc::fdatasync(std::os::fd::AsRawFd::as_raw_fd(f))
                }
            };
            let d = t.elapsed().as_nanos() as u64;
            assert_eq!(rc, 0, "{kind} failed");
            d
        })
        .collect()
}

/// The registry's visible collectors (`fsync-lat`, `ctxsw`, …): what "every tool" means in the
/// shared tests, so a new tool is covered without a line here.
pub fn tools() -> Vec<&'static str> {
    tracekit::tools::TOOLS
        .iter()
        .filter(|t| !t.hidden)
        .map(|t| t.name)
        .collect()
}

/// [`tools`] and the visible commands (`doctor`, …).
pub fn tools_and_commands() -> Vec<&'static str> {
    tracekit::tools::visible().map(|t| t.name).collect()
}

/// Two threads of this test process handing a byte back and forth over pipes for `secs`, each
/// first naming itself (`PR_SET_NAME`) where `names` gives a name; returns their tids (the
/// first wakes the second first).
pub fn thread_pingpong(secs: f64, names: [Option<&'static [u8]>; 2]) -> (u32, u32) {
    let mut a = [0i32; 2];
    let mut b = [0i32; 2];
    // SAFETY: pipe() writes two fds into each array.
    unsafe {
        assert_eq!(libc::pipe(a.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(b.as_mut_ptr()), 0);
    }
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let side = move |rd: i32, wr: i32, first: bool, name: Option<&'static [u8]>| {
        if let Some(n) = name {
            let c = std::ffi::CString::new(n).expect("a name without NUL");
            // SAFETY: PR_SET_NAME reads a NUL-terminated string (the kernel keeps 15 bytes).
            unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
        }
        let mut byte = [0u8; 1];
        let mut i = 0u64;
        loop {
            // SAFETY: one-byte reads and writes on our pipes.
            unsafe {
                if !(first && i == 0) && libc::read(rd, byte.as_mut_ptr().cast(), 1) != 1 {
                    break;
                }
                byte[0] = u8::from(Instant::now() >= end);
                if libc::write(wr, byte.as_ptr().cast(), 1) != 1 || byte[0] == 1 {
                    break;
                }
            }
            i += 1;
        }
        // SAFETY: plain syscall.
        unsafe { libc::gettid() as u32 }
    };
    let t2 = thread::spawn(move || side(a[0], b[1], false, names[1]));
    let t1 = side(b[0], a[1], true, names[0]);
    let t2 = t2.join().unwrap();
    // SAFETY: closing the fds made above.
    unsafe {
        for fd in a.iter().chain(&b) {
            libc::close(*fd);
        }
    }
    (t1, t2)
}

/// The `summary` rows of `tool` among JSON lines.
pub fn summary_rows<'a>(lines: &'a [Value], tool: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["tool"] == tool && l["type"] == "summary")
        .collect()
}

/// The sum of `key` over the rows that name `container`.
pub fn container_count(rows: &[&Value], container: &str, key: &str) -> u64 {
    rows.iter()
        .filter(|r| r["container"] == container)
        .map(|r| r[key].as_u64().unwrap_or(0))
        .sum()
}

/// tracekit with `args`, once its programs are attached.
pub fn attached(args: &[&str]) -> Tracer {
    let mut t = Tracer::spawn(args);
    t.wait_attached();
    t
}

/// Stops a JSON tracer with SIGINT, asserts it exited 0, and returns its lines.
pub fn stop_json(tk: Tracer) -> Vec<Value> {
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "exit {status}: {stderr}");
    lines
}

/// Waits (up to two minutes) until file `p` exists.
pub fn wait_file(p: &std::path::Path) {
    let t = std::time::Instant::now();
    while !p.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// bpftrace, installed from Debian when missing.
pub fn bpftrace() -> &'static str {
    let have = || {
        Command::new("bpftrace")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have() {
        let _ = Command::new("apt-get").arg("update").status();
        let _ = Command::new("apt-get")
            .args(["install", "-y", "bpftrace"])
            .status();
    }
    assert!(
        have(),
        "bpftrace is needed for the reference and could not be installed"
    );
    "bpftrace"
}
