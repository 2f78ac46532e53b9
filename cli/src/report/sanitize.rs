//! Process names, paths and cgroup names are attacker-controlled (`prctl(PR_SET_NAME)`, file
//! names): they are escaped before they reach a terminal, and kept faithful in JSON.
//!
//! JSON, for every field that comes from outside tracekit (comm, file paths, cgroup names): when
//! the bytes are valid UTF-8 the field is that string, exact (serde_json escapes control
//! characters as `\u00XX`, so ESC and newline survive); when they are not, the field is the
//! string with each invalid sequence replaced by U+FFFD, and a sibling field `<name>_bytes`
//! holds the exact bytes as an array of numbers. So `"comm":"a\u001bb"` is exactly those bytes,
//! and `"comm":"x<U+FFFD>","comm_bytes":[120,255]` is `x` followed by the byte 0xff, which no
//! real backslash can be confused with.

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

/// Markdown-safe inline text (a report written as `--output x.md`), from text already escaped
/// for the terminal ([`text`]): every character that could open markup in a paragraph, a list
/// item or a table cell is made literal, so a process title `<img src=x onerror=…>` or a comm
/// with backticks and `|` shows as written and cannot inject HTML, links, code or table cells.
/// `<`, `>`, `&` become entities (renderers that pass HTML through still show them as text);
/// `\`, `` ` ``, `*`, `_`, `[`, `]`, `|`, `~` get a backslash; line breaks become spaces.
pub fn markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `s` as a Markdown code span (a command to copy): fenced by one more backtick than its
/// longest run of backticks, so no content closes it early; inside a code span nothing else is
/// markup (HTML included). Line breaks become spaces.
pub fn markdown_code(s: &str) -> String {
    let s = s.replace(['\n', '\r'], " ");
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    // A space pads content that starts or ends with a backtick (CommonMark strips one).
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// Sets `obj[key]` to `bytes` in tracekit's JSON representation (see the module docs): the
/// string, plus `obj["<key>_bytes"]` when the bytes are not valid UTF-8.
pub fn put_json(obj: &mut serde_json::Value, key: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => obj[key] = s.into(),
        Err(_) => {
            obj[key] = String::from_utf8_lossy(bytes).into_owned().into();
            obj[format!("{key}_bytes")] = bytes.to_vec().into();
        }
    }
}

/// The two fields of a name in a typed row: the string (lossy where the bytes are not UTF-8)
/// and, only then, the exact bytes (serialise the second with
/// `#[serde(skip_serializing_if = "Option::is_none")]` as `<name>_bytes`).
pub fn name_fields(bytes: &[u8]) -> (String, Option<Vec<u8>>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_string(), None),
        Err(_) => (
            String::from_utf8_lossy(bytes).into_owned(),
            Some(bytes.to_vec()),
        ),
    }
}

/// The object `rest` with `key` set to `bytes` by [`put_json`].
pub fn json_with(key: &str, bytes: &[u8], rest: serde_json::Value) -> serde_json::Value {
    let mut v = match rest {
        serde_json::Value::Object(m) => serde_json::Value::Object(m),
        _ => serde_json::json!({}),
    };
    put_json(&mut v, key, bytes);
    v
}

/// The exact bytes of field `key` of an object written with [`put_json`], as a consumer
/// recovers them.
pub fn bytes_of(obj: &serde_json::Value, key: &str) -> Option<Vec<u8>> {
    if let Some(arr) = obj[format!("{key}_bytes")].as_array() {
        return arr.iter().map(|b| b.as_u64().map(|b| b as u8)).collect();
    }
    obj[key].as_str().map(|s| s.as_bytes().to_vec())
}

/// A kernel `comm` buffer up to its first NUL.
pub fn comm_bytes(comm: &[u8]) -> &[u8] {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    &comm[..end]
}

/// Characters of a title shown in a text table; JSON keeps the whole title (up to
/// [`crate::host::proc::TITLE_MAX`] bytes).
pub const TEXT_WIDTH: usize = 40;

/// Of a title cut to [`TEXT_WIDTH`], the characters kept from its start; the rest come from
/// its end, where services put what tells their processes apart (PostgreSQL's database, user
/// and state, a Java main class, a script's last argument).
const HEAD: usize = 18;

/// ` [title]`, escaped for a terminal and cut in the middle to [`TEXT_WIDTH`] characters.
pub fn bracket(title: &[u8]) -> String {
    let t = text(title);
    let n = t.chars().count();
    if n <= TEXT_WIDTH {
        return format!(" [{t}]");
    }
    let head: String = t.chars().take(HEAD).collect();
    let tail: String = t.chars().skip(n - (TEXT_WIDTH - HEAD - 1)).collect();
    format!(" [{head}…{tail}]")
}

