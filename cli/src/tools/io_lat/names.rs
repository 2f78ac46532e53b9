//! Names io-lat shows: ops from the kernel's BTF, errors as errno names.

use std::collections::HashMap as StdHashMap;

use probes_common::io_lat::{NSTATUS, REQ_OP_MASK};

/// Names of ops (from BTF `enum req_op`, so new ops are named without a rebuild) and errors.
pub struct Names {
    ops: StdHashMap<u32, String>,
    /// Error slots hold errnos (4.13–5.x kernels, classic tracepoints), not `blk_status_t`.
    errno: bool,
}

impl Names {
    pub fn new(errno: bool) -> Names {
        let mut ops: StdHashMap<u32, String> = crate::kernel::btf::vmlinux()
            .map(|b| b.enum_values("REQ_OP_"))
            .unwrap_or_default()
            .into_iter()
            .filter(|(n, _)| n != "REQ_OP_LAST")
            .filter_map(|(n, v)| Some((v as u32, n.strip_prefix("REQ_OP_")?.to_lowercase())))
            .collect();
        for (v, n) in [(0, "read"), (1, "write"), (2, "flush"), (3, "discard")] {
            ops.entry(v).or_insert_with(|| n.to_string());
        }
        Names { ops, errno }
    }

    pub fn op(&self, op: u32) -> String {
        let op = op & REQ_OP_MASK;
        self.ops
            .get(&op)
            .cloned()
            .unwrap_or_else(|| format!("op{op}"))
    }

    /// The errno name of error slot `s`.
    pub fn error(&self, s: usize) -> String {
        error_name(s, self.errno)
    }
}

/// errno name of an error slot: the errno itself where the kernel passes one, else a 6.x
/// `blk_status_t` (`blk_errors[]` in block/blk-core.c; the numbers have moved between
/// kernels, so unknown ones are shown raw). The last slot holds everything from there up.
pub fn error_name(s: usize, errno: bool) -> String {
    const ERRNO: &[(usize, &str)] = &[
        (5, "EIO"),
        (11, "EAGAIN"),
        (12, "ENOMEM"),
        (16, "EBUSY"),
        (19, "ENODEV"),
        (22, "EINVAL"),
        (28, "ENOSPC"),
    ];
    const BLK: [&str; 20] = [
        "",
        "EOPNOTSUPP",
        "ETIMEDOUT",
        "ENOSPC",
        "ENOLINK",
        "EREMOTEIO",
        "EBADE",
        "ENODATA",
        "EILSEQ",
        "ENOMEM",
        "EIO",
        "EREMCHG",
        "EAGAIN",
        "EBUSY",
        "ETOOMANYREFS",
        "EOVERFLOW",
        "ENODEV",
        "ETIME",
        "",
        "EINVAL",
    ];
    let last = s >= NSTATUS - 1;
    let named = if errno {
        ERRNO.iter().find(|(n, _)| *n == s).map(|(_, e)| *e)
    } else {
        BLK.get(s).copied().filter(|e| !e.is_empty())
    };
    match (named, last, errno) {
        (Some(n), false, _) => n.to_string(),
        (_, true, true) => format!("errno>={s}"),
        (_, true, false) => format!("blk_status>={s}"),
        (None, false, true) => format!("errno {s}"),
        (None, false, false) => format!("blk_status {s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_per_kernel_kind() {
        assert_eq!(error_name(10, false), "EIO");
        assert_eq!(error_name(19, false), "EINVAL");
        assert_eq!(error_name(18, false), "blk_status 18");
        assert_eq!(error_name(31, false), "blk_status>=31");
        assert_eq!(error_name(5, true), "EIO");
        assert_eq!(error_name(7, true), "errno 7");
        assert_eq!(error_name(31, true), "errno>=31");
    }
}
