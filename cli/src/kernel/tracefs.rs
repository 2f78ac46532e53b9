//! tracefs: find it (mount it when absent), and parse event `format` files into field offsets
//! and sizes. Kernel programs read tracepoint records at offsets from here, passed in as globals,
//! because Rust BPF code has no CO-RE and layouts differ between kernels and architectures.

use std::{
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error("tracefs is not mounted and mounting it at {path} failed ({source}); mount it with `mount -t tracefs nodev /sys/kernel/tracing`")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "tracefs has no event {category}:{name} ({path} missing); this kernel lacks the tracepoint"
    )]
    MissingEvent {
        category: String,
        name: String,
        path: PathBuf,
    },
    #[error("TRACEKIT_TRACEFS={path} is not a tracefs mount (it has no events/ directory)")]
    NotTracefs { path: PathBuf },
    #[error("permission denied reading {path}: tracefs is readable only by root (mode 0700); run as root or add CAP_DAC_READ_SEARCH")]
    Permission { path: PathBuf },
    #[error("tracefs is not mounted and mounting it at {path} needs CAP_SYS_ADMIN; run as root, or mount it first with `mount -t tracefs nodev /sys/kernel/tracing`")]
    MountPermission { path: PathBuf },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {msg}")]
    Parse {
        path: String,
        line: usize,
        msg: String,
    },
    #[error("event {event} has no field `{field}` on this kernel")]
    MissingField { event: String, field: String },
    #[error("event {event} field `{field}` is {size} bytes; expected {expected}")]
    FieldSize {
        event: String,
        field: String,
        size: u32,
        expected: String,
    },
}

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Declaration as written, e.g. `char prev_comm[16]`.
    pub decl: String,
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

/// A parsed `events/<category>/<name>/format`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFormat {
    /// `category:name`.
    pub event: String,
    pub id: u32,
    pub fields: Vec<Field>,
    pub print_fmt: String,
}

impl EventFormat {
    pub fn field(&self, name: &str) -> Result<&Field, TracefsError> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| TracefsError::MissingField {
                event: self.event.clone(),
                field: name.to_string(),
            })
    }

    /// Offset of `name`, checking its size is one of `sizes`.
    pub fn offset_of(&self, name: &str, sizes: &[u32]) -> Result<u32, TracefsError> {
        let f = self.field(name)?;
        if !sizes.contains(&f.size) {
            return Err(TracefsError::FieldSize {
                event: self.event.clone(),
                field: name.to_string(),
                size: f.size,
                expected: format!("{sizes:?}"),
            });
        }
        Ok(f.offset)
    }

    /// Value names of `__print_symbolic(REC->field, { 1, "name" }, ...)` in the print format, for
    /// fields such as `compaction:mm_compaction_end.status` or `skb:kfree_skb.reason`.
    pub fn symbols(&self, field: &str) -> Vec<(i64, String)> {
        let needle = format!("__print_symbolic(REC->{field},");
        let Some(start) = self.print_fmt.find(&needle) else {
            return Vec::new();
        };
        let rest = &self.print_fmt[start + needle.len()..];
        let mut out = Vec::new();
        let mut s = rest;
        // Entries look like `{ 3, "NO_SOCKET" }`; the list ends at the call's closing `)`.
        loop {
            let s_trim = s.trim_start_matches([' ', ',', '\t']);
            let Some(body) = s_trim.strip_prefix('{') else {
                break;
            };
            let Some(end) = body.find('}') else { break };
            let entry = &body[..end];
            if let Some((num, name)) = entry.split_once(',') {
                let num = num.trim();
                let parsed = if let Some(hex) = num.strip_prefix("0x") {
                    i64::from_str_radix(hex, 16).ok()
                } else {
                    num.parse::<i64>().ok()
                };
                let name = name.trim().trim_matches('"').to_string();
                if let Some(n) = parsed {
                    out.push((n, name));
                }
            }
            s = &body[end + 1..];
        }
        out
    }
}

