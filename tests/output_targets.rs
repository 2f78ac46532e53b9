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
