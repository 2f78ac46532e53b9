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
}
