//! Everything that talks to the kernel's tracing machinery: BTF, tracefs, feature probes, the
//! attach policy shared by the loader and `doctor`, loading and attaching, generation maps.

pub mod btf;
pub mod features;
pub mod hooks;
pub mod loader;
pub mod maps;
pub mod proginfo;
pub mod tracefs;

/// Runs a `BPF_PROG_LOAD` (`load`) again while it fails with EAGAIN, at most five times as
/// libbpf does (`sys_bpf_prog_load`): the verifier gives up with EAGAIN when a signal is pending
/// (`signal_pending()` in `do_check`), so a Ctrl-C during loading would otherwise read as a
/// kernel without the feature. The signal handler has run by the time the call returns.
pub fn retry_eagain<T, E>(
    mut load: impl FnMut() -> Result<T, E>,
    io: impl Fn(&E) -> Option<&std::io::Error>,
) -> Result<T, E> {
    let mut tries = 1;
    loop {
        match load() {
            Err(e) if tries < 5 && io(&e).and_then(|e| e.raw_os_error()) == Some(libc::EAGAIN) => {
                tries += 1;
            }
            r => return r,
        }
    }
}

/// Runs `f` with SIGINT, SIGTERM and SIGHUP blocked on this thread (and on threads it spawns),
/// then lets a signal that came meanwhile through: it is delayed, never lost.
///
/// For aya's `EbpfLoader::load`: its first call probes kernel features once for the process
/// (`aya::FEATURES`, a `LazyLock`) by loading tiny programs, and a pending signal makes the
/// verifier answer EAGAIN, which aya reads as "no such feature" with no retry. A Ctrl-C in the
/// first milliseconds then left `bpf_global_data` false, the .bss/.data maps uncreated and the
/// load failing with "section N not found" (seen in CI, tests/reliability.rs).
pub fn with_stop_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data initialised by sigemptyset/sigaddset before use;
    // pthread_sigmask changes only this thread's mask and `old` restores it exactly.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        let blocked = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) == 0;
        let r = f();
        if blocked {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        r
    }
}

/// The `io::Error` inside an aya program error, for [`retry_eagain`].
pub fn program_io_error(e: &aya::programs::ProgramError) -> Option<&std::io::Error> {
    use aya::programs::ProgramError as P;
    match e {
        P::LoadError { io_error, .. } => Some(io_error),
        P::SyscallError(s) => Some(&s.io_error),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::retry_eagain;
    use std::io::Error;

    fn io(e: &Error) -> Option<&Error> {
        Some(e)
    }

    fn fails(n: u32, errno: i32) -> impl FnMut() -> Result<u32, Error> {
        let mut calls = 0;
        move || {
            calls += 1;
            if calls <= n {
                Err(Error::from_raw_os_error(errno))
            } else {
                Ok(calls)
            }
        }
    }

    #[test]
    fn eagain_is_retried_up_to_five_calls() {
        assert_eq!(retry_eagain(fails(2, libc::EAGAIN), io).unwrap(), 3);
        assert_eq!(retry_eagain(fails(4, libc::EAGAIN), io).unwrap(), 5);
        let e = retry_eagain(fails(5, libc::EAGAIN), io).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        // Any other error is final at once.
        let e = retry_eagain(fails(1, libc::EPERM), io).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn a_signal_while_blocked_is_delivered_after() {
        use std::sync::{
            atomic::{AtomicBool, Ordering},
            Arc,
        };
        let seen = Arc::new(AtomicBool::new(false));
        let id = signal_hook::flag::register(libc::SIGHUP, Arc::clone(&seen)).unwrap();
        let during = super::with_stop_signals_blocked(|| {
            // SAFETY: raise() sends SIGHUP to this thread, whose handler only sets a flag.
            unsafe { libc::raise(libc::SIGHUP) };
            seen.load(Ordering::SeqCst)
        });
        signal_hook::low_level::unregister(id);
        assert!(!during, "the handler ran while the signal was blocked");
        assert!(seen.load(Ordering::SeqCst), "the blocked signal was lost");
    }
}
