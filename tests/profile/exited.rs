//! A containerised process that exits before its last stacks are symbolised (issue 19:
//! "processes that exit during the window are still symbolised"): its binary exists only in the
//! container's root, so once the process is gone the path in its maps names nothing on the host
//! (or, worse, another file). The binaries it mapped are opened when it is first seen, and its
//! late stacks resolve to them.

use super::*;

/// Inside the container's image only.
const EXIT_BIN: &str = "/opt/tk/tk_ctr_exit";
/// The function the process runs until told to finish.
const WARM: &str = "tk_warm_spin";

/// Spins in `tk_warm_spin` until SIGUSR1 (or 60 s), then in `tk_hot_spin` for one second, and
/// exits: `tk_hot_spin`'s stacks are new after the signal.
const EXIT_MAIN: &str = r#"
#include <signal.h>
static volatile sig_atomic_t go;
static void on_usr1(int s) { (void)s; go = 1; }
__attribute__((noinline)) unsigned long tk_warm_spin(unsigned long n) {
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) x += i ^ 3;
    return x;
}
int main(void) {
    signal(SIGUSR1, on_usr1);
    double t0 = now();
    unsigned long s = 0;
    while (!go && now() - t0 < 60) s += tk_warm_spin(2000000);
    double t1 = now();
    while (now() - t1 < 1.0) s += tk_hot_spin(2000000);
    return (int)(s & 1) * 0;
}
"#;

/// Sends `sig` to process `pid`.
fn kill(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    assert_eq!(
        unsafe { libc::kill(pid as i32, sig) },
        0,
        "kill {pid} {sig}"
    );
}

/// The process runs `tk_warm_spin` in a container while two tracers (frame pointers, DWARF)
/// see it; then the tracers are stopped (SIGSTOP: as a tracer busy elsewhere, or a process
/// shorter than a poll), the process switches to `tk_hot_spin` for a second and exits, and only
/// then do the tracers go on: `tk_hot_spin`'s stacks reach them after the process has gone.
/// Both name `tk_hot_spin` for ≥ 80 % of the samples not in `tk_warm_spin`, and the container
/// on the process's rows. (Resolved by the path in its maps instead, as before, the hot
/// samples had no user frames: 0 named.)
#[test]
fn exited_container_process_is_symbolised_from_its_own_binary() {
    let (mut pod, name, dir) =
        super::container::image_of("tk-prof-exit", &format!("{SPIN_C}{EXIT_MAIN}"), EXIT_BIN);
    let mut tracers = Vec::new();
    for mode in ["fp", "dwarf"] {
        let mut tk = Tracer::spawn(&[
            "profile",
            "--json",
            "--unwind",
            mode,
            "--comm",
            "tk_ctr_exit",
        ]);
        assert_eq!(tk.wait_attached()["unwind"], mode);
        tracers.push((mode, tk));
    }
    let pid = pod.run(&name, &[EXIT_BIN]);
    assert!(
        !Path::new(EXIT_BIN).exists(),
        "{EXIT_BIN} exists on the host"
    );
    // A few polls see the process alive (frame pointers poll every second, DWARF every 200 ms).
    std::thread::sleep(Duration::from_secs(3));
    for (_, tk) in &tracers {
        tk.signal(libc::SIGSTOP);
    }
    kill(pid, libc::SIGUSR1);
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "pid {pid} still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (_, tk) in &tracers {
        tk.signal(libc::SIGCONT);
    }
    // Polls after the exit read the hot stacks.
    std::thread::sleep(Duration::from_millis(1500));
    let pid64 = u64::from(pid);
    for (mode, tk) in tracers {
        tk.signal(libc::SIGINT);
        let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
        assert!(status.success(), "{stderr}");
        let procs = rows(&lines, "process", pid64);
        assert!(!procs.is_empty(), "{mode}: no process row for pid {pid}");
        let (samples, hot, _) = shares(&lines, pid64, HOT).unwrap();
        let (_, warm, _) = shares(&lines, pid64, WARM).unwrap();
        let late = samples - warm;
        eprintln!(
            "--unwind {mode}: {samples} samples of pid {pid} (container {}): {warm} in {WARM} while it ran, {hot} of the {late} others in {HOT} after it exited",
            procs[0]["container"]
        );
        for r in &procs {
            assert_eq!(r["container"], name, "{mode}: the row's container: {r}");
        }
        assert!(warm >= 20, "{mode}: {warm} samples in {WARM}");
        assert!(
            hot >= 20 && hot as f64 >= 0.8 * late as f64,
            "{mode}: {hot} of {late} late samples in {HOT}"
        );
    }
    drop(pod);
    let _ = std::fs::remove_dir_all(dir);
}
