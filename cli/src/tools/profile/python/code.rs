//! CPython code objects read from another process: the qualified name, file and line of a frame.
//!
//! The kernel only records a frame's code object address and its raw instruction; names and
//! line tables are too large and too variable for BPF, so they are read here, once per code
//! object, from the process while it runs. All of it is untrusted: the process may be hostile,
//! or dying and reusing the memory, so lengths are capped before anything is allocated, strings
//! are checked against their own type bits and terminator, and the table walks are bounded by the
//! table (a garbage table yields a wrong line, never a panic or a hang).
//!
//! Line tables follow CPython's own readers: 3.10's PEP 626 pairs (`Objects/lnotab_notes.txt`,
//! `PyLineTable_NextAddressRange`), and from 3.11 the location table (`Objects/locations.md`,
//! `_PyLineTable_NextAddressRange`, `get_line_delta`). The tests compare both against
//! `co_lines()` of the real interpreters (`fixtures/linetable-3.1X.txt`).

use std::{collections::HashMap, rc::Rc};

/// Reads another process's memory (implemented elsewhere with /proc/<pid>/mem; tests implement
/// it on a byte buffer).
pub trait Mem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// The code-object and string layout of one CPython minor version (x86_64, release builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub minor: u8,
    pub co_filename: u64,
    pub co_name: u64,
    pub co_qualname: Option<u64>,
    pub co_firstlineno: u64,
    pub co_linetable: u64,
    pub co_code_adaptive: Option<u64>,
    pub co_firsttraceable: Option<u64>,
    pub ascii_size: u64,
    pub compact_size: u64,
    pub unicode_length: u64,
    pub unicode_state: u64,
}

/// The layouts of 3.10–3.13, by minor version. Measured with `offsetof()` against each version's
/// headers (pyenv builds); CPython keeps them within a minor version.
pub fn layout(minor: u8) -> Option<CodeLayout> {
    let l312 = CodeLayout {
        minor,
        co_filename: 112,
        co_name: 120,
        co_qualname: Some(128),
        co_firstlineno: 68,
        co_linetable: 136,
        co_code_adaptive: Some(192),
        co_firsttraceable: Some(176),
        ascii_size: 40,
        compact_size: 56,
        unicode_length: 16,
        unicode_state: 32,
    };
    // 3.10 and 3.11 still have `wstr` in `PyASCIIObject` and `wstr_length` in the compact one.
    match minor {
        10 => Some(CodeLayout {
            co_filename: 104,
            co_name: 112,
            co_qualname: None,
            co_firstlineno: 40,
            co_linetable: 120,
            co_code_adaptive: None,
            co_firsttraceable: None,
            ascii_size: 48,
            compact_size: 72,
            ..l312
        }),
        11 => Some(CodeLayout {
            co_firstlineno: 72,
            co_code_adaptive: Some(184),
            co_firsttraceable: Some(168),
            ascii_size: 48,
            compact_size: 72,
            ..l312
        }),
        12 => Some(l312),
        13 => Some(CodeLayout {
            co_code_adaptive: Some(200),
            co_firsttraceable: Some(184),
            ..l312
        }),
        _ => None,
    }
}

/// What a frame resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrameInfo {
    /// `co_qualname` on 3.11+, `co_name` on 3.10.
    pub function: Rc<str>,
    /// `co_filename` as stored.
    pub file: Rc<str>,
    /// 0 when the table has no line for that instruction.
    pub line: u32,
    /// 3.11+: the frame has not started its first traceable instruction yet (instruction
    /// offset < _co_firsttraceable * 2): callers skip such frames.
    pub incomplete: bool,
}

/// Names and paths longer than this are taken for garbage rather than copied.
const MAX_STR_BYTES: i64 = 4096;
/// The largest line table read; real ones are a few bytes per line of source.
const MAX_TABLE_BYTES: i64 = 1 << 20;
/// Code objects cached before the cache starts over.
const MAX_CODES: usize = 50_000;
/// Line table bytes cached before the cache starts over (50 000 tables of the maximum size
/// would not fit in memory).
const MAX_TABLE_TOTAL: usize = 64 << 20;
/// `PyBytesObject`: `ob_size` and `ob_sval`, the same in every version.
const BYTES_SIZE: u64 = 16;
const BYTES_DATA: u64 = 32;