/// [`bracket`] for the title of a process named `comm`, without the name the title repeats
/// (`postgres: 15/main: walwriter` beside `postgres` shows `15/main: walwriter`).
pub fn bracket_beside(comm: &[u8], title: &[u8]) -> String {
    let rest = title
        .strip_prefix(comm)
        .and_then(|r| r.strip_prefix(b": "))
        .filter(|r| !r.is_empty())
        .unwrap_or(title);
    bracket(rest)
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

    /// Issue #33 (7): `postgres [postgres: 15/main: postgres …]` hid database, user and
    /// state.
    #[test]
    fn titles_keep_their_informative_tail() {
        assert_eq!(
            bracket_beside(
                b"postgres",
                b"postgres: 15/main: bench bench [local] COMMIT"
            ),
            " [15/main: bench bench [local] COMMIT]"
        );
        assert_eq!(
            bracket_beside(
                b"postgres",
                b"postgres: 15/main: orders_app orders_ro 10.1.2.3(51234) idle in transaction"
            ),
            " [15/main: orders_ap…) idle in transaction]"
        );
        assert_eq!(
            bracket_beside(b"nginx", b"nginx: worker process"),
            " [worker process]"
        );
        assert_eq!(bracket_beside(b"sleep", b"sleep 10"), " [sleep 10]");
        let cut = bracket(b"java -Xmx8g -cp /opt/app/lib/* com.example.orders.Main");
        assert_eq!(cut, " [java -Xmx8g -cp /o…m.example.orders.Main]");
        assert_eq!(cut.chars().count(), TEXT_WIDTH + 3);
    }

    #[test]
    fn escapes_invalid_utf8() {
        assert_eq!(text(b"x\xff\xfey"), "x\\xff\\xfey");
    }

    #[test]
    fn json_keeps_valid_utf8_exact() {
        let mut v = serde_json::json!({});
        put_json(&mut v, "comm", b"\x1b[31mred\\n");
        assert_eq!(v.to_string(), r#"{"comm":"\u001b[31mred\\n"}"#);
        assert!(v.get("comm_bytes").is_none());
    }

    #[test]
    fn json_invalid_utf8_is_lossless_and_unambiguous() {
        let mut a = serde_json::json!({});
        put_json(&mut a, "comm", b"x\xffy");
        assert_eq!(a["comm"], "x\u{fffd}y");
        assert_eq!(a["comm_bytes"], serde_json::json!([120, 255, 121]));
        // A name that really holds a backslash and "xff" is a different value.
        let mut b = serde_json::json!({});
        put_json(&mut b, "comm", b"x\\xffy");
        assert_ne!(a, b);
        assert_eq!(bytes_of(&b, "comm").unwrap(), b"x\\xffy");
        assert_eq!(bytes_of(&a, "comm").unwrap(), b"x\xffy");
    }

    proptest::proptest! {
        /// Any bytes survive the JSON round trip exactly.
        #[test]
        fn json_round_trips_any_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let v = json_with("file", &bytes, serde_json::json!({"fd": 3}));
            let back: serde_json::Value = serde_json::from_str(&v.to_string()).unwrap();
            proptest::prop_assert_eq!(bytes_of(&back, "file").unwrap(), bytes);
            proptest::prop_assert_eq!(&back["fd"], &serde_json::json!(3));
        }
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_bytes(b"bash\0\0\0junk"), b"bash");
        assert_eq!(comm_bytes(b"0123456789abcdef"), b"0123456789abcdef");
    }

    #[test]
    fn markdown_makes_markup_literal() {
        assert_eq!(
            markdown("<img src=x onerror=alert(1)>"),
            "&lt;img src=x onerror=alert(1)&gt;"
        );
        assert_eq!(
            markdown("a|b `c` *d* _e_ [f](g) ~h~ \\ & i"),
            "a\\|b \\`c\\` \\*d\\* \\_e\\_ \\[f\\](g) \\~h\\~ \\\\ &amp; i"
        );
        assert_eq!(markdown("line\nbreak"), "line break");
        assert_eq!(
            markdown("postgres: walwriter 4.2s (9 %)"),
            "postgres: walwriter 4.2s (9 %)"
        );
    }

    #[test]
    fn markdown_code_is_never_closed_by_its_content() {
        assert_eq!(
            markdown_code("tracekit fsync-lat --pid 7"),
            "`tracekit fsync-lat --pid 7`"
        );
        assert_eq!(markdown_code("a`b``c"), "```a`b``c```");
        assert_eq!(markdown_code("`x"), "`` `x ``");
    }
}
