//! Sink's tests: replacement, refusal and the paced writers on real files and FIFOs.
use super::*;

/// A FIFO at `f`.
fn mkfifo(f: &Path) {
    let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain syscall with a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// The FIFO `f` opened for reading (non-blocking, so no writer is needed yet).
fn idle_reader(f: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(f)
        .unwrap()
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tk-out-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn existing_file_survives_until_finish() {
    let d = tmpdir("atomic");
    let dest = d.join("report.json");
    fs::write(&dest, "old\n").unwrap();
    let mut s = Sink::open(Some(&dest), false).unwrap();
    s.write("new\n").unwrap();
    assert_eq!(fs::read_to_string(&dest).unwrap(), "old\n");
    s.finish().unwrap();
    assert_eq!(fs::read_to_string(&dest).unwrap(), "new\n");
    assert_eq!(
        fs::read_dir(&d).unwrap().count(),
        1,
        "temporary file left behind"
    );
}

#[test]
fn replacement_keeps_mode() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir("mode");
    let dest = d.join("r.txt");
    fs::write(&dest, "old").unwrap();
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o600)).unwrap();
    let mut s = Sink::open(Some(&dest), false).unwrap();
    s.write("new").unwrap();
    s.finish().unwrap();
    let m = fs::metadata(&dest).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
}

#[test]
fn abandoned_output_leaves_old_file_and_no_temp() {
    let d = tmpdir("abandon");
    let dest = d.join("r.txt");
    fs::write(&dest, "old").unwrap();
    {
        let mut s = Sink::open(Some(&dest), false).unwrap();
        s.write("partial").unwrap();
    }
    assert_eq!(fs::read_to_string(&dest).unwrap(), "old");
    assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
}

#[test]
fn stale_temps_of_dead_processes_are_removed_others_kept() {
    let d = tmpdir("stale");
    let dest = d.join("r.txt");
    // pid_max is at most 2^22: this pid cannot exist.
    let dead = d.join(format!(".r.txt{TMP_MARK}{}{TMP_SUFFIX}", 1u32 << 23));
    let alive = d.join(format!(".r.txt{TMP_MARK}1{TMP_SUFFIX}"));
    let other = d.join(format!(".other{TMP_MARK}{}{TMP_SUFFIX}", 1u32 << 23));
    for f in [&dead, &alive, &other] {
        fs::write(f, "x").unwrap();
    }
    let mut s = Sink::open(Some(&dest), false).unwrap();
    s.write("r").unwrap();
    s.finish().unwrap();
    assert!(!dead.exists());
    assert!(alive.exists(), "pid 1 lives: its file is not stale");
    assert!(other.exists(), "another report's file is not touched");
}

#[test]
fn interval_mode_appends_as_it_goes() {
    let d = tmpdir("append");
    let dest = d.join("r.ndjson");
    fs::write(&dest, "kept\n").unwrap();
    let mut s = Sink::open(Some(&dest), true).unwrap();
    s.write("one\n").unwrap();
    assert_eq!(fs::read_to_string(&dest).unwrap(), "kept\none\n");
    s.write("two\n").unwrap();
    s.finish().unwrap();
    assert_eq!(fs::read_to_string(&dest).unwrap(), "kept\none\ntwo\n");
}

#[test]
fn refuses_symlinks_directories_and_block_devices() {
    let d = tmpdir("symlink");
    let target = d.join("target");
    fs::write(&target, "precious").unwrap();
    let link = d.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = Sink::open(Some(&link), false).err().unwrap();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    let dangling = d.join("dangling");
    std::os::unix::fs::symlink(d.join("nothing"), &dangling).unwrap();
    assert!(Sink::open(Some(&dangling), false).is_err());
    assert!(!d.join("nothing").exists());
    for p in [d.as_path(), Path::new("."), Path::new("/")] {
        let e = Sink::open(Some(p), false).err().unwrap();
        assert!(e.to_string().contains("directory"), "{e}");
        assert_eq!(
            crate::error::Error::from(e).exit(),
            crate::error::Exit::Usage
        );
    }
    let slash = PathBuf::from(format!("{}/new/", d.display()));
    let e = Sink::open(Some(&slash), false).err().unwrap();
    assert!(e.to_string().contains("ends in /"), "{e}");
    assert!(!d.join("new").exists());
}