/// Why a code object could not be decoded: it names the object and address, since the usual
/// cause is a process that freed or overwrote it between the sample and the read.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("reading the {what} at {addr:#x}: {source}")]
    Read {
        what: &'static str,
        addr: u64,
        source: std::io::Error,
    },
    #[error("the {what} at {addr:#x} is not a str: {why}")]
    NotStr {
        what: &'static str,
        addr: u64,
        why: &'static str,
    },
    #[error("the {what} at {addr:#x} is not a compact str")]
    NotCompact { what: &'static str, addr: u64 },
    #[error(
        "the {what} at {addr:#x} is {len} characters long, over the cap of {MAX_STR_BYTES} bytes"
    )]
    StrTooLong {
        what: &'static str,
        addr: u64,
        len: i64,
    },
    #[error("line table of {len} bytes over the cap of {MAX_TABLE_BYTES} (at {addr:#x})")]
    TableTooLong { addr: u64, len: i64 },
    #[error("the line table at {addr:#x} is not a bytes object: no NUL terminator")]
    NotBytes { addr: u64 },
}

/// One code object as read: enough to resolve any instruction in it.
struct Code {
    function: Rc<str>,
    file: Rc<str>,
    firstlineno: i32,
    firsttraceable: i32,
    table: Box<[u8]>,
}

/// Code objects by address. Code objects live as long as their functions, so one read serves
/// every later sample; a freed address reused for another code object is the caller's to
/// notice (see [`CodeCache::clear`]).
pub struct CodeCache {
    layout: CodeLayout,
    codes: HashMap<u64, Code>,
    table_bytes: usize,
    max_codes: usize,
}

impl CodeCache {
    pub fn new(layout: CodeLayout) -> Self {
        CodeCache {
            layout,
            codes: HashMap::new(),
            table_bytes: 0,
            max_codes: MAX_CODES,
        }
    }

    /// `instr` is the raw value the kernel read from the frame:
    /// - 3.10: `PyFrameObject.f_lasti` (an int, index in 2-byte code units of the last
    ///   instruction; -1 before the first: line co_firstlineno). Only its low 32 bits count, so
    ///   it may come zero- or sign-extended.
    /// - 3.11 and 3.12: `_PyInterpreterFrame.prev_instr`, a pointer to the last instruction
    ///   executed (byte offset = instr - (code + co_code_adaptive));
    /// - 3.13: `_PyInterpreterFrame.instr_ptr`, a pointer to the instruction being executed
    ///   (byte offset = instr - (code + co_code_adaptive)).
    pub fn frame(
        &mut self,
        mem: &dyn Mem,
        code: u64,
        instr: u64,
    ) -> Result<PyFrameInfo, CodeError> {
        let c = match self.codes.get(&code) {
            Some(c) => c,
            None => {
                let c = read_code(&self.layout, mem, code)?;
                if self.codes.len() >= self.max_codes
                    || self.table_bytes + c.table.len() > MAX_TABLE_TOTAL
                {
                    self.clear();
                }
                self.table_bytes += c.table.len();
                self.codes.entry(code).or_insert(c)
            }
        };
        let first = i64::from(c.firstlineno);
        let (line, incomplete) = if self.layout.minor <= 10 {
            let lasti = i64::from(instr as u32 as i32);
            let line = if lasti < 0 {
                first
            } else {
                pep626_line(&c.table, first, lasti as u64 * 2)
            };
            (line, false)
        } else {
            let start = code.wrapping_add(self.layout.co_code_adaptive.unwrap_or(0));
            let off = instr.wrapping_sub(start) as i64;
            // CPython's own `PyCode_Addr2Line` answers co_firstlineno before the first unit.
            let line = if off < 0 {
                first
            } else {
                location_line(&c.table, first, off as u64 / 2)
            };
            (line, off < i64::from(c.firsttraceable) * 2)
        };
        Ok(PyFrameInfo {
            function: c.function.clone(),
            file: c.file.clone(),
            line: u32::try_from(line).unwrap_or(0),
            incomplete,
        })
    }

