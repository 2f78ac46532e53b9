//! `--pid`/`--comm` for net-rx: whose sockets' drops are kept.

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