#[test]
fn devices_are_written_not_replaced() {
    let mut s = Sink::open(Some(Path::new("/dev/null")), false).unwrap();
    assert!(matches!(s, Sink::Direct { .. }));
    s.write("x").unwrap();
    s.finish().unwrap();
    assert!(fs::symlink_metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    let mut full = Sink::open(Some(Path::new("/dev/full")), false).unwrap();
    let e = full.write("x").unwrap_err();
    let text = e.to_string();
    assert_eq!(
        crate::error::Error::from(e).exit(),
        crate::error::Exit::Failure
    );
    assert_eq!(text.matches("No space left").count(), 1, "{text}");
}

#[test]
fn fifo_without_reader_is_refused_at_once() {
    let d = tmpdir("fifo");
    let f = d.join("fifo");
    mkfifo(&f);
    let e = Sink::open(Some(&f), false).err().unwrap();
    assert!(e.to_string().contains("no reader"), "{e}");
    assert!(fs::symlink_metadata(&f).unwrap().file_type().is_fifo());
}

/// A FIFO whose reader never reads: writes return at once, what does not fit is held back
/// up to the cap and then dropped, and finishing says how much never arrived.
#[test]
fn stalled_fifo_reader_never_blocks_the_writer() {
    let d = tmpdir("stall");
    let f = d.join("fifo");
    mkfifo(&f);
    // The reader: open, never read.
    let reader = idle_reader(&f);
    let mut s = Sink::open(Some(&f), false).unwrap();
    let line = format!("{}\n", "x".repeat(1023));
    let n = 2 * PENDING_CAP / line.len();
    for _ in 0..n {
        s.write(&line).unwrap();
    }
    let Sink::Direct {
        pace: Some(pace), ..
    } = &s
    else {
        panic!("a FIFO is paced");
    };
    assert!(pace.pending.len() <= PENDING_CAP, "{}", pace.pending.len());
    assert!(
        pace.lost > 0 && pace.lost % line.len() as u64 == 0,
        "{}",
        pace.lost
    );
    let e = s.finish_within(Duration::from_millis(50)).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("stalled") && text.contains("bytes"), "{text}");
    let pipe_took = (n * line.len()) as u64 - pace_lost(&text);
    assert!(pipe_took > 0 && pipe_took <= 1 << 20, "{text}");
    assert_eq!(
        crate::error::Error::from(e).exit(),
        crate::error::Exit::Failure
    );
    drop(reader);
}

/// The byte count of a stall error.
fn pace_lost(text: &str) -> u64 {
    let before = text.split(" bytes").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A reader that is reading gets every byte, in order, held-back ones included.
#[test]
fn slow_fifo_reader_gets_everything() {
    let d = tmpdir("slow");
    let f = d.join("fifo");
    mkfifo(&f);
    let reader = idle_reader(&f);
    let mut s = Sink::open(Some(&f), false).unwrap();
    let mut want = String::new();
    for i in 0..20_000 {
        let l = format!("line {i}\n");
        s.write(&l).unwrap();
        want.push_str(&l);
    }
    let t = std::thread::spawn(move || {
        // SAFETY: fcntl on an fd this thread owns; reads block from here on.
        unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, 0) };
        let mut got = String::new();
        io::Read::read_to_string(&mut { reader }, &mut got).unwrap();
        got
    });
    s.finish_within(Duration::from_secs(30)).unwrap();
    drop(s);
    assert_eq!(t.join().unwrap(), want);
}