    pub fn clear(&mut self) {
        self.codes.clear();
        self.table_bytes = 0;
    }
}

/// An object in the process; errors name it by its own address rather than the field's.
#[derive(Clone, Copy)]
struct Obj<'a> {
    mem: &'a dyn Mem,
    addr: u64,
    what: &'static str,
}

impl Obj<'_> {
    fn read(self, off: u64, buf: &mut [u8]) -> Result<(), CodeError> {
        let (what, addr) = (self.what, self.addr);
        let r = self.mem.read(addr.wrapping_add(off), buf);
        r.map_err(|source| CodeError::Read { what, addr, source })
    }

    fn u64(self, off: u64) -> Result<u64, CodeError> {
        let mut b = [0; 8];
        self.read(off, &mut b).map(|()| u64::from_le_bytes(b))
    }

    fn i32(self, off: u64) -> Result<i32, CodeError> {
        let mut b = [0; 4];
        self.read(off, &mut b).map(|()| i32::from_le_bytes(b))
    }

    /// The object a pointer field points to.
    fn deref(self, off: u64, what: &'static str) -> Result<Self, CodeError> {
        let addr = self.u64(off)?;
        Ok(Obj { addr, what, ..self })
    }
}

fn read_code(l: &CodeLayout, mem: &dyn Mem, addr: u64) -> Result<Code, CodeError> {
    let what = "code object";
    let code = Obj { mem, addr, what };
    let name = l.co_qualname.unwrap_or(l.co_name);
    Ok(Code {
        function: read_str(l, code.deref(name, "name")?)?,
        file: read_str(l, code.deref(l.co_filename, "file name")?)?,
        firstlineno: code.i32(l.co_firstlineno)?,
        firsttraceable: l.co_firsttraceable.map_or(Ok(0), |off| code.i32(off))?,
        table: read_bytes(code.deref(l.co_linetable, "line table")?)?,
    })
}

/// A compact `str` (code names and file names always are), decoded to UTF-8.
fn read_str(l: &CodeLayout, s: Obj) -> Result<Rc<str>, CodeError> {
    let (what, addr) = (s.what, s.addr);
    let state = s.i32(l.unicode_state)? as u32;
    // interned:2, kind:3, compact:1, ascii:1, then ready (3.10, 3.11) or statically_allocated.
    let kind = (state >> 2) & 7;
    let [compact, ascii, ready] = [5, 6, 7].map(|bit| state & 1 << bit != 0);
    let not_str = |why| Err(CodeError::NotStr { what, addr, why });
    if !matches!(kind, 1 | 2 | 4) {
        return not_str("its kind is not 1, 2 or 4 bytes");
    }
    if ascii && kind != 1 {
        return not_str("ASCII with more than a byte per character");
    }
    if l.minor <= 11 && !ready {
        return not_str("not ready");
    }
    if !compact {
        return Err(CodeError::NotCompact { what, addr });
    }
    let len = s.u64(l.unicode_length)? as i64;
    let kind = kind as usize;
    if !(0..=MAX_STR_BYTES / kind as i64).contains(&len) {
        return Err(CodeError::StrTooLong { what, addr, len });
    }
    let len = len as usize;
    // The characters and CPython's NUL terminator after them.
    let mut data = vec![0; (len + 1) * kind];
    s.read(if ascii { l.ascii_size } else { l.compact_size }, &mut data)?;
    let (chars, nul) = data.split_at(len * kind);
    if nul.iter().any(|&b| b != 0) {
        return not_str("no NUL terminator after its characters");
    }
    if ascii && !chars.is_ascii() {
        return not_str("ASCII with a byte over 0x7f");
    }
    let s: String = chars
        .chunks_exact(kind)
        .map(|c| {
            let cp = match *c {
                [b] => u32::from(b),
                [a, b] => u32::from(u16::from_le_bytes([a, b])),
                [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
                _ => u32::MAX,
            };
            char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER)
        })
        .collect();
    Ok(s.into())
}