/// Parses the text of a format file. `origin` names the file in errors.
pub fn parse_format(text: &str, origin: &str) -> Result<EventFormat, TracefsError> {
    let err = |line: usize, msg: &str| TracefsError::Parse {
        path: origin.to_string(),
        line,
        msg: msg.to_string(),
    };
    let mut name = None;
    let mut id = None;
    let mut fields = Vec::new();
    let mut print_fmt = String::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        let t = line.trim();
        if let Some(v) = t.strip_prefix("name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = t.strip_prefix("ID:") {
            id = Some(
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| err(lineno, "ID is not a number"))?,
            );
        } else if let Some(v) = t.strip_prefix("print fmt:") {
            print_fmt = v.trim().to_string();
        } else if t.starts_with("field:") {
            fields.push(parse_field_line(t).map_err(|m| err(lineno, &m))?);
        }
    }
    let name = name.ok_or_else(|| err(0, "no `name:` line"))?;
    let id = id.ok_or_else(|| err(0, "no `ID:` line"))?;
    if fields.is_empty() {
        return Err(err(0, "no fields"));
    }
    let event = origin
        .rsplit('/')
        .nth(2)
        .filter(|_| origin.ends_with("/format"))
        .map(|cat| format!("{cat}:{name}"))
        .unwrap_or(name);
    Ok(EventFormat {
        event,
        id,
        fields,
        print_fmt,
    })
}

/// `field:unsigned int prev_pid;\toffset:24;\tsize:4;\tsigned:1;`
fn parse_field_line(t: &str) -> Result<Field, String> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    let mut signed = false;
    for part in t.split(';') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (k, v) = part
            .split_once(':')
            .ok_or_else(|| format!("malformed field attribute `{part}`"))?;
        match k.trim() {
            "field" => decl = Some(v.trim().to_string()),
            "offset" => offset = Some(v.trim().parse::<u32>().map_err(|_| "bad offset")?),
            "size" => size = Some(v.trim().parse::<u32>().map_err(|_| "bad size")?),
            "signed" => signed = v.trim() == "1",
            _ => {}
        }
    }
    let decl = decl.ok_or("field without declaration")?;
    let offset = offset.ok_or("field without offset")?;
    let size = size.ok_or("field without size")?;
    // The name is the last identifier, before any array suffix: `char prev_comm[16]`,
    // `__data_loc char[] name`.
    let base = match decl.rfind(']') {
        Some(close) if decl.ends_with(']') => {
            let open = decl[..close].rfind('[').ok_or("unbalanced [ ] in field")?;
            &decl[..open]
        }
        _ => decl.as_str(),
    };
    let name = base
        .rsplit(|c: char| c.is_whitespace() || c == '*')
        .next()
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .ok_or_else(|| format!("cannot find the field name in `{decl}`"))?
        .to_string();
    Ok(Field {
        decl,
        name,
        offset,
        size,
        signed,
    })
}

/// A mounted tracefs.
#[derive(Clone, Debug)]
pub struct Tracefs {
    root: PathBuf,
}

const DEFAULT_MOUNT: &str = "/sys/kernel/tracing";

impl Tracefs {
    /// Where tracefs is mounted, from `/proc/self/mountinfo` (also under debugfs).
    pub fn find() -> Option<PathBuf> {
        let info = crate::host::read_text_capped(
            Path::new("/proc/self/mountinfo"),
            crate::host::LARGE_FILE,
        )
        .ok()?;
        find_in_mountinfo(&info)
    }

