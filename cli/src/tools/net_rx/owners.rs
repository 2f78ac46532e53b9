//! `--pid`/`--comm` for net-rx: whose sockets' drops are kept; and the owners of dropping
//! sockets learnt while they lived.

use std::collections::HashMap;

use crate::{host::net, report::who::Owner};

/// Most sockets whose owners are remembered; past it the memory starts over.
const LEARNT_CAP: usize = 4096;

/// The owners of sockets the kernel reported drops for, read from `/proc/*/fd` shortly after
/// the first drop (the collector's poll), so a socket closed before the window ends still
/// names its receiver (issue #33: iperf3's UDP data socket, closed before the report, was
/// "no process holds it now").
#[derive(Default)]
pub struct Learnt {
    by_ino: HashMap<u64, (Vec<u32>, Owner)>,
}

impl Learnt {
    /// Reads the owners of those of `inodes` not known yet (one pass over `/proc/*/fd`, only
    /// when there is a new one). A socket nobody holds is remembered as such too, so it is not
    /// looked up again.
    pub fn learn(&mut self, inodes: impl IntoIterator<Item = u64>) {
        let mut new: Vec<u64> = inodes
            .into_iter()
            .filter(|i| *i != 0 && !self.by_ino.contains_key(i))
            .collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return;
        }
        if self.by_ino.len() + new.len() > LEARNT_CAP {
            self.by_ino.clear();
        }
        let owners = net::socket_owners(&new);
        for ino in new {
            let pids = net::holders(&owners, &[ino]);
            let owner = Owner::of(pids.first().copied());
            self.by_ino.insert(ino, (pids, owner));
        }
    }

    /// The holders of socket `ino` when it was learnt, and the first of them as it was then.
    pub fn get(&self, ino: u64) -> Option<&(Vec<u32>, Owner)> {
        self.by_ino.get(&ino).filter(|(pids, _)| !pids.is_empty())
    }
}

/// Whose sockets `--pid`/`--comm` keep. The kernel side filters nothing (a drop happens on
/// behalf of no process): the owner is known only once the socket is.
pub struct Owners {
    pub pids: Vec<u32>,
    /// The comm as the kernel keeps it (15 bytes).
    pub comm: Option<[u8; 16]>,
}

impl Owners {
    pub fn owns(&self, pids: &[u32], comm: Option<&str>) -> bool {
        let by_comm = match (&self.comm, comm) {
            (Some(want), Some(c)) => {
                let n = c.len().min(15);
                want[..n] == c.as_bytes()[..n] && want[n] == 0
            }
            _ => false,
        };
        by_comm || pids.iter().any(|p| self.pids.contains(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Scope;

    /// A socket learnt while its holder lives keeps naming it after the holder closes it.
    #[test]
    fn a_closed_sockets_owner_is_remembered() {
        use std::os::fd::AsRawFd;
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let ino = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd()))
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("socket:[")
            .trim_end_matches(']')
            .parse::<u64>()
            .unwrap();
        let mut l = Learnt::default();
        l.learn([ino, 0]);
        drop(s);
        l.learn([ino]);
        let (pids, owner) = l.get(ino).expect("learnt");
        assert_eq!(pids, &vec![std::process::id()]);
        assert_eq!(owner.pid, Some(std::process::id()));
        assert!(owner.comm.is_some());
        l.learn([u64::MAX]);
        assert!(l.get(u64::MAX).is_none(), "nobody holds it");
    }

    #[test]
    fn owners_by_pid_or_kernel_comm() {
        let o = Owners {
            pids: vec![42],
            comm: None,
        };
        assert!(o.owns(&[7, 42], None));
        assert!(!o.owns(&[7], Some("x")));
        assert!(!o.owns(&[], None));
        let scope = Scope {
            comm: Some("a-very-long-collector-name".into()),
            ..Default::default()
        };
        let o = Owners {
            pids: vec![],
            comm: scope.comm_bytes(),
        };
        // /proc shows the 15 bytes the kernel keeps.
        assert!(o.owns(&[1], Some("a-very-long-col")));
        assert!(!o.owns(&[1], Some("a-very")));
        assert!(!o.owns(&[1], None));
    }
}