/// A `bytes` object's contents (`co_linetable`).
fn read_bytes(b: Obj) -> Result<Box<[u8]>, CodeError> {
    let (addr, len) = (b.addr, b.u64(BYTES_SIZE)? as i64);
    if !(0..=MAX_TABLE_BYTES).contains(&len) {
        return Err(CodeError::TableTooLong { addr, len });
    }
    let len = len as usize;
    let mut data = vec![0; len + 1];
    b.read(BYTES_DATA, &mut data)?;
    if data.pop() != Some(0) {
        return Err(CodeError::NotBytes { addr });
    }
    Ok(data.into_boxed_slice())
}

/// 3.10's PEP 626 table: (byte delta, signed line delta) pairs from co_firstlineno, -128 for
/// "no line". A zero-length pair only moves the line: that is how deltas beyond ±127 are spelt.
fn pep626_line(table: &[u8], firstlineno: i64, offset: u64) -> i64 {
    let (mut line, mut start) = (firstlineno, 0u64);
    for pair in table.chunks_exact(2) {
        let end = start + u64::from(pair[0]);
        let here = match pair[1] as i8 {
            -128 => 0,
            d => {
                line += i64::from(d);
                line
            }
        };
        if offset < end {
            return here;
        }
        start = end;
    }
    0
}

/// 3.11+'s location table: entries of a header byte (top bit set, code, length - 1 in code
/// units) and the bytes after it up to the next header. Only the start line matters here.
fn location_line(table: &[u8], firstlineno: i64, unit: u64) -> i64 {
    let (mut line, mut start, mut i) = (firstlineno, 0u64, 0usize);
    while let Some(&head) = table.get(i) {
        let rest = table.get(i + 1..).unwrap_or_default();
        let body = &rest[..rest.iter().take_while(|&&b| b & 0x80 == 0).count()];
        let code = (head >> 3) & 15;
        line += match code {
            13 | 14 => signed_varint(body),
            10..=12 => i64::from(code - 10),
            _ => 0,
        };
        let end = start + u64::from(head & 7) + 1;
        if unit < end {
            return if code == 15 { 0 } else { line };
        }
        start = end;
        i += 1 + body.len();
    }
    0
}