    /// The mounted tracefs, mounting it at /sys/kernel/tracing when absent (said on stderr:
    /// the mount stays after tracekit exits, as it would after `mount -t tracefs`).
    pub fn open() -> Result<Tracefs, TracefsError> {
        // In a container (a Kubernetes DaemonSet, say) the host's tracefs is often mounted
        // elsewhere, e.g. /host/sys/kernel/tracing.
        if let Some(root) = std::env::var_os("TRACEKIT_TRACEFS") {
            let root = PathBuf::from(root);
            if !root.join("events").is_dir() {
                return Err(TracefsError::NotTracefs { path: root });
            }
            return Ok(Tracefs { root });
        }
        if let Some(root) = Self::find() {
            return Ok(Tracefs { root });
        }
        let path = PathBuf::from(DEFAULT_MOUNT);
        mount_tracefs(&path).map_err(|source| {
            if source.raw_os_error() == Some(libc::EPERM) {
                TracefsError::MountPermission { path: path.clone() }
            } else {
                TracefsError::Mount {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "tracekit: tracefs was not mounted; mounted it at {DEFAULT_MOUNT}"
        );
        Ok(Tracefs { root: path })
    }

    pub fn at(root: impl Into<PathBuf>) -> Tracefs {
        Tracefs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn event_dir(&self, category: &str, name: &str) -> PathBuf {
        self.root.join("events").join(category).join(name)
    }

    /// Whether the event exists. An unreadable tracefs is an error (exit 3 naming the missing
    /// capability), not "this kernel lacks the event".
    pub fn has_event(&self, category: &str, name: &str) -> Result<bool, TracefsError> {
        let path = self.event_dir(category, name).join("format");
        match fs::metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {
                Err(TracefsError::Permission { path })
            }
            Err(e) => Err(TracefsError::Io { path, source: e }),
        }
    }

    pub fn format(&self, category: &str, name: &str) -> Result<EventFormat, TracefsError> {
        let path = self.event_dir(category, name).join("format");
        let text = crate::host::read_text_capped(&path, crate::host::SMALL_FILE).map_err(|e| {
            match e.kind() {
                Some(ErrorKind::NotFound) => TracefsError::MissingEvent {
                    category: category.to_string(),
                    name: name.to_string(),
                    path: path.clone(),
                },
                Some(ErrorKind::PermissionDenied) => {
                    TracefsError::Permission { path: path.clone() }
                }
                _ => TracefsError::Io {
                    path: path.clone(),
                    source: std::io::Error::other(e.to_string()),
                },
            }
        })?;
        parse_format(&text, &path.to_string_lossy())
    }
}

/// The tracefs mount point in mountinfo `info`, else `tracing/` under the last debugfs mount
/// that has events (parsed and unescaped by [`crate::host::mountinfo`]).
fn find_in_mountinfo(info: &str) -> Option<PathBuf> {
    let mut debugfs = None;
    for m in crate::host::mountinfo::parse(info) {
        match m.fs_type.as_str() {
            "tracefs" => return Some(m.mount_point),
            "debugfs" => {
                let p = m.mount_point.join("tracing");
                if p.join("events").exists() {
                    debugfs = Some(p);
                }
            }
            _ => {}
        }
    }
    debugfs
}

fn mount_tracefs(path: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    let target = CString::new(path.as_os_str().as_encoded_bytes())?;
    let fstype = CString::new("tracefs")?;
    let source = CString::new("nodev")?;
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call; no
    // mount data is passed.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn parses_sched_switch_x86_64() {
        let f = parse_format(&fixture("sched_switch.x86_64"), "sched/sched_switch/format").unwrap();
        assert_eq!(f.event, "sched:sched_switch");
        assert_eq!(f.id, 372);
        let prev = f.field("prev_comm").unwrap();
        assert_eq!((prev.offset, prev.size), (8, 16));
        assert_eq!(f.field("prev_pid").unwrap().offset, 24);
        assert!(f.field("prev_pid").unwrap().signed);
        assert_eq!(f.offset_of("prev_state", &[8]).unwrap(), 32);
        assert_eq!(f.offset_of("next_pid", &[4]).unwrap(), 56);
        assert!(matches!(
            f.offset_of("next_pid", &[8]),
            Err(TracefsError::FieldSize { size: 4, .. })
        ));
    }

    #[test]
    fn parses_32_bit_syscall_layout() {
        // i386: every syscall argument slot is 4 bytes, `ret` too.
        let f = parse_format(
            &fixture("sys_enter_fsync.i386"),
            "/t/events/syscalls/sys_enter_fsync/format",
        )
        .unwrap();
        assert_eq!(f.event, "syscalls:sys_enter_fsync");
        assert_eq!(f.offset_of("__syscall_nr", &[4]).unwrap(), 8);
        let fd = f.field("fd").unwrap();
        assert_eq!((fd.offset, fd.size), (12, 4));
    }

    #[test]
    fn missing_field_is_named() {
        let f = parse_format(&fixture("kfree_skb.no_reason"), "skb/kfree_skb/format").unwrap();
        let e = f.field("reason").unwrap_err();
        assert_eq!(
            e.to_string(),
            "event skb:kfree_skb has no field `reason` on this kernel"
        );
        assert!(f.symbols("reason").is_empty());
    }

    #[test]
    fn symbolic_names_from_print_fmt() {
        let f = parse_format(
            &fixture("mm_compaction_end"),
            "compaction/mm_compaction_end/format",
        )
        .unwrap();
        let s = f.symbols("status");
        assert_eq!(s.first(), Some(&(1, "skipped".to_string())));
        assert!(s.contains(&(8, "success".to_string())));
        assert_eq!(s.len(), 9);
        let k = parse_format(&fixture("kfree_skb.x86_64"), "skb/kfree_skb/format").unwrap();
        assert!(k.symbols("reason").contains(&(3, "NO_SOCKET".to_string())));
    }

    #[test]
    fn rejects_malformed_files() {
        assert!(matches!(
            parse_format("name: x\nID: 1\n", "x"),
            Err(TracefsError::Parse { .. })
        ));
        assert!(matches!(
            parse_format("name: x\nID: one\n", "x"),
            Err(TracefsError::Parse { line: 2, .. })
        ));
        assert!(matches!(
            parse_format(
                "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:zz;\tsize:4;\n",
                "x"
            ),
            Err(TracefsError::Parse { line: 4, .. })
        ));
        assert!(parse_format("", "x").is_err());
    }

    #[test]
    fn field_names_from_odd_declarations() {
        let f = parse_field_line("field:__data_loc char[] name;\toffset:8;\tsize:4;\tsigned:0;")
            .unwrap();
        assert_eq!(f.name, "name");
        let f =
            parse_field_line("field:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;").unwrap();
        assert_eq!(f.name, "skbaddr");
        let f = parse_field_line("field:void *location;\toffset:16;\tsize:8;\tsigned:0;").unwrap();
        assert_eq!(f.name, "location");
    }

    #[test]
    fn finds_tracefs_in_mountinfo() {
        let info = "22 1 0:21 / /sys rw - sysfs sysfs rw\n40 22 0:12 / /sys/kernel/trac\\040ing rw - tracefs nodev rw\n";
        assert_eq!(
            find_in_mountinfo(info),
            Some(PathBuf::from("/sys/kernel/trac ing"))
        );
        assert_eq!(
            find_in_mountinfo("22 1 0:21 / /sys rw - sysfs sysfs rw\n"),
            None
        );
    }

    /// Mutation fuzzing from the seed corpus (the fixture files): every truncation, and byte
    /// flips at pseudo-random places, must parse or fail with an error, never panic.
    #[test]
    fn corpus_mutations_never_panic() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats");
        let mut seeds = 0;
        for entry in fs::read_dir(&dir).unwrap() {
            let bytes = fs::read(entry.unwrap().path()).unwrap();
            seeds += 1;
            for cut in (0..bytes.len()).step_by(3) {
                let _ = parse_format(&String::from_utf8_lossy(&bytes[..cut]), "corpus");
            }
            let mut x: u64 = 0x9e3779b97f4a7c15;
            for _ in 0..2000 {
                let mut m = bytes.clone();
                for _ in 0..4 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let at = (x as usize) % m.len();
                    const ALPHABET: &[u8] = b":;\t\n[]0-9a_ {}\",(";
                    m[at] = ALPHABET[(x >> 32) as usize % ALPHABET.len()];
                }
                let parsed = parse_format(&String::from_utf8_lossy(&m), "corpus");
                if let Ok(f) = parsed {
                    let _ = f.symbols("status");
                    let _ = f.symbols("reason");
                }
            }
        }
        assert!(seeds >= 6, "seed corpus missing");
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(s in ".{0,400}") {
            let _ = parse_format(&s, "fuzz");
        }

        #[test]
        fn parser_never_panics_on_field_like_lines(s in "(field:[a-z _\\[\\]0-9*]{0,20};\toffset:[0-9a-z]{0,3};\tsize:[0-9]{0,2};\tsigned:[01];\n){0,5}") {
            let _ = parse_format(&format!("name: x\nID: 1\nformat:\n{s}print fmt: \"\"\n"), "fuzz");
        }
    }
}
