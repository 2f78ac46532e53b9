//! `/proc/<pid>/maps`: a process's executable file mappings, for unwinders that need each
//! mapped binary's address range and file offset. Parsed here line by line: one odd line
//! (procfs rejects the whole file for one) must not hide the others.

use super::{proc_path, read_text, HostError};

/// One executable mapping of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecMap {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// (major, minor) of the file's device, and its inode: the file's identity.
    pub dev: (i32, i32),
    pub inode: u64,
    /// The path as the process sees it (resolve under `/proc/<pid>/root`).
    pub path: String,
}

/// The executable mappings of files in maps text (anonymous, `[vdso]` and non-executable
/// mappings are left out; malformed lines are skipped).
pub fn parse_exec(text: &str) -> Vec<ExecMap> {
    text.lines().filter_map(parse_line).collect()
}

/// `start-end perms offset major:minor inode path` (the path may hold spaces).
fn parse_line(line: &str) -> Option<ExecMap> {
    let mut f = line.splitn(6, ' ');
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?;
    let offset = f.next()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let inode: u64 = f.next()?.parse().ok()?;
    let path = f.next()?.trim_start();
    if perms.as_bytes().get(2) != Some(&b'x') || inode == 0 || !path.starts_with('/') {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(ExecMap {
        start: hex(start)?,
        end: hex(end)?,
        offset: hex(offset)?,
        dev: (hex(major)? as i32, hex(minor)? as i32),
        inode,
        path: path.to_string(),
    })
}

/// Load bias of a file mapped at `start` from file offset `offset` (avma = svma + bias), from
/// its ELF segments as (file offset, file size, virtual address).
pub fn load_bias(segments: &[(u64, u64, u64)], start: u64, offset: u64) -> Option<u64> {
    let &(off, _, vaddr) = segments
        .iter()
        .find(|&&(o, sz, _)| o & !0xfff <= offset && offset < o + sz)?;
    Some(
        start
            .wrapping_sub(offset)
            .wrapping_add(off)
            .wrapping_sub(vaddr),
    )
}

/// The executable file mappings of process `pid`.
pub fn read_exec(pid: u32) -> Result<Vec<ExecMap>, HostError> {
    Ok(parse_exec(&read_text(&proc_path(&format!("{pid}/maps")))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_executable_file_mappings() {
        let text = "\
55d0c4a00000-55d0c4a6f000 r--p 00000000 fe:01 1835 /usr/bin/python3.11
55d0c4a6f000-55d0c4d4d000 r-xp 0006f000 fe:01 1835 /usr/bin/python3.11
55d0c6000000-55d0c6200000 rw-p 00000000 00:00 0 [heap]
7f1a2b400000-7f1a2b426000 r--p 00000000 fe:01 2001 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a2b426000-7f1a2b59b000 r-xp 00026000 fe:01 2001 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a2b700000-7f1a2b701000 r-xp 00000000 00:00 0
7ffd1e9f0000-7ffd1e9f2000 r-xp 00000000 00:00 0 [vdso]
";
        let m = parse_exec(text);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0],
            ExecMap {
                start: 0x55d0c4a6f000,
                end: 0x55d0c4d4d000,
                offset: 0x6f000,
                dev: (0xfe, 1),
                inode: 1835,
                path: "/usr/bin/python3.11".into(),
            }
        );
        assert_eq!(m[1].path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(parse_exec("garbage\n").is_empty());
    }
}