/// `scan_signed_varint`: 6-bit chunks, least significant first, bit 6 = more; the low bit of
/// the result is the sign. Bits past 32 are dropped as CPython's `unsigned int` drops them.
fn signed_varint(bytes: &[u8]) -> i64 {
    let (mut val, mut shift) = (0u32, 0u32);
    for &b in bytes {
        val |= u32::from(b & 63).checked_shl(shift).unwrap_or(0);
        if b & 64 == 0 {
            break;
        }
        shift = shift.saturating_add(6);
    }
    let mag = i64::from(val >> 1);
    if val & 1 != 0 {
        -mag
    } else {
        mag
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Per code object: first line, table and `co_lines()` ranges, from one source compiled by
    /// each interpreter (3.11+ also without columns): long bodies, loops, try, comprehensions,
    /// gaps of 200 and 5000 lines, a call charged 150 lines back, a 254-byte split, line 5815.
    fn check_fixture(minor: u8, text: &str) {
        let (mut lines, mut codes) = (text.lines().filter(|l| !l.starts_with('#')), 0);
        while let (Some(head), Some(ranges)) = (lines.next(), lines.next()) {
            let f: Vec<&str> = head.split(' ').collect();
            assert_eq!((f.len(), f[0]), (4, "code"), "{head}");
            let first: i64 = f[2].parse().unwrap();
            let hex = f[3].trim_matches('-');
            let table: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let r: Vec<u64> = ranges
                .split(' ')
                .skip(1)
                .map(|n| n.parse().unwrap())
                .collect();
            assert!(!r.is_empty() && r.len().is_multiple_of(3), "{head}");
            for t in r.chunks(3) {
                for byte in (t[0]..t[1]).step_by(2) {
                    let got = match minor {
                        10 => pep626_line(&table, first, byte),
                        _ => location_line(&table, first, byte / 2),
                    };
                    assert_eq!(got, t[2] as i64, "3.{minor} {} at byte {byte}", f[1]);
                }
            }
            codes += 1;
        }
        assert!(codes >= 15, "3.{minor}: {codes} code objects");
    }

    #[test]
    fn line_tables_match_co_lines() {
        check_fixture(10, include_str!("fixtures/linetable-3.10.txt"));
        check_fixture(11, include_str!("fixtures/linetable-3.11.txt"));
        check_fixture(12, include_str!("fixtures/linetable-3.12.txt"));
        check_fixture(13, include_str!("fixtures/linetable-3.13.txt"));
    }

    /// Process memory as regions by base address, counting reads.
    #[derive(Default)]
    struct Fake {
        regions: HashMap<u64, Vec<u8>>,
        reads: Cell<usize>,
    }

    impl Mem for Fake {
        fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.reads.set(self.reads.get() + 1);
            let found = self.regions.iter().find_map(|(&base, data)| {
                let off = usize::try_from(addr.checked_sub(base)?).ok()?;
                data.get(off..off.checked_add(buf.len())?)
            });
            buf.copy_from_slice(found.ok_or(std::io::Error::from_raw_os_error(5))?);
            Ok(())
        }
    }

    fn put(buf: &mut Vec<u8>, off: u64, bytes: &[u8]) {
        let off = off as usize;
        buf.resize(buf.len().max(off + bytes.len()), 0);
        buf[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// A compact str of `kind` bytes per character, ASCII when `kind` is 0.
    fn str_obj(l: &CodeLayout, s: &str, kind: u32) -> Vec<u8> {
        let (ascii, k) = (kind == 0, kind.max(1));
        let mut o = vec![];
        let n = s.chars().count() as u64;
        put(&mut o, l.unicode_length, &n.to_le_bytes());
        let state = k << 2 | 1 << 5 | u32::from(ascii) << 6 | 1 << 7;
        put(&mut o, l.unicode_state, &state.to_le_bytes());
        let data = if ascii { l.ascii_size } else { l.compact_size };
        for (i, c) in s.chars().chain(['\0']).enumerate() {
            let at = data + i as u64 * u64::from(k);
            put(&mut o, at, &(c as u32).to_le_bytes()[..k as usize]);
        }
        o
    }

    const CODE: u64 = 0x10_0000;
    const NAME: u64 = 0x20_0000;
    const FILE: u64 = 0x30_0000;
    const TABLE: u64 = 0x40_0000;

    /// A process with one code object named `name` in "/app/größe.py", first line 100.
    fn process(l: &CodeLayout, name: &str, name_kind: u32, table: &[u8], traceable: i32) -> Fake {
        let mut code = vec![0; 256];
        let qualname = l.co_qualname.unwrap_or(l.co_name);
        for (off, ptr) in [(l.co_name, NAME), (qualname, NAME), (l.co_filename, FILE)] {
            put(&mut code, off, &ptr.to_le_bytes());
        }
        put(&mut code, l.co_linetable, &TABLE.to_le_bytes());
        put(&mut code, l.co_firstlineno, &100i32.to_le_bytes());
        let traceable_at = l.co_firsttraceable.unwrap_or(250);
        put(&mut code, traceable_at, &traceable.to_le_bytes());
        let mut bytes = vec![];
        put(&mut bytes, BYTES_SIZE, &(table.len() as u64).to_le_bytes());
        put(&mut bytes, BYTES_DATA, &[table, &[0]].concat());
        let mut f = Fake::default();
        f.regions.insert(CODE, code);
        f.regions.insert(NAME, str_obj(l, name, name_kind));
        f.regions.insert(FILE, str_obj(l, "/app/größe.py", 1));
        f.regions.insert(TABLE, bytes);
        f
    }

    #[test]
    fn frames_of_3_10() {
        let l = layout(10).unwrap();
        // Bytes 0-1: line 100; 2-7: 101; 8-11: none; 12-15: 101 + 254; 16-17: 355 - 200.
        let table = [2, 0, 6, 1, 4, 0x80, 0, 127, 0, 127, 4, 0, 0, 0x81, 2, 0xb7];
        let mem = process(&l, "größe", 1, &table, 0);
        let mut cache = CodeCache::new(l);
        let f = cache.frame(&mem, CODE, u64::from(u32::MAX)).unwrap();
        let want = ("größe", "/app/größe.py", 100, false);
        assert_eq!((&*f.function, &*f.file, f.line, f.incomplete), want);
        let lines = [0, 1, 3, 4, 5, 6, 7, 8, 9, u64::MAX].map(|i| cache.frame(&mem, CODE, i));
        let lines = lines.map(|f| f.unwrap().line);
        assert_eq!(lines, [100, 101, 101, 0, 0, 355, 355, 155, 0, 100]);
    }

    #[test]
    fn frames_of_3_11_and_later() {
        let table = [
            &[0x80 | 13 << 3, 0x00][..],             // unit 0: no columns, 100
            &[0x80 | 11 << 3 | 2, 4, 8],             // units 1-3: one line form, 101
            &[0x80 | 15 << 3 | 1],                   // units 4-5: no location
            &[0x80 | 14 << 3, 0x43, 0x03, 0, 1, 2],  // unit 6: long form, -(0xc3 >> 1): 4
            &[0x80 | 3 << 3, 0x12],                  // unit 7: short form, 4
            &[0x80 | 13 << 3 | 7, 0x50, 0x5c, 0x02], // units 8-15: + 5000 (3-byte varint)
        ]
        .concat();
        let units = [-1, 1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 1 << 40];
        let lines = [100, 101, 101, 101, 0, 0, 4, 4, 5004, 5004, 0, 0];
        for minor in 11..=13 {
            let l = layout(minor).unwrap();
            let mem = process(&l, "名前.Δ", 2, &table, 2);
            let mut cache = CodeCache::new(l);
            let at = |u: i64| (CODE + l.co_code_adaptive.unwrap()).wrapping_add_signed(u * 2);
            let f = cache.frame(&mem, CODE, at(0)).unwrap();
            let want = ("名前.Δ", "/app/größe.py", 100, true);
            assert_eq!((&*f.function, &*f.file, f.line, f.incomplete), want);
            let got = units.map(|u| cache.frame(&mem, CODE, at(u)).unwrap());
            let got = got.map(|f| (f.line, f.incomplete));
            let want: Vec<_> = lines.iter().zip(units).map(|(&l, u)| (l, u < 2)).collect();
            assert_eq!(got.to_vec(), want, "3.{minor}");
            assert!(cache.frame(&mem, CODE, 0).unwrap().incomplete);
        }
    }

    #[test]
    fn non_bmp_names_and_the_cache() {
        let l = layout(12).unwrap();
        let mut mem = process(&l, "𝔣𝔲𝔫𝔠", 4, &[0x80 | 13 << 3 | 7, 2], 0);
        let mut cache = CodeCache::new(l);
        let base = CODE + 192;
        assert_eq!(&*cache.frame(&mem, CODE, base).unwrap().function, "𝔣𝔲𝔫𝔠");
        let reads = mem.reads.get();
        assert_eq!(cache.frame(&mem, CODE, base + 4).unwrap().line, 101);
        assert_eq!(mem.reads.get(), reads, "read again");
        cache.clear();
        cache.frame(&mem, CODE, base).unwrap();
        assert!(mem.reads.get() > reads);
        // Full: the cache starts over rather than growing.
        cache.max_codes = 1;
        mem.regions.insert(0x50_0000, mem.regions[&CODE].clone());
        cache.frame(&mem, 0x50_0000, 0).unwrap();
        assert_eq!(cache.codes.keys().collect::<Vec<_>>(), [&0x50_0000]);
    }

    #[test]
    fn hostile_memory_is_an_error() {
        let error = |l: CodeLayout, region: u64, off: u64, bytes: &[u8]| {
            let mut m = process(&l, "f", 0, &[1, 2], 0);
            match region {
                0 => drop(m.regions.remove(&CODE)),
                _ => put(m.regions.get_mut(&region).unwrap(), off, bytes),
            }
            let e = CodeCache::new(l).frame(&m, CODE, 0);
            e.unwrap_err().to_string()
        };
        let l = layout(13).unwrap();
        let e = |region, off, bytes: &[u8]| error(l, region, off, bytes);
        let (huge, minus3) = (&(1u64 << 62).to_le_bytes(), &(-3i64).to_le_bytes());
        #[rustfmt::skip]
        let cases: [(u64, u64, &[u8], &str); 14] = [
            (0, 0, &[], "reading the code object at 0x100000: "),
            (NAME, 16, huge, "the name at 0x200000 is 4611686018427387904 characters long, "),
            (NAME, 16, minus3, "the name at 0x200000 is -3 characters"),
            (NAME, 16, &[0, 16], "reading the name at 0x200000: Input/output error"),
            (TABLE, 16, huge, "line table of 4611686018427387904 bytes over the cap of 1048576"),
            (TABLE, 16, &[1], "the line table at 0x400000 is not a bytes object: no NUL"),
            (TABLE, 16, &[0, 0, 16], "reading the line table at 0x400000: "),
            (NAME, 32, &[0x0c], "the name at 0x200000 is not a str: its kind is not 1, 2 or 4"),
            (NAME, 32, &[0x68], "the name at 0x200000 is not a str: ASCII with more than a"),
            (FILE, 32, &[0x84], "the file name at 0x300000 is not a compact str"),
            (NAME, 40, &[0xff], "the name at 0x200000 is not a str: ASCII with a byte over"),
            (NAME, 41, b"x", "the name at 0x200000 is not a str: no NUL terminator"),
            (CODE, 128, &[0; 8], "reading the name at 0x0: "),
            (CODE, 112, &[0xff; 8], "reading the file name at 0xffffffffffffffff: "),
        ];
        for (region, off, bytes, want) in cases {
            let got = e(region, off, bytes);
            assert!(got.starts_with(want), "{got}");
        }
        let not_ready = error(layout(11).unwrap(), NAME, 32, &[0x64]);
        assert!(not_ready.ends_with("not a str: not ready"), "{not_ready}");
    }

    /// Random tables and offsets, and varints of any length: an answer, never a panic or a hang.
    #[test]
    fn garbage_tables_do_not_panic() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..3000 {
            let table: Vec<u8> = (0..next() % 64).map(|_| next() as u8).collect();
            let first = [0, i32::MAX.into(), i32::MIN.into()][round % 3];
            for off in [0, 1, 7, 63, 255, next() % 300, u64::MAX] {
                pep626_line(&table, first, off);
                location_line(&table, first, off);
            }
        }
        let long_varint = [&[0x80 | 14 << 3][..], &[0x7f; 100]].concat();
        assert_eq!(location_line(&long_varint, 0, 0), -i64::from(u32::MAX >> 1));
        let l = layout(10).unwrap();
        let mem = process(&l, "f", 0, &[0xff, 0x7f].repeat(1000), 0);
        let mut cache = CodeCache::new(l);
        let lines = [0, 1 << 31, u64::MAX, 0x7fff_ffff].map(|i| cache.frame(&mem, CODE, i));
        assert_eq!(lines.map(|f| f.unwrap().line), [227, 100, 100, 0]);
    }
}
