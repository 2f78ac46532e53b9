//! Process names and paths are attacker-controlled (`prctl(PR_SET_NAME)`, file names): they are
//! escaped before they reach a terminal, and kept faithful in JSON.

use std::fmt::Write as _;

/// Terminal-safe text: printable characters as they are; backslash, control characters
/// (escape sequences, newlines) and bytes that are not UTF-8 as `\\`, `\xNN`, `\u{NNNN}`.
/// The mapping is reversible, so two different names never print the same.
pub fn text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                // C1 controls and bidi overrides can also rewrite what a terminal shows.
                c if ('\u{80}'..='\u{9f}').contains(&c)
                    || ('\u{202a}'..='\u{202e}').contains(&c)
                    || ('\u{2066}'..='\u{2069}').contains(&c) =>
                {
                    let _ = write!(out, "\\u{{{:04x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A JSON string value for raw bytes: valid UTF-8 is kept as is (serde_json escapes control
/// characters itself, so the value stays valid and exact); bytes that are not UTF-8 become
/// `\xNN`, with a literal backslash written `\\`, so the original bytes can be recovered.
pub fn json(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.contains('\\') => s.to_string(),
        _ => {
            let mut out = String::with_capacity(bytes.len());
            for chunk in bytes.utf8_chunks() {
                for c in chunk.valid().chars() {
                    if c == '\\' {
                        out.push_str("\\\\");
                    } else {
                        out.push(c);
                    }
                }
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out
        }
    }
}

/// A kernel `comm` buffer up to its first NUL.
pub fn comm_bytes(comm: &[u8]) -> &[u8] {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    &comm[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_controls() {
        assert_eq!(text(b"\x1b[2Jevil\n"), "\\x1b[2Jevil\\x0a");
        assert_eq!(text(b"a\\b"), "a\\\\b");
        assert_eq!(text(b"ok-name_1"), "ok-name_1");
        assert_eq!(text("\u{202e}abc".as_bytes()), "\\u{202e}abc");
    }

    #[test]
    fn escapes_invalid_utf8() {
        assert_eq!(text(b"x\xff\xfey"), "x\\xff\\xfey");
        assert_eq!(json(b"x\xffy"), "x\\xffy");
    }

    #[test]
    fn json_keeps_valid_utf8_exact() {
        let s = json(b"\x1b[31mred");
        assert_eq!(s, "\x1b[31mred");
        let v = serde_json::to_string(&s).unwrap();
        assert_eq!(v, "\"\\u001b[31mred\"");
        // A literal backslash is doubled only when escaping is in force.
        assert_eq!(json(b"a\\b"), "a\\\\b");
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_bytes(b"bash\0\0\0junk"), b"bash");
        assert_eq!(comm_bytes(b"0123456789abcdef"), b"0123456789abcdef");
    }
}
