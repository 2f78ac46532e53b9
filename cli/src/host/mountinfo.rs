//! `/proc/self/mountinfo`: the one parser every reader of mounts uses (tracefs, cgroup layout,
//! doctor). Lines are parsed by `procfs`; mount points are unescaped here because the kernel
//! writes space, tab, newline and backslash as octal `\NNN` and procfs leaves them as is.

use std::path::PathBuf;

use procfs::process::MountInfo;

use super::{proc_path, read_text, HostError};

/// One mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// Per-superblock options (`rw,memory` for a v1 memory cgroup).
    pub super_options: Vec<String>,
}

impl Mount {
    pub fn has_option(&self, opt: &str) -> bool {
        self.super_options.iter().any(|o| o == opt)
    }
}

/// Parses mountinfo text; malformed lines are skipped (a mount we cannot read is a mount we do
/// not use, not a reason to fail).
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| MountInfo::from_line(l).ok())
        .map(|m| {
            let mut super_options: Vec<String> = m
                .super_options
                .iter()
                .map(|(k, v)| match v {
                    Some(v) => format!("{k}={v}"),
                    None => k.clone(),
                })
                .collect();
            super_options.sort();
            Mount {
                mount_point: PathBuf::from(unescape(&m.mount_point.to_string_lossy())),
                fs_type: m.fs_type,
                super_options,
            }
        })
        .collect()
}

/// This process's mounts.
pub fn read() -> Result<Vec<Mount>, HostError> {
    Ok(parse(&read_text(&proc_path("self/mountinfo"))?))
}

/// The first mount of file-system type `fs_type`.
pub fn first_of<'a>(mounts: &'a [Mount], fs_type: &str) -> Option<&'a Mount> {
    mounts.iter().find(|m| m.fs_type == fs_type)
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:13 - cgroup2 cgroup2 rw,nsdelegate
36 25 0:12 / /sys/kernel/my\\040tracing rw,relatime shared:5 - tracefs nodev rw
garbage line without a separator
";

    #[test]
    fn parses_types_points_and_options() {
        let m = parse(HYBRID);
        assert_eq!(m.len(), 5, "{m:?}");
        let mem = m.iter().find(|m| m.has_option("memory")).unwrap();
        assert_eq!(mem.fs_type, "cgroup");
        assert_eq!(mem.mount_point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(
            first_of(&m, "cgroup2").unwrap().mount_point,
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            first_of(&m, "tracefs").unwrap().mount_point,
            PathBuf::from("/sys/kernel/my tracing")
        );
        assert!(first_of(&m, "debugfs").is_none());
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("a\\040b\\134c"), "a b\\c");
        assert_eq!(unescape("\\04"), "\\04");
        assert_eq!(unescape("\\999"), "\\999");
        assert_eq!(unescape("end\\"), "end\\");
    }

    #[test]
    fn reads_this_machine() {
        let m = read().unwrap();
        assert!(m.iter().any(|m| m.mount_point == std::path::Path::new("/")));
    }
}
