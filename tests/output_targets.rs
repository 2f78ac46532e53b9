//! Root tests for `--output`: every kind of target, and what is left on disk afterwards (node
//! type, mode, owner, content). tracekit never replaces what it did not create, refuses before
//! tracing what it cannot write, and leaves no temporary file behind.

use std::{
    ffi::CString,
    fs,
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use tracekit_tests::*;

/// Runs `fsync-lat --json --output TARGET` for a moment (in `cwd`); returns the exit code and
/// stderr.
fn run_to(target: &str, cwd: &Path, extra: &[&str]) -> (i32, String) {
    let o = Command::new(tracekit_bin())
        .args([
            "fsync-lat",
            "--json",
            "--duration",
            "300ms",
            "--output",
            target,
        ])
        .args(extra)
        .current_dir(cwd)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn c(p: &Path) -> CString {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// tracekit's temporary files left in `dir`.
fn temps(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tracekit-"))
        .collect()
}

fn is_report(text: &str) -> bool {
    text.lines().any(|l| l.contains("\"type\":\"stats\""))
}

/// A tmpfs at `dir` with `opts`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, opts: &str) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tk-test", dir.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs {opts}");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn output_target_matrix() {
    require_root();
    let d = scratch("out-matrix");

    // A new regular file: created with the report, no temporary file left.
    let (code, err) = run_to(d.join("new.ndjson").to_str().unwrap(), &d, &[]);
    assert_eq!(code, 0, "{err}");
    let m = fs::symlink_metadata(d.join("new.ndjson")).unwrap();
    assert!(m.file_type().is_file());
    assert!(is_report(
        &fs::read_to_string(d.join("new.ndjson")).unwrap()
    ));
    assert!(temps(&d).is_empty(), "{:?}", temps(&d));

    // An existing file with mode 0600 owned by another user: replaced, owner and mode kept.
    let owned = d.join("owned.ndjson");
    fs::write(&owned, "old\n").unwrap();
    fs::set_permissions(&owned, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&owned, Some(65534), Some(65534)).unwrap();
    let (code, err) = run_to(owned.to_str().unwrap(), &d, &[]);
    assert_eq!(code, 0, "{err}");
    let m = fs::symlink_metadata(&owned).unwrap();
    assert!(m.file_type().is_file());
    assert_eq!(m.mode() & 0o7777, 0o600, "mode changed");
    assert_eq!((m.uid(), m.gid()), (65534, 65534), "owner changed");
    assert!(is_report(&fs::read_to_string(&owned).unwrap()));

    // A symbolic link to a regular file, and one to nothing: refused before tracing, untouched.
    let target = d.join("precious");
    fs::write(&target, "precious\n").unwrap();
    let link = d.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let dangling = d.join("dangling");
    std::os::unix::fs::symlink(d.join("nowhere"), &dangling).unwrap();
    for l in [&link, &dangling] {
        let (code, err) = run_to(l.to_str().unwrap(), &d, &[]);
        assert_eq!(code, 2, "{}: {err}", l.display());
        assert!(err.contains("symbolic link"), "{err}");
        assert!(fs::symlink_metadata(l).unwrap().file_type().is_symlink());
    }
    assert_eq!(fs::read_to_string(&target).unwrap(), "precious\n");
    assert!(!d.join("nowhere").exists());

    // A directory, `.`, and a path with a trailing slash: refused, nothing created.
    let sub = d.join("subdir");
    fs::create_dir(&sub).unwrap();
    let slash = format!("{}/", d.join("slashed").display());
    for t in [sub.to_str().unwrap(), ".", slash.as_str()] {
        let (code, err) = run_to(t, &sub, &[]);
        assert_eq!(code, 2, "{t}: {err}");
        assert!(
            err.contains("directory") || err.contains("ends in /"),
            "{err}"
        );
    }
    assert_eq!(
        fs::read_dir(&sub).unwrap().count(),
        0,
        "the directory was written into"
    );
    assert!(!d.join("slashed").exists());

    // A FIFO with a reader: written into, still a FIFO.
    let fifo = d.join("fifo");
    // SAFETY: plain syscall with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c(&fifo).as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read_to_string(fifo).unwrap())
    };
    std::thread::sleep(Duration::from_millis(100));
    let (code, err) = run_to(fifo.to_str().unwrap(), &d, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(is_report(&reader.join().unwrap()));
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    // Without a reader: refused at once (a blocking open would hang before tracing).
    let (code, err) = run_to(fifo.to_str().unwrap(), &d, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no reader"), "{err}");

    // Character devices made here with mknod: a null device is written into and stays a
    // device; a full device fails the write (exit 1) and stays a device.
    for (name, minor, want) in [("null-dev", 3, 0), ("full-dev", 7, 1)] {
        let dev = d.join(name);
        // SAFETY: plain syscall; major 1 minors 3 and 7 are /dev/null and /dev/full.
        let rc = unsafe {
            libc::mknod(
                c(&dev).as_ptr(),
                libc::S_IFCHR | 0o640,
                libc::makedev(1, minor),
            )
        };
        assert_eq!(rc, 0, "mknod {name}");
        let (code, err) = run_to(dev.to_str().unwrap(), &d, &[]);
        assert_eq!(code, want, "{name}: {err}");
        let m = fs::symlink_metadata(&dev).unwrap();
        assert!(m.file_type().is_char_device(), "{name} was replaced");
        assert_eq!(m.rdev(), libc::makedev(1, minor));
        assert_eq!(m.mode() & 0o7777, 0o640);
        if want == 1 {
            assert_eq!(err.matches("No space left on device").count(), 1, "{err}");
        }
    }
    assert!(temps(&d).is_empty(), "{:?}", temps(&d));

    // A read-only filesystem: refused before tracing (exit 2).
    let ro = Tmpfs::mount(&d.join("ro"), "ro,size=1m");
    let (code, err) = run_to(ro.0.join("r.ndjson").to_str().unwrap(), &d, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    drop(ro);

    // A full filesystem: the write fails (exit 1), the existing file is left as it was and the
    // temporary file is removed.
    let full = Tmpfs::mount(&d.join("full"), "size=8k");
    let existing = full.0.join("r.ndjson");
    fs::write(&existing, "old\n").unwrap();
    let filler = vec![0u8; 16 << 10];
    let _ = fs::write(full.0.join("filler"), &filler);
    let (code, err) = run_to(existing.to_str().unwrap(), &d, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert_eq!(fs::read_to_string(&existing).unwrap(), "old\n");
    assert!(temps(&full.0).is_empty(), "{:?}", temps(&full.0));
    drop(full);

    let _ = fs::remove_dir_all(&d);
}

/// A tracekit killed with SIGKILL leaves its temporary file: the next run writing to the same
/// file removes it.
#[test]
fn stale_temporary_file_from_sigkill_is_removed() {
    require_root();
    let d = scratch("out-stale");
    let dest = d.join("r.ndjson");
    let mut tk = Tracer::spawn(&["fsync-lat", "--json", "--output", dest.to_str().unwrap()]);
    // The meta line goes to the file: wait for the temporary file instead.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while temps(&d).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no temporary file");
        std::thread::sleep(Duration::from_millis(10));
    }
    tk.signal(libc::SIGKILL);
    let _ = tk.child.wait();
    let stale = temps(&d);
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert!(stale[0].starts_with(".r.ndjson.tracekit-"), "{stale:?}");
    let (code, err) = run_to(dest.to_str().unwrap(), &d, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(temps(&d).is_empty(), "stale file kept: {:?}", temps(&d));
    assert!(is_report(&fs::read_to_string(&dest).unwrap()));
    let _ = fs::remove_dir_all(&d);
}

/// With --interval, each interval is in the file as soon as it ends (appended, as `tail -f`
/// follows), while tracekit still runs; an existing file is appended to, not truncated.
#[test]
fn interval_output_is_visible_while_running() {
    require_root();
    let d = scratch("out-interval");
    let dest = d.join("live.ndjson");
    fs::write(&dest, "kept\n").unwrap();
    let mut tk = Tracer::spawn(&[
        "fsync-lat",
        "--json",
        "--interval",
        "200ms",
        "--output",
        dest.to_str().unwrap(),
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&dest).unwrap();
        if text
            .lines()
            .filter(|l| l.contains("\"type\":\"stats\""))
            .count()
            >= 2
        {
            assert!(text.starts_with("kept\n"), "truncated: {text}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "intervals not visible while running: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        tk.child.try_wait().unwrap().is_none(),
        "tracekit ended early"
    );
    tk.signal(libc::SIGINT);
    let (status, _, stderr) = tk.finish(Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    assert!(temps(&d).is_empty());
    let _ = fs::remove_dir_all(&d);
}

/// Ids of the BPF programs `pid` holds, from its descriptors' fdinfo (a program's fd and a
/// link's both say `prog_id:`).
fn held_program_ids(pid: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| fs::read_to_string(e.path()).ok())
                .flat_map(|t| {
                    t.lines()
                        .filter_map(|l| l.strip_prefix("prog_id:"))
                        .filter_map(|v| v.trim().parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A FIFO whose reader holds it open and never reads, its buffer shrunk to one page so the
/// first lines fill it. Dropping it closes the reader's end and removes the FIFO.
struct StalledFifo {
    path: PathBuf,
    _reader: fs::File,
}

impl StalledFifo {
    fn new(tag: &str) -> StalledFifo {
        use std::os::{fd::AsRawFd, unix::fs::OpenOptionsExt};
        let d = scratch(tag);
        let path = d.join("stalled");
        // SAFETY: plain syscall with a valid path.
        assert_eq!(unsafe { libc::mkfifo(c(&path).as_ptr(), 0o600) }, 0);
        // Read-write: the open does not wait for a writer, and the end counts as a reader.
        let reader = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        // SAFETY: fcntl on an fd we own.
        let sz = unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
        assert!(
            sz >= 4096,
            "F_SETPIPE_SZ: {}",
            std::io::Error::last_os_error()
        );
        StalledFifo {
            path,
            _reader: reader,
        }
    }
}

impl StalledFifo {
    /// Fills the FIFO's page before tracekit starts, so its first write would block: a report
    /// written once at the end (triage) may fit in a page, and must stall all the same.
    fn fill(&self) {
        use std::os::{fd::AsRawFd, unix::fs::OpenOptionsExt};
        let w = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path)
            .unwrap();
        let junk = [b'x'; 4096];
        // SAFETY: writes from a live buffer to our fd, until the FIFO is full (EAGAIN).
        while unsafe { libc::write(w.as_raw_fd(), junk.as_ptr().cast(), junk.len()) } > 0 {}
    }
}

impl Drop for StalledFifo {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Where a stalled run writes: a FIFO given to `--output`, or stdout itself.
enum Stalled {
    Fifo {
        _fifo: StalledFifo,
    },
    /// A pipe as stdout whose read end the test holds and never reads, filled before tracekit
    /// starts, so its first write would block.
    Stdout {
        _reader: std::os::fd::OwnedFd,
    },
}

/// A pipe already full: the read end (never read), and the write end for the child's stdout.
fn full_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into `fds`, which we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just created and are owned by nobody else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on fds we own.
    unsafe {
        libc::fcntl(rd.as_raw_fd(), libc::F_SETPIPE_SZ, 4096);
        libc::fcntl(wr.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
    }
    let junk = [b'x'; 4096];
    // SAFETY: writes from a live buffer to our fd, until the pipe is full (EAGAIN).
    while unsafe { libc::write(wr.as_raw_fd(), junk.as_ptr().cast(), junk.len()) } > 0 {}
    // Blocking again: tracekit inherits the file description as a shell would hand it over.
    // SAFETY: as above.
    unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETFL, 0) };
    (rd, wr)
}

/// Runs `fsync-lat --json --interval 50ms ARGS` into a stalled target (a stats line of ~400
/// bytes every 50 ms fills the one-page FIFO in half a second; the stdout pipe is full from
/// the start); `sigterm_after`: SIGTERM that long after it attached. It must end within 20 s
/// (not sit in write()), say on stderr that the output stalled and how much was lost, and have
/// detached its programs while it still waits for the reader: the kernel no longer has them
/// loaded at some moment before the process exits.
fn stalled_run(tag: &str, to_stdout: bool, args: &[&str], sigterm_after: Option<Duration>) {
    let fsync = ["fsync-lat", "--json", "--interval", "50ms"];
    stalled_run_of(&fsync, 20, tag, to_stdout, args, sigterm_after);
}

/// [`stalled_run`] of any command (`cmd`, then `args`), which must end within `limit` seconds;
/// a FIFO is full before it starts. The programs watched are all it ever held.
fn stalled_run_of(
    command: &[&str],
    limit: u64,
    tag: &str,
    to_stdout: bool,
    args: &[&str],
    sigterm_after: Option<Duration>,
) {
    require_root();
    let what = command[0];
    let filled = what != "fsync-lat";
    let mut cmd = Command::new(tracekit_bin());
    ends_with_the_test(&mut cmd).args(command);
    let target = if to_stdout {
        let (rd, wr) = full_pipe();
        cmd.stdout(std::process::Stdio::from(wr));
        Stalled::Stdout { _reader: rd }
    } else {
        let fifo = StalledFifo::new(tag);
        if filled {
            fifo.fill();
        }
        cmd.arg("--output")
            .arg(&fifo.path)
            .stdout(std::process::Stdio::null());
        Stalled::Fifo { _fifo: fifo }
    };
    let mut child = cmd
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(cmd);
    let pid = child.id();
    let start = std::time::Instant::now();
    let deadline = start + Duration::from_secs(limit);
    let mut ids = Vec::new();
    while ids.is_empty() && std::time::Instant::now() < deadline {
        ids = held_program_ids(pid);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!ids.is_empty(), "{what} attached nothing within {limit} s");
    if let Some(after) = sigterm_after {
        std::thread::sleep(after);
        // SAFETY: plain syscall on our own, not yet reaped, child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let mut gone_while_alive = false;
    let status = loop {
        let loaded = loaded_program_ids();
        // Checked after the programs were: if it still runs, they went before its exit.
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        // A command of many collectors attaches them one after another.
        for i in held_program_ids(pid) {
            if !ids.contains(&i) {
                ids.push(i);
            }
        }
        if !ids.iter().any(|i| loaded.contains(i)) {
            gone_while_alive = true;
        }
        if std::time::Instant::now() > deadline {
            let still = held_program_ids(pid);
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} writing to a stalled {} did not exit within {limit} s (holding {} programs)",
                if to_stdout { "stdout" } else { "FIFO" },
                still.len()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let err = take_stderr(&mut child);
    assert!(
        err.contains("stalled") && err.contains("bytes"),
        "no word of the stall on stderr ({status}): {err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.contains("stalled")).count(),
        1,
        "the stall is said once: {err}"
    );
    assert_eq!(status.code(), Some(1), "lost output exits 1: {err}");
    let left = wait_unloaded(&ids);
    assert!(left.is_empty(), "programs {left:?} still loaded: {err}");
    assert!(
        gone_while_alive,
        "the programs stayed loaded until tracekit exited: the stalled sink was waited for before detaching ({err})"
    );
    drop(target);
}

/// A reader that opened the FIFO and never reads: the run still ends at --duration, detached.
#[test]
fn stalled_fifo_ends_at_duration() {
    stalled_run("out-stall-dur", false, &["--duration", "3s"], None);
}

/// The same, ended by SIGTERM two seconds into a 60 s run.
#[test]
fn stalled_fifo_ends_on_sigterm() {
    stalled_run(
        "out-stall-term",
        false,
        &["--duration", "60s"],
        Some(Duration::from_secs(2)),
    );
}

/// `tracekit fsync-lat --json | (a reader that never reads)`: the run ends at --duration,
/// detached, and says the output stalled.
#[test]
fn stalled_stdout_ends_at_duration() {
    stalled_run("out-stall-stdout-dur", true, &["--duration", "3s"], None);
}

/// The same, ended by SIGTERM one second into a 60 s run.
#[test]
fn stalled_stdout_ends_on_sigterm() {
    stalled_run(
        "out-stall-stdout-term",
        true,
        &["--duration", "60s"],
        Some(Duration::from_secs(1)),
    );
}

/// `tracekit triage --duration 3s | (a reader that never reads)`: its report, written once at
/// the end, sat in write() with every collector's programs attached; now the run ends, detached,
/// and says the output stalled.
#[test]
fn stalled_triage_stdout_ends_at_duration() {
    stalled_run_of(
        &["triage"],
        60,
        "out-stall-triage-stdout",
        true,
        &["--duration", "3s"],
        None,
    );
}

/// `tracekit triage --json --duration 3s --output FIFO`, its reader holding the FIFO open
/// (full) and never reading: the programs go before the output's grace.
#[test]
fn stalled_triage_fifo_ends_at_duration() {
    stalled_run_of(
        &["triage", "--json"],
        60,
        "out-stall-triage-fifo",
        false,
        &["--duration", "3s"],
        None,
    );
}

/// `tracekit record --output FIFO` (a FIFO is written through, not replaced), its reader
/// holding it open and never reading: ends at --duration, detached.
#[test]
fn stalled_record_fifo_ends_at_duration() {
    stalled_run_of(
        &["record", "--interval", "1s"],
        60,
        "out-stall-record-fifo",
        false,
        &["--duration", "3s"],
        None,
    );
}

/// `tracekit serve | (a log reader that never reads)`: its meta line sat in write() before
/// the first window, deaf to SIGTERM; now SIGTERM ends it, detached, and the stall is said.
#[test]
fn stalled_serve_stdout_ends_on_sigterm() {
    stalled_run_of(
        &["serve", "--listen", "127.0.0.1:0"],
        60,
        "out-stall-serve-stdout",
        true,
        &[],
        Some(Duration::from_secs(3)),
    );
}
